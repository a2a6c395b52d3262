"""HFPacker for Qwen2.5-Omni's thinker (images and recordings) against its own processor, and on
a real generation prepped with its own chat template.

* Rows equal ``Qwen2_5OmniProcessor(text=apply_chat_template(...), images=..., audio=...)``:
  the ids (each ``<|AUDIO|>`` repeated as the processor repeats it), the patches and grids,
  and each recording's frames (the processor pads every one to the 300-s window; the packer
  only to the row's longest, the masked frames equal) for recordings of other rates, stereo,
  several a sample, before and after an image. Positions equal the thinker's own
  ``get_rope_index`` over the processor's ids with its frame counts; labels are the
  assistant's text.
* On a generation (prep with the template, the Qwen2-VL policy and ``--audio-rule
  qwen2_5_omni``), every row is as long as prep counted (the packer checks each sample), and
  on 2 gloo ranks the loss and every gradient with both towers and the LLM balanced equal
  those without balancing and those of one process over all the rows.
* The processor's feature extractor is checked against the recorded rule at construction
  (each setting that changes the frames, at and beside the rule's value), and a sample with
  media the packer cannot build is refused, never packed as text."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from equishard.cli import main
from tests.dist_helper import run_ranks

tf = pytest.importorskip("transformers")

TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "chat_templates"
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_bos|>", "<|vision_eos|>",
            "<|IMAGE|>", "<|VIDEO|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]  # fmt: skip
NAMED = {"image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
         "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
         "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}  # fmt: skip
MEL = 16  # the tiny audio tower's mel bins
POLICY = "qwen2vl:min_pixels=3136,max_pixels=50176"


def model_dir(root: Path, tokenizer_path: str) -> Path:
    """The demo tokenizer with Qwen2.5-Omni's special tokens, and its chat template."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    config = {
        "chat_template": (TEMPLATE / "qwen2_5_omni.jinja").read_text(),
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "extra_special_tokens": NAMED,
    }
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


class OmniProcessor(tf.Qwen2_5OmniProcessor):
    """Qwen2.5-Omni's processor without its video processor (it needs torchvision, which has
    no CPU build for this torch on the registry); images and recordings are its own."""

    def check_argument_for_proper_class(self, name, arg):
        if arg is None and name == "video_processor":
            return None
        return super().check_argument_for_proper_class(name, arg)


def processor(mdir: Path, **fe) -> OmniProcessor:
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    tok = tf.AutoTokenizer.from_pretrained(str(mdir))
    ip = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    extractor = tf.WhisperFeatureExtractor(**{"feature_size": MEL, "chunk_length": 300, **fe})
    template = json.loads((mdir / "tokenizer_config.json").read_text())["chat_template"]
    return OmniProcessor(
        image_processor=ip, feature_extractor=extractor, tokenizer=tok, chat_template=template
    )


def thinker(tok, seed: int = 0):
    """A tiny Qwen2.5-Omni thinker with the tokenizer's ids for its media tokens."""
    ids = tok.convert_tokens_to_ids
    cfg = tf.Qwen2_5OmniThinkerConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                             "mrope_section": [2, 1, 1]},
        ),
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2,
                           in_channels=3, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, out_hidden_size=32, window_size=56,
                           fullatt_block_indexes=[1]),
        audio_config=dict(d_model=16, encoder_layers=1, encoder_attention_heads=2,
                          encoder_ffn_dim=32, output_dim=32, num_mel_bins=MEL,
                          max_source_positions=64, n_window=8),
        image_token_index=ids("<|IMAGE|>"), video_token_index=ids("<|VIDEO|>"),
        audio_token_index=ids("<|AUDIO|>"), audio_start_token_id=ids("<|audio_bos|>"),
        audio_end_token_id=ids("<|audio_eos|>"),
    )  # fmt: skip
    cfg.vision_start_token_id = ids("<|vision_bos|>")  # read by its get_rope_index
    torch.manual_seed(seed)
    return tf.Qwen2_5OmniThinkerForConditionalGeneration(cfg).double()


