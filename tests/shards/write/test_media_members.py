"""Videos and recordings travel into the shards and back out of the loader byte-identical.

The bugs named: a sample written without its video (the loader hands the model a caption and a
video's cost), a video read whole into memory by the writer (a 500 MB clip), a member streamed
short or padded wrong (the next member's header shifted), a file changed after prep written
with its old costs or changed while it was copied, a member the document does not name
accepted by the reader, the nightly copy of a kept group losing its media. The references:
the source files' bytes, webdataset's own reading of the shards, and ``equishard verify``.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pytest
import soundfile
import webdataset as wds

from shards.read.dataset import GroupDataset, RankInfo
from shards.read.reader import ShardError, group_samples
from shards.read.verify import verify_generation
from shards.store.publish import read_current
from shards.write.writer import WriteConfig, write_generation
from tests.dataprep.helpers import run, write_jsonl

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
import make_media  # noqa: E402


def _video(path: Path, frames: int) -> Path:
    spec = make_media.VideoSpec(
        name=path.name,
        codec="libx264",
        pix_fmt="yuv420p",
        width=96,
        height=64,
        fps="8/1",
        frames=frames,
    )
    make_media.encode_video(spec, path)
    return path


def _conv(q: str) -> list[dict]:
    return [{"from": "human", "value": q}, {"from": "gpt", "value": "ok"}]


@pytest.fixture
def media_gen(tmp_path, tokenizer_path):
    """A generation of videos, recordings (a file and embedded FLAC bytes) and text."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        _video(data / f"v{i}.mp4", 10 + 9 * i)
    soundfile.write(data / "a.wav", np.zeros(40000, np.float32), 16000)
    flac = io.BytesIO()
    soundfile.write(flac, np.zeros(8000, np.float32), 8000, format="FLAC")
    import base64  # noqa: F401  (records hold bytes as lists here: JSON has no bytes)

    records = [
        {"id": "v0", "video": "v0.mp4", "conversations": _conv("<video> what?")},
        {
            "id": "v1",
            "video": "v1.mp4",
            "audio": "a.wav",
            "conversations": _conv("<video><audio> both"),
        },
        {"id": "v2", "videos": ["v2.mp4", "v0.mp4"], "conversations": _conv("<video><video> two")},
        {"id": "a", "audio": "a.wav", "conversations": _conv("<audio> say")},
        {"id": "t", "conversations": _conv("text only")},
    ]
    jsonl = write_jsonl(data / "d.jsonl", records)
    run(
        tmp_path,
        [jsonl],
        tokenizer_path,
        vision_policy="qwen2vl",
        video_rule="qwen2vl",
        audio_rule="qwen2audio",
    )
    return tmp_path, data


def test_a_table_with_audio_is_balanced_in_its_audio_phase(media_gen):
    """The recordings are measured, and the plan carries each group's audio load: the sum of
    its samples' audio positions (1,500 a Qwen2-Audio recording)."""
    tmp_path, _ = media_gen
    from dataprep import read_cost_table

    cost = read_cost_table(tmp_path / "out" / "cost.parquet")
    assert sorted(cost.column("sample_id").to_pylist()) == ["a", "t", "v0", "v1", "v2"]
    _write(tmp_path, tmp_path / "out" / "cost.parquet")
    plan = pa.parquet.read_table(tmp_path / "plan" / "plan.parquet").to_pylist()
    ids, tokens = (cost.column(c).to_pylist() for c in ("sample_id", "audio_tokens"))
    audio = dict(zip(ids, tokens, strict=True))
    assert audio["a"] == audio["v1"] == 1500 and audio["t"] == 0
    for row in plan:
        assert row["group_audio_tokens"] == sum(
            audio[r["sample_id"]] for r in plan if r["group_id"] == row["group_id"]
        )


def _write(tmp_path: Path, cost: Path, dp: int = 2) -> Path:
    from balancing.plan import BalanceConfig, build_plan, write_plan
    from dataprep import read_cost_table

    write_plan(
        build_plan(read_cost_table(cost), BalanceConfig(dp=dp, nodes=1, seed=0)), tmp_path / "plan"
    )
    gen = tmp_path / "gen"
    write_generation(
        WriteConfig(plan_dir=str(tmp_path / "plan"), cost_table=str(cost), out=str(gen))
    )
    return gen


