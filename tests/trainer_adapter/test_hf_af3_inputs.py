"""HFPacker for Audio Flamingo 3 (an audio-only family: each recording in padded 30-s windows)
against its own processor, and on a real generation prepped with its chat template.

* Rows equal ``AudioFlamingo3Processor(text=apply_chat_template(...), audio=...)``: the ids
  (each ``<sound>`` repeated as the processor repeats it, from the frames of all a recording's
  windows), every window's features, whole, and its frame mask, for recordings of one window,
  of two (one filling its first window exactly, one a hop past it), past the processor's
  ``max_audio_len`` (cut there), of other rates, stereo. The prep rule's counts (windows,
  tokens) equal the processor's for the same recordings. The processor takes one recording a
  text; a sample of two (each one's tokens where its mark stands, as the model reads its
  windows in order) is covered by the generation's parity.
* On a generation (prep with the template and ``--audio-rule audioflamingo3``), every row is as
  long as prep counted, and on 2 gloo ranks the loss and every gradient with the audio tower
  and the LLM balanced equal those without balancing and those of one process.
* The processor's ``max_audio_len`` and window are checked against the rule, at, below and
  above; a rule of one window is refused for this family, and this family's rule for others.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from equishard.cli import main
from tests.dist_helper import run_ranks
from tests.trainer_adapter.test_hf_omni_inputs import (
    _files,
    _flat_grads,
    _loss,
    _messages,
    _packed,
    _Sample,
    _shares,
    _turns,
)

tf = pytest.importorskip("transformers")

TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "chat_templates"
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<sound>"]
MEL = 16
RULE = "audioflamingo3:max_windows=2"  # the processor's max_audio_len=60: two windows


def model_dir(root: Path) -> Path:
    from importlib import resources

    from tokenizers import AddedToken, Tokenizer

    with resources.as_file(resources.files("dataprep") / "assets" / "demo_tokenizer.json") as p:
        tok = Tokenizer.from_file(str(p))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    config = {
        "chat_template": (TEMPLATE / "audioflamingo3.jinja").read_text(),
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
    }
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def processor(mdir: Path, max_audio_len: int = 60, **fe):
    tok = tf.AutoTokenizer.from_pretrained(str(mdir))
    extractor = tf.WhisperFeatureExtractor(**{"feature_size": MEL, "chunk_length": 30, **fe})
    template = json.loads((mdir / "tokenizer_config.json").read_text())["chat_template"]
    return tf.AudioFlamingo3Processor(
        feature_extractor=extractor, tokenizer=tok, chat_template=template,
        max_audio_len=max_audio_len,
    )  # fmt: skip


def model(tok, seed: int = 0):
    cfg = tf.AudioFlamingo3Config(
        audio_config=dict(d_model=16, encoder_layers=1, encoder_attention_heads=2,
                          encoder_ffn_dim=32, num_mel_bins=MEL, max_source_positions=1500),
        text_config=dict(model_type="qwen2", vocab_size=len(tok), hidden_size=32,
                         intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=8192),
        audio_token_id=tok.convert_tokens_to_ids("<sound>"),
    )  # fmt: skip
    torch.manual_seed(seed)
    return tf.AudioFlamingo3ForConditionalGeneration(cfg).double()


def _tone(path: Path, samples: int, rate: int, channels: int = 1) -> str:
    import soundfile

    t = np.arange(samples) / rate
    wave = (np.sin(2 * np.pi * 220 * t) / 3)[:, None].repeat(channels, axis=1)
    soundfile.write(path, wave.astype(np.float32), rate, subtype="PCM_16")
    return str(path)


def dataset(root: Path) -> tuple[Path, list[dict]]:
    """Real recordings (1-35 s, 8-48 kHz, some stereo) and long ones: 45 s stereo at 22.05 kHz
    (two windows), 70 s at 16 kHz (past the two windows: cut), exactly one window and one hop
    past it; one, none, two a sample."""
    from dataprep import make_demo
    from dataprep.demo_media import write_audios

    demo = root / "demo"
    make_demo(demo, samples=2, seed=3, images=1)
    recs = write_audios(demo, np.random.default_rng(5), 4)
    media = demo / "media"
    for name, samples, rate, ch in (("long.flac", 45 * 22050, 22050, 2),
                                    ("cut.wav", 70 * 16000, 16000, 1),
                                    ("one.wav", 480000, 16000, 1),
                                    ("hop.wav", 480000 + 160, 16000, 1)):  # fmt: skip
        _tone(media / name, samples, rate, ch)
        recs.append(f"media/{name}")
    rng = np.random.default_rng(0)
    words = "the a tone of some long low high sound bird rain car voice".split()
    # one recording a sample (the processor takes one a text), none, and two last
    kinds = [recs[4:5], recs[1:2], [], recs[5:6], recs[6:7], recs[7:8], recs[2:4]]
    records = []
    for i in range(14):
        auds = kinds[i % len(kinds)]
        say = lambda n: " ".join(rng.choice(words, n))  # noqa: E731
        rec = {"id": f"a{i}", "conversations": [
            {"from": "human", "value": "<audio>\n" * len(auds) + say(5) + "?"},
            {"from": "gpt", "value": say(int(rng.integers(3, 40))) + "."},
        ]}  # fmt: skip
        if auds:
            rec["audio"] = auds if len(auds) > 1 else auds[0]
        records.append(rec)
    (demo / "audio.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return demo, records


def test_packer_and_prep_equal_its_processor(tmp_path):
    from transformers.audio_utils import load_audio

    from dataprep.audio_header import probe_audio_path
    from dataprep.media_rules import parse_audio_rule
    from trainer_adapter.hf.inputs import HFPacker

    demo, records = dataset(tmp_path)
    mdir = model_dir(tmp_path / "model")
    proc = processor(mdir)
    packer = HFPacker(family="audioflamingo3", processor=proc, template=str(mdir),
                      audio_rule=RULE)  # fmt: skip
    rule = parse_audio_rule(RULE)
    sound = proc.tokenizer.convert_tokens_to_ids("<sound>")
    windows_seen = []
    for rec in records[:6]:  # AudioFlamingo3Processor takes one recording a text
        turns = _turns(rec)
        auds = _files(rec, "audio")
        got = packer.sample(turns, [], [(demo / f).read_bytes() for f in auds])
        text = proc.apply_chat_template(_messages(turns), tokenize=False)
        ref = proc(text=[text], audio=[load_audio(str(demo / f), sampling_rate=16000)
                                       for f in auds] or None, return_tensors="pt")  # fmt: skip
        assert torch.equal(got["input_ids"], ref["input_ids"][0]), rec["id"]
        frames = got.get("audio_frames", [])
        assert len(frames) == len(ref.get("input_features", ()))  # every window
        for k, f in enumerate(frames):  # the whole window, padding's frames too
            np.testing.assert_array_equal(f.T, ref["input_features"][k].numpy())
            assert got["audio_lens"][k] == int(ref["input_features_mask"][k].sum())
        # prep's rule: each recording's windows and tokens, the processor's
        costs = [rule.cost(probe_audio_path(demo / f)) for f in auds]
        assert sum(len(c.seq_lens) for c in costs) == len(frames)
        assert sum(c.llm_tokens for c in costs) == int((ref["input_ids"] == sound).sum())
        windows_seen += [len(c.seq_lens) for c in costs]
        trained = proc.tokenizer.decode(got["input_ids"][got["labels"] != -100])
        assert trained == turns[1][1]
    assert sorted(set(windows_seen)) == [1, 2]  # one window and two (45 s, 70 s cut at 60 s)
    row = packer([_Sample(rec, demo) for rec in records[4:6]])  # 30 s; 30 s and a hop
    assert row["input_features"].shape == (3, MEL, 3000)
    assert row["input_features_mask"].sum(-1).tolist() == [3000, 3000, 1]
    assert "feature_attention_mask" not in row


@functools.cache
def _generation(root: str) -> tuple[str, str]:
    root = Path(root)
    demo, _ = dataset(root)
    mdir = model_dir(root / "model")
    cost, plan, gen = root / "cost.parquet", root / "plan", root / "shards"
    one_cycle = (demo / "audio.jsonl").read_text().splitlines()[:7]  # every kind once
    (demo / "gen.jsonl").write_text("\n".join(one_cycle) + "\n")
    args = ["prep", str(demo / "gen.jsonl"), "--image-root", str(demo), "--no-progress"]
    args += ["--tokenizer", str(mdir / "tokenizer.json"), "--template", str(mdir)]
    args += ["--audio-rule", RULE, "-o", str(cost)]
    assert main(args) == 0
    assert main(["balance", str(cost), "--dp", "2", "--target-batch", "3", "-o", str(plan)]) == 0
    assert main(["write", str(plan), "--cost-table", str(cost), "--out", str(gen)]) == 0
    return str(gen), str(mdir)


def rank_rows(rank, world, gen, mdir):
    """This rank's share packed from the generation, one step balanced and one not (a fresh
    model each, in one process): each one's loss and gradient summed over the ranks."""
    import torch.distributed as dist

    from trainer_adapter.hf.balance import balance_model, global_targets
    from trainer_adapter.hf.inputs import HFPacker
    from trainer_adapter.redistribute import RedistributePolicy

    proc = processor(Path(mdir))
    packer = HFPacker.from_generation(gen, proc, family="audioflamingo3")
    row = _packed(packer, _shares(gen)[rank])
    out = {}
    for mode in ("balanced", "plain"):
        m = model(proc.tokenizer)
        balance_model(m, policy=RedistributePolicy(enabled=mode == "balanced"))
        loss = _loss(m, dict(row), global_targets(row["labels"]))
        loss.backward()
        dist.all_reduce(loss := loss.detach())
        flat = torch.from_numpy(_flat_grads(m))
        dist.all_reduce(flat)
        out[mode] = {
            "loss": float(loss),
            "grads": flat.numpy(),
            "windows": len(row.get("input_features_mask", ())),
            "moved": m.model.audio_tower.last_route.moved if mode == "balanced" else 0,
        }
    return out