def dataset(root: Path, video: bool = True) -> tuple[Path, list[dict]]:
    """Demo images and real recordings (8-48 kHz, some stereo, FLAC and WAV) in samples of
    every kind: image and recording, recording only, two recordings, a recording before an
    image, image only, text only; ``video``: and a sample with a video, last."""
    from dataprep import make_demo
    from dataprep.demo_media import write_audios, write_videos

    demo = root / "demo"
    make_demo(demo, samples=4, seed=3, images=4)
    recs = write_audios(demo, np.random.default_rng(1), 4)
    images = sorted(str(p.relative_to(demo)) for p in (demo / "images").iterdir())
    kinds = [
        (["<image>", "<audio>"], images[:1], recs[:1]),
        (["<audio>"], [], recs[1:2]),
        (["<audio>", "<audio>"], [], recs[2:4]),
        (["<audio>", "<image>"], images[1:2], recs[3:4]),
        (["<image>"], images[2:3], []),
        ([], [], []),
    ]
    rng = np.random.default_rng(0)
    words = "the a tone of some long low high sound bird rain car voice".split()
    records = []
    for i in range(12):
        marks, imgs, auds = kinds[i % len(kinds)]
        say = lambda n: " ".join(rng.choice(words, n))  # noqa: E731
        rec = {"id": f"s{i}", "conversations": [
            {"from": "human", "value": "".join(m + "\n" for m in marks) + say(5) + "?"},
            {"from": "gpt", "value": say(int(rng.integers(3, 60))) + "."},
        ]}  # fmt: skip
        if imgs:
            rec["image"] = imgs[0]
        if auds:
            rec["audio"] = auds if len(auds) > 1 else auds[0]
        records.append(rec)
    (demo / "omni.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if not video:
        return demo, records
    # a video: no rule measures Qwen2.5-Omni's (frames interleaved with their soundtrack), so
    # prep refuses the sample into its errors table
    (clip,) = write_videos(demo, np.random.default_rng(2), 1)
    video = {
        "id": "v0",
        "video": clip,
        "conversations": [
            {"from": "human", "value": "<video>\nWhat happens?"},
            {"from": "gpt", "value": "Rain."},
        ],
    }
    with (demo / "omni.jsonl").open("a") as f:
        f.write(json.dumps(video) + "\n")
    return demo, records


def _turns(rec: dict) -> list[tuple[str, str]]:
    role = {"human": "user", "gpt": "assistant"}
    return [(role[c["from"]], c["value"]) for c in rec["conversations"]]


def _messages(turns) -> list[dict]:
    from dataprep.jinja_template import messages_from_turns

    return messages_from_turns(turns)


def _files(rec: dict, key: str) -> list[str]:
    v = rec.get(key, [])
    return [v] if isinstance(v, str) else v


def test_packer_equals_its_processor(tmp_path, tokenizer_path):
    from transformers.audio_utils import load_audio

    from dataprep.image_orientation import decode_image
    from trainer_adapter.hf.inputs import HFPacker

    demo, records = dataset(tmp_path)
    mdir = model_dir(tmp_path / "model", tokenizer_path)
    proc = processor(mdir)
    model = thinker(proc.tokenizer)
    packer = HFPacker(
        family="qwen2_5_omni",
        processor=proc,
        template=str(mdir),
        rope_index=model.model.get_rope_index,
        audio_rule="qwen2_5_omni",
    )
    audio_id = proc.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    for rec in records[:6]:
        turns = _turns(rec)
        imgs = [(demo / f).read_bytes() for f in _files(rec, "image")]
        auds = _files(rec, "audio")
        got = packer.sample(turns, imgs, [(demo / f).read_bytes() for f in auds])
        text = proc.apply_chat_template(_messages(turns), tokenize=False)
        ref = proc(
            text=[text],
            images=[decode_image(b) for b in imgs] or None,
            audio=[load_audio(str(demo / f), sampling_rate=16000) for f in auds] or None,
            return_tensors="pt",
        )
        ids = ref["input_ids"][0]
        assert torch.equal(got["input_ids"], ids), rec["id"]
        assert int((ids == audio_id).sum()) > 0 or not auds
        if imgs:
            assert torch.equal(got["pixel_values"], ref["pixel_values"])
            assert torch.equal(got["image_grid_thw"], ref["image_grid_thw"])
        frames = got.get("audio_frames", [])
        assert len(frames) == len(auds)
        lens = ref["feature_attention_mask"].sum(-1) if auds else None
        for k, f in enumerate(frames):  # the mask's frames, exactly the processor's
            assert len(f) == int(lens[k])
            np.testing.assert_array_equal(f.T, ref["input_features"][k, :, : len(f)].numpy())
        rope, _ = model.model.get_rope_index(
            ids[None],
            image_grid_thw=ref.get("image_grid_thw"),
            attention_mask=torch.ones_like(ids)[None],
            audio_seqlens=lens,
        )
        assert torch.equal(got["positions"][1:], rope)
        assert torch.equal(got["positions"][0, 0], torch.arange(len(ids)))
        trained = proc.tokenizer.decode(got["input_ids"][got["labels"] != -100])
        assert trained == turns[1][1]  # the answer, no template text, no media tokens
    one = packer([_Sample(records[1], demo)])  # a row of one recording
    (n,) = one["feature_attention_mask"].sum(-1).tolist()
    assert one["input_features"].shape == (1, MEL, n) and n > 0
    row = packer([_Sample(rec, demo) for rec in records[:4]])
    mask = row["feature_attention_mask"]
    assert row["input_features"].shape == (5, MEL, int(mask.sum(-1).max()))  # to the longest
    assert row["input_features"].permute(0, 2, 1)[mask == 0].abs().sum() == 0  # zeros after


class _Sample:
    """A record as the loader gives it: meta's turns and id, the media's bytes."""

    def __init__(self, rec: dict, demo: Path) -> None:
        self.meta = {"turns": _turns(rec), "sample_id": rec["id"]}
        self.images = [(demo / f).read_bytes() for f in _files(rec, "image")]
        self.audios = [(demo / f).read_bytes() for f in _files(rec, "audio")]
        self.videos = []


@functools.cache
def _generation(root: str, tokenizer_path: str) -> tuple[str, str]:
    root = Path(root)
    demo, _ = dataset(root)
    mdir = model_dir(root / "model", tokenizer_path)
    cost, plan, gen = root / "cost.parquet", root / "plan", root / "shards"
    args = ["prep", str(demo / "omni.jsonl"), "--image-root", str(demo), "--no-progress"]
    args += ["--tokenizer", str(mdir / "tokenizer.json"), "--template", str(mdir)]
    args += ["--vision-policy", POLICY, "--audio-rule", "qwen2_5_omni", "-o", str(cost)]
    args += ["--max-error-rate", "0.1"]  # its video: refused
    assert main(args) == 0
    import pyarrow.parquet as pq

    (error,) = pq.read_table(root / "cost.errors.parquet").to_pylist()
    assert error["sample_id"] == "v0" and error["reason"] == "unsupported_modality", error
    assert main(["balance", str(cost), "--dp", "2", "--target-batch", "3", "-o", str(plan)]) == 0
    assert main(["write", str(plan), "--cost-table", str(cost), "--out", str(gen)]) == 0
    return str(gen), str(mdir)


def _loss(model, row: dict, n: int):
    row = dict(row)
    labels = row.pop("labels")
    logits = model(**row, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(
        logits[0, :-1].float(), labels[0, 1:], ignore_index=-100, reduction="sum"
    )
    return loss / n


def _shares(gen: str) -> list[list]:
    """Every sample of the generation (each rank's groups, every step), split unevenly: rank
    0 holds every sample with a recording, rank 1 the others, so that balancing must move
    recordings, images and samples."""
    from shards import GroupDataset, RankInfo

    every = [
        s
        for rank in range(2)
        for group in GroupDataset(gen, RankInfo(rank=rank, world_size=2))
        for s in group["samples"]
    ]
    return [[s for s in every if s.audios], [s for s in every if not s.audios]]


def _flat_grads(model) -> np.ndarray:
    params = dict(model.named_parameters())
    return torch.cat(
        [(params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])).reshape(-1)
         for n in sorted(params)]
    ).numpy()  # fmt: skip


