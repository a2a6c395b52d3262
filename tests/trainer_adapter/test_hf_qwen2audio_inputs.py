"""HFPacker for Qwen2-Audio (an audio-only family: padded 30-s windows) against its own
processor, and on a real generation prepped with its own chat template.

* Rows equal ``Qwen2AudioProcessor(text=apply_chat_template(...), audio=...)``: the ids (each
  ``Audio k:`` label and each ``<|AUDIO|>`` repeated as the processor repeats it), every
  recording's whole window (the frames of the padding too, which the encoder's convolutions
  read beside the last frames) and its frame mask, for recordings shorter and longer than the
  window (cut at 30 s), of other rates, stereo, several a sample. Labels are the assistant's
  text.
* On a generation (prep with the template and ``--audio-rule qwen2audio``; a sample with an
  image is refused by its template, into the errors table), every row is as long as prep
  counted, and on 2 gloo ranks the loss and every gradient with the audio tower and the LLM
  balanced equal those without balancing and those of one process over all the rows.
* A sample with images is refused by the packer too; the processor's window is checked
  against the rule's."""

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
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|AUDIO|>", "<|audio_bos|>",
            "<|audio_eos|>"]  # fmt: skip
MEL = 16


def model_dir(root: Path) -> Path:
    from importlib import resources

    from tokenizers import AddedToken, Tokenizer

    with resources.as_file(resources.files("dataprep") / "assets" / "demo_tokenizer.json") as p:
        tok = Tokenizer.from_file(str(p))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    config = {
        "chat_template": (TEMPLATE / "qwen2_audio.jinja").read_text(),
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
    }
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def processor(mdir: Path, **fe):
    tok = tf.AutoTokenizer.from_pretrained(str(mdir))
    extractor = tf.WhisperFeatureExtractor(**{"feature_size": MEL, "chunk_length": 30, **fe})
    template = json.loads((mdir / "tokenizer_config.json").read_text())["chat_template"]
    return tf.Qwen2AudioProcessor(
        feature_extractor=extractor, tokenizer=tok, chat_template=template
    )


def model(tok, seed: int = 0):
    cfg = tf.Qwen2AudioConfig(
        audio_config=dict(d_model=16, encoder_layers=1, encoder_attention_heads=2,
                          encoder_ffn_dim=32, num_mel_bins=MEL, max_source_positions=1500),
        text_config=dict(model_type="qwen2", vocab_size=len(tok), hidden_size=32,
                         intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=8192),
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"),
    )  # fmt: skip
    torch.manual_seed(seed)
    return tf.Qwen2AudioForConditionalGeneration(cfg).double()


def dataset(root: Path) -> tuple[Path, list[dict]]:
    """Real recordings (1-35 s, 8-48 kHz, some stereo): one, two, none a sample; and one
    sample with an image, which Qwen2-Audio's template refuses, last."""
    from dataprep import make_demo
    from dataprep.demo_media import write_audios

    demo = root / "demo"
    make_demo(demo, samples=2, seed=3, images=1)
    recs = write_audios(demo, np.random.default_rng(5), 4)
    # and one past the 30-s window (cut there): 33 s of stereo at 22.05 kHz
    import soundfile

    t = np.arange(33 * 22050) / 22050
    tone = (np.sin(2 * np.pi * 220 * t) / 3)[:, None].repeat(2, axis=1).astype(np.float32)
    soundfile.write(demo / "media" / "long.flac", tone, 22050, subtype="PCM_16")
    recs.append("media/long.flac")
    rng = np.random.default_rng(0)
    words = "the a tone of some long low high sound bird rain car voice".split()
    kinds = [recs[4:5], recs[1:3], [], recs[3:4], recs[:1]]
    records = []
    for i in range(10):
        auds = kinds[i % len(kinds)]
        say = lambda n: " ".join(rng.choice(words, n))  # noqa: E731
        rec = {"id": f"a{i}", "conversations": [
            {"from": "human", "value": "<audio>\n" * len(auds) + say(5) + "?"},
            {"from": "gpt", "value": say(int(rng.integers(3, 40))) + "."},
        ]}  # fmt: skip
        if auds:
            rec["audio"] = auds if len(auds) > 1 else auds[0]
        records.append(rec)
    image = sorted(str(p.relative_to(demo)) for p in (demo / "images").iterdir())[0]
    pic = {
        "id": "img",
        "image": image,
        "conversations": [
            {"from": "human", "value": "<image>\nWhat is it?"},
            {"from": "gpt", "value": "A cat."},
        ],
    }
    lines = [json.dumps(r) for r in [*records, pic]]
    (demo / "audio.jsonl").write_text("\n".join(lines) + "\n")
    return demo, records