# make test-slow (CI): the priciest of the audio families' end-to-end runs; make test runs
# Qwen2-Audio's and Qwen2.5-Omni's, and AF3's packer and processor checks here
@pytest.mark.slow
def test_generation_rows_are_prep_counts_and_balanced_equals_single_process(tmp_path):
    from trainer_adapter.hf.inputs import HFPacker

    gen, mdir = _generation(str(tmp_path))
    ranks = run_ranks(rank_rows, 2, gen, mdir, timeout=300)
    runs = {m: [r[m] for r in ranks] for m in ("balanced", "plain")}
    proc = processor(Path(mdir))
    m = model(proc.tokenizer)
    packer = HFPacker.from_generation(gen, proc, family="audioflamingo3")  # checks every sample
    shares = _shares(gen)
    assert len(shares[0]) + len(shares[1]) == 7
    row = _packed(packer, shares[0] + shares[1])
    loss = _loss(m, row, int((row["labels"][..., 1:] != -100).sum()))
    loss.backward()
    ref = _flat_grads(m)
    assert [r["windows"] for r in runs["plain"]] == [10, 0]  # 2 + 1 + 2 + 1 + 2 + 2
    for mode, ranks in runs.items():
        for r in ranks:
            assert r["loss"] == pytest.approx(loss.item(), rel=1e-6), mode
            np.testing.assert_allclose(r["grads"], ref, rtol=1e-5, atol=1e-9)
    assert runs["balanced"][0]["moved"] > 0  # windows went to rank 1