def _packed(packer, samples) -> dict:
    row = packer(samples)
    for k in ("pixel_values", "input_features"):  # the double-precision model's
        if row.get(k) is not None:
            row[k] = row[k].double()
    return row


def rank_rows(rank, world, gen, mdir, mode):
    """This rank's share packed from the generation by HFPacker, one step balanced (or not):
    the loss and the flat gradient summed over ranks."""
    import torch.distributed as dist

    from trainer_adapter.hf.balance import balance_model, global_targets
    from trainer_adapter.hf.inputs import HFPacker
    from trainer_adapter.redistribute import RedistributePolicy

    proc = processor(Path(mdir))
    model = thinker(proc.tokenizer)
    packer = HFPacker.from_generation(
        gen, proc, family="qwen2_5_omni", rope_index=model.model.get_rope_index
    )
    row = _packed(packer, _shares(gen)[rank])
    balance_model(model, policy=RedistributePolicy(enabled=mode == "balanced"))
    loss = _loss(model, row, global_targets(row["labels"]))
    loss.backward()
    dist.all_reduce(loss := loss.detach())
    flat = torch.from_numpy(_flat_grads(model))
    dist.all_reduce(flat)
    inner = model.model
    return {
        "loss": float(loss),
        "grads": flat.numpy(),
        "recordings": len(row.get("feature_attention_mask", ())),
        "audio_moved": inner.audio_tower.last_route.moved if mode == "balanced" else 0,
        "vision_moved": inner.visual.last_route.moved if mode == "balanced" else 0,
    }