def test_packer_equals_its_processor(tmp_path):
    from transformers.audio_utils import load_audio

    from trainer_adapter.hf.inputs import HFPacker

    demo, records = dataset(tmp_path)
    mdir = model_dir(tmp_path / "model")
    proc = processor(mdir)
    packer = HFPacker(
        family="qwen2_audio", processor=proc, template=str(mdir), audio_rule="qwen2audio"
    )
    lens_seen = []
    for rec in records[:5]:
        turns = _turns(rec)
        auds = _files(rec, "audio")
        got = packer.sample(turns, [], [(demo / f).read_bytes() for f in auds])
        text = proc.apply_chat_template(_messages(turns), tokenize=False)
        ref = proc(
            text=[text],
            audio=[load_audio(str(demo / f), sampling_rate=16000) for f in auds] or None,
            return_tensors="pt",
        )
        assert torch.equal(got["input_ids"], ref["input_ids"][0]), rec["id"]
        assert torch.equal(got["positions"][0], torch.arange(len(got["input_ids"])))
        frames = got.get("audio_frames", [])
        assert len(frames) == len(auds)
        for k, f in enumerate(frames):  # the whole window, padding's frames too
            np.testing.assert_array_equal(f.T, ref["input_features"][k].numpy())
            assert got["audio_lens"][k] == int(ref["feature_attention_mask"][k].sum())
            lens_seen.append(got["audio_lens"][k])
        trained = proc.tokenizer.decode(got["input_ids"][got["labels"] != -100])
        assert trained == turns[1][1]
    assert max(lens_seen) == 3000 and min(lens_seen) < 3000  # cut at, and inside, the window
    # the window's own length, one hop below it and one sample past it (16 kHz: no resampling)
    import soundfile

    for samples, frames in ((480000, 3000), (480000 - 160, 2999), (480001, 3000)):
        wave = np.sin(np.arange(samples) / 7.0).astype(np.float32) / 3
        path = tmp_path / f"edge-{samples}.wav"
        soundfile.write(path, wave, 16000, subtype="FLOAT")
        turns = [("user", "<audio>\nAnd this?"), ("assistant", "A hum.")]
        got = packer.sample(turns, [], [path.read_bytes()])
        text = proc.apply_chat_template(_messages(turns), tokenize=False)
        ref = proc(text=[text], audio=[load_audio(str(path), sampling_rate=16000)],
                   return_tensors="pt")  # fmt: skip
        assert got["audio_lens"] == [frames] == ref["feature_attention_mask"].sum(-1).tolist()
        assert torch.equal(got["input_ids"], ref["input_ids"][0]), samples
        np.testing.assert_array_equal(got["audio_frames"][0].T, ref["input_features"][0].numpy())
    row = packer([_Sample(rec, demo) for rec in records[:2]])
    assert row["input_features"].shape == (3, MEL, 3000)
    assert row["feature_attention_mask"].sum(-1).tolist() == lens_seen[:3]
    with pytest.raises(ValueError, match=r"sample 'img' has 1 image\(s\).*take no images"):
        pic = _Sample(records[0], demo)
        pic.meta["sample_id"], pic.images, pic.audios = "img", [b"png"], []
        packer([pic])