def test_videos_and_recordings_come_out_of_the_loader_byte_identical(media_gen):
    tmp_path, data = media_gen
    gen = _write(tmp_path, tmp_path / "out" / "cost.parquet")
    got = {}
    for rank in range(2):
        for batch in GroupDataset(gen, RankInfo(rank=rank, world_size=2), shuffle=False):
            for s in batch["samples"]:
                got[s.meta["sample_id"]] = s
    assert sorted(got) == ["a", "t", "v0", "v1", "v2"]
    assert got["a"].audios == [(data / "a.wav").read_bytes()] and got["a"].videos == []
    assert got["v1"].audios == [(data / "a.wav").read_bytes()]
    assert got["v1"].videos == [(data / "v1.mp4").read_bytes()]
    assert got["a"].meta["cost"]["num_audios"] == 1
    loads = json.loads((gen / read_current(gen) / "manifest.json").read_text())["loads"]
    assert loads["max_sample_audio_tokens"] == 1500  # one Qwen2-Audio window
    assert loads["max_group_audio_tokens"] in (1500, 3000)  # the two recordings, apart or not
    assert got["v0"].videos == [(data / "v0.mp4").read_bytes()]
    assert got["v2"].videos == [(data / "v2.mp4").read_bytes(), (data / "v0.mp4").read_bytes()]
    assert got["v2"].meta["videos"] == ["video0.mp4", "video1.mp4"]
    assert got["v2"].meta["media"]["video0.mp4"]["frames"] == 28
    assert got["v2"].meta["cost"]["num_videos"] == 2
    assert got["t"].videos == [] and "videos" not in got["t"].meta
    assert verify_generation(str(gen)).ok
    # webdataset reads the same members: the video is its own member of the sample
    shards = sorted(str(p) for p in gen.rglob("shard-*.tar"))
    members = {}
    for sample in wds.WebDataset(shards, shardshuffle=False):
        members[sample["__key__"].rsplit("_", 1)[-1]] = sample
    assert members["v0"]["video0.mp4"] == (data / "v0.mp4").read_bytes()


def test_a_video_changed_after_prep_is_not_written_with_its_old_cost(media_gen):
    tmp_path, data = media_gen
    _video(data / "v1.mp4", 5)  # not in the table (refused: audio); v0 is
    os.replace(_video(data / "new.mp4", 44), data / "v0.mp4")
    with pytest.raises(Exception, match="changed since prep"):
        _write(tmp_path, tmp_path / "out" / "cost.parquet")


def test_a_member_the_document_does_not_name_is_refused(media_gen):
    tmp_path, _ = media_gen
    gen = _write(tmp_path, tmp_path / "out" / "cost.parquet", dp=1)
    shard = next(gen.rglob("shard-*.tar"))
    with tarfile.open(shard) as tf:
        names = [m.name for m in tf.getmembers()]
        members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    assert any(n.endswith(".video0.mp4") for n in names)
    # rename one video member: the document names video0.mp4, the tar holds video9.mp4
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, b in members:
            info = tarfile.TarInfo(name.replace(".video0.mp4", ".video9.mp4"))
            info.size = len(b)
            tf.addfile(info, io.BytesIO(b))
    with pytest.raises(ShardError, match=r"incomplete|unaccepted"):
        group_samples(
            buf.getvalue(), "x.tar", "x.tar", 0, len([n for n in names if n.endswith(".json")])
        )


