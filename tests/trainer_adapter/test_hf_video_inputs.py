"""HFPacker's videos (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) against the model's own processors.

The reference runs in a process of its own (:mod:`tests.trainer_adapter.video_reference`): the
real video processor and processor of each model, reading each file with transformers' PyAV
reader and sampling, resizing, normalizing and patching its frames, or for the qwen-vl-utils
source qwen-vl-utils' own ``fetch_video`` first; torchvision's two calls done as its 0.28 code
does them on a CPU. For each family and source, over real clips of several sizes (one
portrait) and frame rates, a sample with one video, with two, with an image before a video:

* the ids equal the processor's (each video's ``<|video_pad|>`` tokens; Qwen3-VL's time before
  each pair of frames, the template's wrapper collapsed), the patches and grids equal its
  ``pixel_values_videos`` and ``video_grid_thw`` exactly;
* the positions equal the model's ``get_rope_index`` over the processor's ids, token types and
  grids (Qwen2.5-VL: with the processor's ``second_per_grid_ts``);
* labels are the answer's tokens only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.dataprep.test_jinja_template import make_model_dir, write_image

tf = pytest.importorskip("transformers")
pytest.importorskip("av")

ROOT = Path(__file__).resolve().parents[2]
QWEN2 = "qwen2vl:min_pixels=3136,max_pixels=50176,min_frames=2"
QWEN3 = "qwen3vl:min_pixels=4096,min_frames=2"
# (processor, family, rule): every source of every rule, Qwen2.5-VL with its per-frame cap
CASES = {
    "qwen2vl-transformers": ("Qwen2VLProcessor", "qwen2vl", f"{QWEN2},source=transformers"),
    "qwen2vl-utils": ("Qwen2VLProcessor", "qwen2vl", f"{QWEN2},source=qwen-vl-utils"),
    "qwen2_5vl-capped": (
        "Qwen2_5_VLProcessor",
        "qwen2vl",
        f"{QWEN2},source=transformers,fps=1.5,cap_pixels_per_frame=1,max_video_tokens=400",
    ),
    "qwen3vl-transformers": ("Qwen3VLProcessor", "qwen3vl", f"{QWEN3},max_pixels=262144"),
    "qwen3vl-utils": (
        "Qwen3VLProcessor",
        "qwen3vl",
        f"{QWEN3},source=qwen-vl-utils,max_pixels=65536,fps=1",
    ),
}


def _videos(root: Path) -> list[str]:
    from dataprep.demo_media import write_videos

    return write_videos(root, np.random.default_rng(5), 4)


def _records(root: Path) -> list[dict]:
    """A video alone, two videos, an image then a video, a video after text."""
    clips = _videos(root)
    image = write_image(root / "img" / "a.png", 300, 200, "PNG", 1)
    q = "What happens here?"
    return [
        {"turns": [("user", f"<video>\n{q}"), ("assistant", "Rain falls.")], "videos": clips[:1]},
        {
            "turns": [("user", f"<video><video>{q}"), ("assistant", "Two cars.")],
            "videos": clips[1:3],
        },
        {
            "turns": [("user", f"<image>\n<video>\n{q}"), ("assistant", "A bird.")],
            "videos": clips[3:4],
            "images": [str(image.relative_to(root))],
        },
        {
            "turns": [("user", f"{q} <video>"), ("assistant", "Nothing at all.")],
            "videos": clips[2:3],
        },
    ]


def _processor(cls_name: str, model_dir: Path, rule):
    """The model's processor as a CPU user loads it: no video processor (it needs torchvision)."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    tok = tf.AutoTokenizer.from_pretrained(str(model_dir))
    mean = [0.5] * 3 if "Qwen3" in cls_name else None  # Qwen3-VL's configs
    kw = {"image_mean": mean, "image_std": mean} if mean else {}
    ip = Qwen2VLImageProcessorPil(patch_size=rule.patch_size, merge_size=2, **kw)
    cls = type(
        cls_name,
        (getattr(tf, cls_name),),
        {"get_attributes": classmethod(lambda c: ["image_processor", "tokenizer"])},
    )
    return cls(image_processor=ip, tokenizer=tok, chat_template=tok.chat_template)