@pytest.mark.parametrize(
    "setting, value, named",
    [
        ("max_audio_len", 59, "max_audio_len 59 (processor) vs 60 (prep)"),
        ("max_audio_len", 61, "max_audio_len 61 (processor) vs 60 (prep)"),
        ("max_audio_len", 600, "max_audio_len 600 (processor) vs 60 (prep)"),
        ("chunk_length", 29, "chunk_length 29 (processor) vs 30 (prep)"),
        ("chunk_length", 31, "chunk_length 31 (processor) vs 30 (prep)"),
        ("max_audio_len", 60, None),
    ],
)
def test_the_processor_is_checked_against_the_rule(tmp_path, setting, value, named):
    from shards.read.prep_settings import SettingsMismatch
    from trainer_adapter.hf.inputs import HFPacker

    gen, mdir = _generation(str(tmp_path / "gen"))
    kw = {setting: value}
    proc = processor(Path(mdir), **kw)
    if named is None:
        assert HFPacker.from_generation(gen, proc, family="audioflamingo3").audio_rule
        return
    with pytest.raises(SettingsMismatch, match=named.replace("(", r"\(").replace(")", r"\)")):
        HFPacker.from_generation(gen, proc, family="audioflamingo3")


def test_a_rule_of_another_shape_is_refused(tmp_path):
    """One window a recording for Audio Flamingo 3, several for Qwen2-Audio: each refused at
    construction, naming the rule the family takes; equishard train refuses several windows."""
    from tests.trainer_adapter.test_hf_qwen2audio_inputs import model_dir as q2_dir
    from tests.trainer_adapter.test_hf_qwen2audio_inputs import processor as q2_processor
    from trainer_adapter.hf.inputs import HFPacker

    mdir = model_dir(tmp_path / "af3")
    with pytest.raises(ValueError, match=r"several padded windows.*audioflamingo3"):
        HFPacker(family="audioflamingo3", processor=processor(mdir), template=str(mdir),
                 audio_rule="qwen2audio")  # fmt: skip
    q2 = q2_dir(tmp_path / "q2")
    with pytest.raises(ValueError, match=r"one window or unpadded chunks"):
        HFPacker(family="qwen2_audio", processor=q2_processor(q2), template=str(q2),
                 audio_rule=RULE)  # fmt: skip