def test_generation_rows_are_prep_counts_and_balanced_equals_single_process(
    tmp_path, tokenizer_path
):
    from trainer_adapter.hf.inputs import HFPacker

    gen, mdir = _generation(str(tmp_path), tokenizer_path)
    runs = {m: run_ranks(rank_rows, 2, gen, mdir, m, timeout=300) for m in ("balanced", "plain")}
    # one process over both ranks' shares, in rank order
    proc = processor(Path(mdir))
    model = thinker(proc.tokenizer)
    packer = HFPacker.from_generation(  # checks every sample against prep's count
        gen, proc, family="qwen2_5_omni", rope_index=model.model.get_rope_index
    )
    shares = _shares(gen)
    assert len(shares[0]) + len(shares[1]) == 12  # every sample of the set
    row = _packed(packer, shares[0] + shares[1])
    loss = _loss(model, row, int((row["labels"][..., 1:] != -100).sum()))
    loss.backward()
    ref = _flat_grads(model)
    assert [r["recordings"] for r in runs["plain"]] == [10, 0]  # 8 samples, 10 recordings
    for mode, ranks in runs.items():
        for r in ranks:
            assert r["loss"] == pytest.approx(loss.item(), rel=1e-6), mode
            np.testing.assert_allclose(r["grads"], ref, rtol=1e-5, atol=1e-9)
    assert runs["balanced"][0]["audio_moved"] > 0  # recordings went to rank 1
    assert runs["balanced"][1]["vision_moved"] > 0  # and images to rank 0
    audio = dict(model.named_parameters())["model.audio_tower.layers.0.fc1.weight"].grad
    assert audio is not None and audio.abs().sum() > 0  # the audio tower took part