def _rope_index(cls_name: str, tok):
    """A tiny model's ``get_rope_index`` with the tokenizer's vision token ids."""
    from tests.trainer_adapter.test_hf_inputs import _vision_token_ids

    ids = _vision_token_ids(tok)
    text = dict(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    if cls_name == "Qwen3VLProcessor":
        rope = {
            "rope_type": "default",
            "rope_theta": 1e4,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        }
        cfg = tf.Qwen3VLConfig(
            text_config={**text, "head_dim": 8, "rope_parameters": rope},
            vision_config=dict(
                depth=1,
                hidden_size=16,
                intermediate_size=16,
                num_heads=2,
                patch_size=16,
                out_hidden_size=16,
            ),
            **ids,
        )
        return tf.Qwen3VLModel(cfg).get_rope_index
    rope = {"type": "mrope", "mrope_section": [2, 1, 1]}
    config, model = (
        (tf.Qwen2_5_VLConfig, tf.Qwen2_5_VLModel)
        if cls_name == "Qwen2_5_VLProcessor"
        else (tf.Qwen2VLConfig, tf.Qwen2VLModel)
    )
    cfg = config(
        text_config={**text, "rope_scaling": rope},
        vision_config=dict(depth=1, hidden_size=16, num_heads=2),
        **ids,
    )
    return model(cfg).get_rope_index


def reference(tmp_path: Path, cls_name: str, rule, model_dir: Path, cases: list[dict]) -> list:
    """The processor's outputs for ``cases`` (text, video and image paths), from
    :mod:`tests.trainer_adapter.video_reference`."""
    size = {"shortest_edge": rule.min_pixels}
    factor = rule.patch_size * rule.merge_size
    if rule.source == "transformers":
        size["longest_edge"] = rule.max_pixels or 768 * factor * factor
    video = {
        "size": size,
        "patch_size": rule.patch_size,
        "merge_size": rule.merge_size,
        "temporal_patch_size": rule.temporal_patch_size,
        "min_frames": rule.min_frames,
        "max_frames": rule.max_frames,
        "cap_pixels_per_frame": rule.cap_pixels_per_frame,
        "max_video_tokens": rule.max_video_tokens,
    }
    if "Qwen3" in cls_name:
        video |= {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    image = {
        "patch_size": rule.patch_size,
        "merge_size": 2,
        **({"image_mean": [0.5] * 3, "image_std": [0.5] * 3} if "Qwen3" in cls_name else {}),
    }
    utils = None
    call = {"fps": rule.fps, "do_sample_frames": True}
    if rule.source == "qwen-vl-utils":
        utils = {
            "fps": rule.fps,
            "min_pixels": rule.min_pixels,
            "min_frames": rule.min_frames,
            "max_frames": rule.max_frames,
            "total_pixels": rule.total_pixels,
        }
        if rule.max_pixels:
            utils["max_pixels"] = rule.max_pixels
        call = {}
    request = {
        "model": str(model_dir),
        "processor": cls_name,
        "video": video,
        "image": image,
        "call": call,
        "utils": utils,
        "patch": rule.patch_size,
        "cases": cases,
    }
    req, out = tmp_path / "request.json", tmp_path / "result.pt"
    req.write_text(json.dumps(request))
    run = subprocess.run(
        [sys.executable, "-m", "tests.trainer_adapter.video_reference", str(req), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return torch.load(out)


@pytest.mark.parametrize("case", list(CASES))
def test_packer_videos_equal_the_processor(case, tmp_path, tokenizer_path):
    from dataprep.jinja_template import messages_from_turns
    from dataprep.media_rules import parse_video_rule
    from trainer_adapter.hf.inputs import HFPacker

    cls_name, family, spec = CASES[case]
    rule = parse_video_rule(spec)
    model_dir = make_model_dir(tmp_path, "qwen2vl", tokenizer_path)  # Qwen's template, tokens
    proc = _processor(cls_name, model_dir, rule)
    rope_index = _rope_index(cls_name, proc.tokenizer)
    packer = HFPacker(
        family=family,
        processor=proc,
        template=str(model_dir),
        rope_index=rope_index,
        video_rule=spec,
    )
    records = _records(tmp_path)
    cases = [
        {
            "text": proc.apply_chat_template(messages_from_turns(r["turns"]), tokenize=False),
            "videos": [str(tmp_path / v) for v in r["videos"]],
            "images": [str(tmp_path / i) for i in r.get("images", ())],
        }
        for r in records
    ]
    refs = reference(tmp_path, cls_name, rule, model_dir, cases)
    tok = proc.tokenizer
    for rec, ref in zip(records, refs, strict=True):
        got = packer.sample(
            rec["turns"],
            [(tmp_path / i).read_bytes() for i in rec.get("images", ())],
            video_bytes=[(tmp_path / v).read_bytes() for v in rec["videos"]],
        )
        ids = ref["input_ids"][0]
        assert got["input_ids"].tolist() == ids.tolist(), case
        pix = torch.cat([v["patches"] for v in got["videos"]])
        grid = torch.tensor([list(v["grid"]) for v in got["videos"]])
        assert torch.equal(grid, ref["video_grid_thw"])
        assert torch.equal(pix, ref["pixel_values_videos"])
        if rec.get("images"):
            assert torch.equal(got["pixel_values"], ref["pixel_values"])
        kw = {}
        if "second_per_grid_ts" in ref:
            kw["second_per_grid_ts"] = ref["second_per_grid_ts"]
        rope, _ = rope_index(
            ids[None],
            ref["mm_token_type_ids"],
            image_grid_thw=ref.get("image_grid_thw"),
            video_grid_thw=ref["video_grid_thw"],
            **kw,
        )
        assert torch.equal(got["positions"][1:], rope)
        trained = tok.decode(got["input_ids"][got["labels"] != -100])
        assert trained.endswith(rec["turns"][1][1] + "<|im_end|>") or trained == rec["turns"][1][1]
    if cls_name == "Qwen2_5_VLProcessor":  # the time per pair of frames moved the positions
        assert "second_per_grid_ts" in refs[0]