@functools.cache
def _generation(root: str) -> tuple[str, str]:
    import pyarrow.parquet as pq

    root = Path(root)
    demo, _ = dataset(root)
    mdir = model_dir(root / "model")
    cost, plan, gen = root / "cost.parquet", root / "plan", root / "shards"
    args = ["prep", str(demo / "audio.jsonl"), "--image-root", str(demo), "--no-progress"]
    args += ["--tokenizer", str(mdir / "tokenizer.json"), "--template", str(mdir)]
    args += ["--audio-rule", "qwen2audio", "--max-error-rate", "0.1", "-o", str(cost)]
    assert main(args) == 0
    (error,) = pq.read_table(root / "cost.errors.parquet").to_pylist()
    assert error["sample_id"] == "img" and error["reason"] == "template_no_image_family", error
    assert main(["balance", str(cost), "--dp", "2", "--target-batch", "3", "-o", str(plan)]) == 0
    assert main(["write", str(plan), "--cost-table", str(cost), "--out", str(gen)]) == 0
    return str(gen), str(mdir)


def rank_rows(rank, world, gen, mdir, mode):
    import torch.distributed as dist

    from trainer_adapter.hf.balance import balance_model, global_targets
    from trainer_adapter.hf.inputs import HFPacker
    from trainer_adapter.redistribute import RedistributePolicy

    proc = processor(Path(mdir))
    m = model(proc.tokenizer)
    packer = HFPacker.from_generation(gen, proc, family="qwen2_audio")
    row = _packed(packer, _shares(gen)[rank])
    balance_model(m, policy=RedistributePolicy(enabled=mode == "balanced"))
    loss = _loss(m, row, global_targets(row["labels"]))
    loss.backward()
    dist.all_reduce(loss := loss.detach())
    flat = torch.from_numpy(_flat_grads(m))
    dist.all_reduce(flat)
    return {
        "loss": float(loss),
        "grads": flat.numpy(),
        "recordings": len(row.get("feature_attention_mask", ())),
        "moved": m.model.audio_tower.last_route.moved if mode == "balanced" else 0,
    }


def test_generation_rows_are_prep_counts_and_balanced_equals_single_process(tmp_path):
    from trainer_adapter.hf.inputs import HFPacker

    gen, mdir = _generation(str(tmp_path))
    runs = {m: run_ranks(rank_rows, 2, gen, mdir, m, timeout=300) for m in ("balanced", "plain")}
    proc = processor(Path(mdir))
    m = model(proc.tokenizer)
    packer = HFPacker.from_generation(gen, proc, family="qwen2_audio")  # checks every sample
    shares = _shares(gen)
    assert len(shares[0]) + len(shares[1]) == 10
    row = _packed(packer, shares[0] + shares[1])
    loss = _loss(m, row, int((row["labels"][..., 1:] != -100).sum()))
    loss.backward()
    ref = _flat_grads(m)
    assert [r["recordings"] for r in runs["plain"]] == [10, 0]
    for mode, ranks in runs.items():
        for r in ranks:
            assert r["loss"] == pytest.approx(loss.item(), rel=1e-6), mode
            np.testing.assert_allclose(r["grads"], ref, rtol=1e-5, atol=1e-9)
    assert runs["balanced"][0]["moved"] > 0  # windows went to rank 1


@pytest.mark.parametrize("chunk_length, bad", [(29, True), (30, False), (31, True)])
def test_the_window_is_checked_against_the_rule(tmp_path, chunk_length, bad):
    from shards.read.prep_settings import SettingsMismatch
    from trainer_adapter.hf.inputs import HFPacker

    gen, mdir = _generation(str(tmp_path / "gen"))
    proc = processor(Path(mdir), chunk_length=chunk_length)
    if not bad:
        assert HFPacker.from_generation(gen, proc, family="qwen2_audio").audio_rule
        return
    with pytest.raises(SettingsMismatch, match=f"chunk_length {chunk_length} .processor. vs 30"):
        HFPacker.from_generation(gen, proc, family="qwen2_audio")