@pytest.mark.parametrize(
    "setting, value, named",
    [
        ("chunk_length", 30, "chunk_length 30 (processor) vs 300 (prep)"),
        ("chunk_length", 301, "chunk_length 301"),
        ("chunk_length", 299, "chunk_length 299"),
        ("sampling_rate", 8000, "sampling_rate 8000 (processor) vs 16000 (prep)"),
        ("hop_length", 320, "hop_length 320 (processor) vs 160 (prep)"),
        ("n_fft", 512, "n_fft 512 (processor) vs 400 (prep)"),
        ("chunk_length", 300, None),  # the rule's own value: accepted
    ],
)
def test_the_feature_extractor_is_checked_against_the_recorded_rule(
    tmp_path, tokenizer_path, setting, value, named
):
    from shards.read.prep_settings import SettingsMismatch
    from trainer_adapter.hf.inputs import HFPacker

    gen, mdir = _generation(str(tmp_path / "gen"), tokenizer_path)
    proc = processor(Path(mdir), **{setting: value})
    if named is None:
        packer = HFPacker.from_generation(
            gen, proc, family="qwen2_5_omni", rope_index=lambda *a, **k: None
        )
        from dataprep.media_rules import parse_audio_rule

        assert parse_audio_rule(packer.audio_rule) == parse_audio_rule("qwen2_5_omni")
        same = HFPacker.from_generation(  # the recorded rule given by its name: the same
            gen, proc, family="qwen2_5_omni", rope_index=print, audio_rule="qwen2_5_omni"
        )
        assert same.audio_rule == packer.audio_rule
        return
    rule = re.escape("'whisper:sampling_rate=16000,hop_length=160,chunk_length=300,n_window=100'")
    with pytest.raises(SettingsMismatch, match=f"audio rule {rule}.*{re.escape(named)}"):
        HFPacker.from_generation(gen, proc, family="qwen2_5_omni", rope_index=lambda *a, **k: None)


def test_media_the_packer_cannot_build_are_refused(tmp_path, tokenizer_path):
    """A sample's recordings without an audio rule, its videos, an audio rule for a family
    that takes no recordings or one that is not Whisper-style, another rule than the
    generation's: each refused with the fix, never packed as text."""
    from shards.read.prep_settings import SettingsMismatch
    from trainer_adapter.hf.inputs import HFPacker

    demo, records = dataset(tmp_path)
    mdir = model_dir(tmp_path / "model", tokenizer_path)
    proc = processor(mdir)
    rope = thinker(proc.tokenizer).model.get_rope_index
    kw = dict(family="qwen2_5_omni", processor=proc, template=str(mdir), rope_index=rope)
    plain = HFPacker(**kw)  # no audio rule: images and text only
    with_audio = _Sample(records[1], demo)
    with pytest.raises(ValueError, match=r"sample 's1' has 1 recording\(s\).*audio rule"):
        plain([with_audio])
    assert plain([_Sample(records[4], demo)])["pixel_values"] is not None  # an image: packed
    video = _Sample(records[5], demo)
    video.videos = [b"clip"]
    with pytest.raises(ValueError, match=r"sample 's5' has 1 video\(s\).*video rule"):
        HFPacker(**kw, audio_rule="qwen2_5_omni")([video])
    with pytest.raises(ValueError, match=r"qwen2vl family takes no recordings.*qwen2_5_omni"):
        HFPacker(**{**kw, "family": "qwen2vl"}, audio_rule="qwen2_5_omni")
    with pytest.raises(ValueError, match="not a Whisper-style"):
        HFPacker(**kw, audio_rule="gemma4")
    gen, mdir2 = _generation(str(tmp_path / "gen"), tokenizer_path)
    with pytest.raises(SettingsMismatch, match=r"'qwen2audio' given.*chunk_length=300"):
        HFPacker.from_generation(
            gen, processor(Path(mdir2)), family="qwen2_5_omni", rope_index=print,
            audio_rule="qwen2audio",
        )  # fmt: skip
