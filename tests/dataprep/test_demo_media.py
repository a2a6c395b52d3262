"""``equishard demo --media``: the clips and recordings ``make shards`` runs every phase on.

Bugs named: a demo whose media prep cannot read (the pipeline would refuse them: the counts come
from the real probes here), samples that point at files not written, an images-only demo that
writes media or differs between runs, a seed that does not give the same files, a media sample
that also keeps its images (a video sample is measured as images too), and the whole path (prep
with the rules, balance every phase, write) losing a recording or a clip: both come back from
the loader byte-identical.
"""

from __future__ import annotations

import json
from pathlib import Path

from dataprep.audio_header import probe_audio_path
from dataprep.demo import make_demo
from dataprep.video_header import probe_video_path
from tests.dataprep.helpers import tree_digest


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "demo.jsonl").read_text().splitlines()]


def test_media_samples_point_at_real_files_prep_can_probe(tmp_path):
    s = make_demo(tmp_path / "d", samples=300, seed=3, media=True)
    recs = _records(tmp_path / "d")
    videos = [r for r in recs if "video" in r]
    audios = [r for r in recs if "audio" in r]
    assert (len(videos), len(audios)) == (s.videos, s.audios) and videos and audios
    assert s.text_only + s.single_image + s.multi_image + s.videos + s.audios == 300
    for r in videos:
        assert "image" not in r and r["conversations"][0]["value"].startswith("<video>\n")
        h = probe_video_path(tmp_path / "d" / r["video"])
        assert h.frames >= 2 and h.width >= 128
    for r in audios:
        assert "image" not in r and r["conversations"][0]["value"].startswith("<audio>\n")
        h = probe_audio_path(tmp_path / "d" / r["audio"])
        assert 1.0 <= h.duration <= 35.0 and h.channels in (1, 2)


def test_the_same_seed_gives_the_same_files_and_no_media_changes_nothing(tmp_path):
    a = make_demo(tmp_path / "a", samples=120, seed=5, media=True)
    b = make_demo(tmp_path / "b", samples=120, seed=5, media=True)
    assert a.videos == b.videos and tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    plain = make_demo(tmp_path / "p", samples=120, seed=5)
    make_demo(tmp_path / "q", samples=120, seed=5)
    assert plain.videos == plain.audios == 0 and not (tmp_path / "p" / "media").exists()
    assert tree_digest(tmp_path / "p") == tree_digest(tmp_path / "q")


def test_the_media_demo_runs_every_phase_and_loads_back_byte_identical(tmp_path):
    """The path ``make shards`` takes, small: prep with the Qwen2-VL policy and video rule and
    the Qwen2-Audio rule, balance (every phase), write, load."""
    from balancing.plan import BalanceConfig, build_plan, write_plan
    from dataprep import PrepConfig, read_cost_table, run_prep
    from shards.read.dataset import GroupDataset, RankInfo
    from shards.write.writer import WriteConfig, write_generation

    raw = tmp_path / "raw"
    make_demo(raw, samples=160, seed=1, media=True)
    cost = tmp_path / "cost.parquet"
    res = run_prep(
        PrepConfig(
            inputs=(str(raw / "demo.jsonl"),),
            output=str(cost),
            tokenizer=str(raw / "tokenizer.json"),
            image_root=str(raw),
            vision_policy="qwen2vl",
            video_rule="qwen2vl",
            audio_rule="qwen2audio",
        )
    )
    assert res.n_rejected == 0 and res.n_written == 160
    table = read_cost_table(cost)
    recs = {r["id"]: r for r in _records(raw)}
    got_audio = dict(
        zip(
            table.column("sample_id").to_pylist(),
            table.column("num_audios").to_pylist(),
            strict=True,
        )
    )
    assert {k for k, n in got_audio.items() if n} == {k for k, r in recs.items() if "audio" in r}
    result = build_plan(table, BalanceConfig(dp=2, target_batch=8))
    assert "dist_ratio_audio" in result.report["metrics"]["balanced"]
    assert result.report["parameters"]["steps_refined"]
    write_plan(result, tmp_path / "plan")
    gen = tmp_path / "gen"
    write_generation(
        WriteConfig(plan_dir=str(tmp_path / "plan"), cost_table=str(cost), out=str(gen))
    )
    seen = {}
    for rank in range(2):
        for batch in GroupDataset(gen, RankInfo(rank=rank, world_size=2), shuffle=False):
            for s in batch["samples"]:
                seen[s.meta["sample_id"]] = s
    assert len(seen) == 160
    for sid, r in recs.items():
        if "video" in r:
            assert seen[sid].videos == [(raw / r["video"]).read_bytes()]
        if "audio" in r:
            assert seen[sid].audios == [(raw / r["audio"]).read_bytes()]