class _Spy(io.BytesIO):
    """A file that records the size of every read."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.sizes: list[int] = []

    def read(self, n=-1):
        self.sizes.append(n)
        return super().read(n)


@pytest.mark.parametrize("size", [0, 1, 511, 512, 4096 * 3, 4096 * 3 + 7])
def test_a_member_is_streamed_a_chunk_at_a_time(monkeypatch, size):
    """At, below and above the chunk and tar block sizes: the bytes and padding are what
    tarfile writes, and no read asks for more than a chunk (a 500 MB video is never whole)."""
    from shards.format import tar_members

    monkeypatch.setattr(tar_members, "STREAM_CHUNK", 4096)
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    ours, theirs = io.BytesIO(), io.BytesIO()
    spy = _Spy(payload)
    with tarfile.open(fileobj=ours, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tar_members.add_member_stream(tf, "k.video0.mp4", spy, size)
        tar_members.add_member(tf, "k.json", b"{}")
    with tarfile.open(fileobj=theirs, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, b in (("k.video0.mp4", payload), ("k.json", b"{}")):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(b), 0o644
            tf.addfile(info, io.BytesIO(b))
    assert ours.getvalue() == theirs.getvalue()
    assert all(0 < n <= 4096 for n in spy.sizes)


def test_a_file_shorter_than_its_size_stops_the_member():
    from shards.format import tar_members

    with tarfile.open(fileobj=io.BytesIO(), mode="w") as tf, pytest.raises(OSError, match="ended"):
        tar_members.add_member_stream(tf, "k.video0.mp4", io.BytesIO(b"abc"), 10)


def test_peer_readers_load_a_generation_with_videos(media_gen, tmp_path_factory):
    """HF datasets' WebDataset builder (videos and recordings as bytes, not as images it
    cannot open), wids and Megatron-Energon's loader (through equishard's cooker) read every
    video and audio member."""
    import datasets
    import wids
    from megatron.energon import (
        DefaultTaskEncoder,
        WorkerConfig,
        get_loader,
        get_val_dataset,
    )

    from equishard.cli import main
    from shards import open_generation
    from shards.read.hf_datasets import hf_webdataset_kwargs
    from shards.store.publish import read_current
    from shards.write.energon import equishard_cooker

    tmp_path, data = media_gen
    _write(tmp_path, tmp_path / "out" / "cost.parquet")
    root = tmp_path_factory.mktemp("energon")
    args = ["write", str(tmp_path / "plan"), "--cost-table", str(tmp_path / "out" / "cost.parquet")]
    assert main([*args, "--out", str(root), "--energon"]) == 0
    gen = root / read_current(root)
    want = {
        "v0": ([data / "v0.mp4"], []),
        "v1": ([data / "v1.mp4"], [data / "a.wav"]),
        "v2": ([data / "v2.mp4", data / "v0.mp4"], []),
        "a": ([], [data / "a.wav"]),
        "t": ([], []),
    }
    want = {k: tuple([p.read_bytes() for p in m] for m in v) for k, v in want.items()}

    def members(doc, read):
        return tuple([read(n) for n in doc.get(kind, [])] for kind in ("videos", "audios"))

    ds = datasets.load_dataset("webdataset", **hf_webdataset_kwargs(gen), split="train")
    got = {r["json"]["sample_id"]: members(r["json"], r.__getitem__) for r in ds}
    assert got == want

    m = open_generation(gen)
    wds_ds = wids.ShardListDataset(str(m.path / "wids-index.json"), cache_dir=str(tmp_path / "w"))
    got = {}
    for i in range(len(wds_ds)):
        s = wds_ds[i]
        got[s[".json"]["sample_id"]] = members(
            s[".json"],
            lambda n, s=s: s["." + n].read() if hasattr(s["." + n], "read") else s["." + n],
        )
    assert got == want

    class Encoder(DefaultTaskEncoder):
        cookers = (equishard_cooker(),)
        decoder = None  # bytes: decode with the model's own video processor

        def encode_sample(self, sample):
            return sample

        def batch(self, samples):
            return samples

    loader = get_loader(
        get_val_dataset(
            gen,
            split_part="train",
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            batch_size=1,
            task_encoder=Encoder(),
        )
    )
    got = {s.record["sample_id"]: (s.videos, s.audios) for batch in loader for s in batch}
    assert got == want


def test_a_night_adds_videos_measured_by_the_parents_rule_and_keeps_the_old_ones(media_gen):
    """rebalance preps the night's new samples with the parent's video and audio rules (without
    them they would be refused, or counted as text), balances the audio phase again, and its
    kept groups keep their video and audio members."""
    from shards.nightly.rebalance import RebalanceConfig, run_rebalance
    from shards.store.publish import read_current

    tmp_path, data = media_gen
    gen = _write(tmp_path, tmp_path / "out" / "cost.parquet").parent  # the root
    _video(data / "n.mp4", 50)
    night = write_jsonl(
        data / "night.jsonl",
        [
            {"id": "n", "video": "n.mp4", "conversations": _conv("<video> new")},
            {"id": "n2", "audio": "a.wav", "conversations": _conv("<audio> again")},
        ],
    )
    root = tmp_path / "gen"
    run_rebalance(RebalanceConfig(current=str(root), new=(str(night),), image_root=str(data)))
    got = {}
    for rank in range(2):
        for batch in GroupDataset(root, RankInfo(rank=rank, world_size=2), shuffle=False):
            for s in batch["samples"]:
                got[s.meta["sample_id"]] = s
    assert sorted(got) == ["a", "n", "n2", "t", "v0", "v1", "v2"]
    assert got["n"].videos == [(data / "n.mp4").read_bytes()]
    assert got["n2"].audios == got["a"].audios == [(data / "a.wav").read_bytes()]
    assert got["n2"].meta["cost"]["audio_tokens"] == 1500  # the parent's Qwen2-Audio rule
    assert got["n"].meta["cost"]["num_videos"] == 1 and got["n"].meta["cost"]["video_tokens"] > 0
    assert got["v2"].videos == [(data / "v2.mp4").read_bytes(), (data / "v0.mp4").read_bytes()]
    assert verify_generation(str(root / read_current(root))).ok
    assert gen == tmp_path


def test_a_webdataset_tars_video_and_audio_members_are_measured_and_written(
    tmp_path, tokenizer_path
):
    """A tar input's KEY.mp4 and KEY.0.flac members: refused without their rule (by member
    name), measured with it from the tar in place, written and read back byte-identical."""
    from tests.dataprep.helpers import add_member

    clip = _video(tmp_path / "c.mp4", 20).read_bytes()
    flac = io.BytesIO()
    soundfile.write(flac, np.zeros(24000, np.float32), 16000, format="FLAC")
    tar = tmp_path / "in.tar"
    with tarfile.open(tar, "w") as tf:
        add_member(
            tf,
            "k1.json",
            json.dumps({"conversations": _conv("<video> what?")}).encode(),
        )
        add_member(tf, "k1.mp4", clip)
        add_member(tf, "k2.json", b'{"text": "<audio> said"}')
        add_member(tf, "k2.0.flac", flac.getvalue())
    _, rows, errors = run(tmp_path / "bare", [tar], tokenizer_path)
    assert {e["reason"] for e in errors} == {"unsupported_modality"} and not rows
    assert any("k1.mp4" in e["detail"] for e in errors)
    kw = {"vision_policy": "qwen2vl", "video_rule": "qwen2vl", "audio_rule": "qwen2audio"}
    _, rows, errors = run(tmp_path, [tar], tokenizer_path, **kw)
    assert not errors
    by_id = {r["sample_id"]: r for r in rows}
    assert by_id["k1"]["num_videos"] == 1 and by_id["k2"]["audio_seq_lens"] == [1500]
    # the audio phase is not balanced yet: write the video sample alone
    from dataprep import read_cost_table

    cost = read_cost_table(tmp_path / "out" / "cost.parquet")
    import pyarrow.parquet as pq

    video_only = cost.filter(pa.compute.equal(cost["num_audios"], 0)).drop_columns(
        ["num_audios", "audio_tokens", "audio_seq_lens"]
    )
    meta = json.loads(cost.schema.metadata[b"equishard.cost_table"])
    meta["phases"] = ["vision", "video", "llm"]
    del meta["audio_rule"]
    video_only = video_only.replace_schema_metadata({b"equishard.cost_table": json.dumps(meta)})
    pq.write_table(video_only, tmp_path / "video.parquet")
    gen = _write(tmp_path, tmp_path / "video.parquet", dp=1)
    got = [
        s
        for b in GroupDataset(gen, RankInfo(rank=0, world_size=1), shuffle=False)
        for s in b["samples"]
    ]
    assert [s.meta["sample_id"] for s in got] == ["k1"]
    assert got[0].videos == [clip] and got[0].meta["videos"] == ["video0.mp4"]


def test_decoded_media_equal_the_decoders_on_the_source_files(media_gen):
    """decode_video gives the frames PyAV decodes from the source file (all, or the sampled
    indices in their order); decode_audio what libsndfile reads from it."""
    import av

    from shards.read.media import decode_audio, decode_video

    _, data = media_gen
    clip = (data / "v1.mp4").read_bytes()
    with av.open(str(data / "v1.mp4")) as c:
        want = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    assert np.array_equal(decode_video(clip), want)
    assert np.array_equal(decode_video(clip, [5, 0, 18]), want[[5, 0, 18]])
    with pytest.raises(IndexError):
        decode_video(clip, [len(want)])
    wave, rate = decode_audio((data / "a.wav").read_bytes())
    ref, ref_rate = soundfile.read(data / "a.wav", dtype="float32", always_2d=True)
    assert rate == ref_rate == 16000 and np.array_equal(wave, ref)


def test_a_plan_without_the_tables_audio_phase_is_refused(media_gen):
    """A plan balanced without the audio phase (or its audio loads edited) is another table's
    plan: write refuses it naming the plan and the phase, before anything is staged."""
    import pyarrow.parquet as pq

    from shards.errors import WriteError

    tmp_path, _ = media_gen
    cost = tmp_path / "out" / "cost.parquet"
    _write(tmp_path, cost)
    path = tmp_path / "plan" / "plan.parquet"
    plan = pq.read_table(path)
    for broken, match in (
        (plan.drop_columns(["group_audio_tokens", "group_audio_cost"]), "without the audio phase"),
        (
            plan.set_column(
                plan.schema.get_field_index("group_audio_tokens"),
                "group_audio_tokens",
                pyarrow.compute.add(plan.column("group_audio_tokens"), 1500),
            ),
            "audio tokens",
        ),
    ):
        pq.write_table(broken, path)
        out = tmp_path / f"gen-{match.split()[0]}"
        with pytest.raises(WriteError, match=match):
            write_generation(
                WriteConfig(plan_dir=str(tmp_path / "plan"), cost_table=str(cost), out=str(out))
            )
        assert not out.exists() or not any(out.rglob("*.tar"))
