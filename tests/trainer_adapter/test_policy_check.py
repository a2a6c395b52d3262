"""A processor checked against the generation's vision policy when the packer is built
(:mod:`trainer_adapter.hf.policy_check`), for every family: each setting the policy models is
read from the real processor (a check that reads nothing cannot refuse), the processor prep's
policy describes passes, and a processor with one setting changed is refused naming it. The
anchor is the processor itself: each changed setting makes other rows or pixels than the
original processor for the same conversations, so the refusal is of a difference the model
would see, not of a harmless one."""

from __future__ import annotations

import pytest

from shards.read.prep_settings import SettingsMismatch
from tests.dataprep.test_jinja_template import (
    FAMILIES,
    VARIANTS,
    conversations,
    make_model_dir,
    processor_call,
    processor_for,
    template_spec,
)
from tests.sweeps import sweep

pytest.importorskip("transformers")


def _packer(family, processor, model, call=None):
    from trainer_adapter.hf.inputs import HFPacker

    rope = (lambda *a, **k: None) if family in ("qwen2vl", "glm4v", "ernie45vl") else None
    return HFPacker(
        family=family,
        processor=processor,
        template=template_spec(model, family),
        rope_index=rope,
        images_kwargs=call or {},
    )


def _policy(spec: str) -> dict:
    from dataprep.policies import parse_vision_policy

    return parse_vision_policy(spec).describe()


@pytest.mark.parametrize("family", [*FAMILIES, *VARIANTS])
def test_every_setting_the_policy_models_is_read_from_the_processor(
    family, tmp_path, tokenizer_path
):
    """Bug: a check whose getter names a setting the processor does not have reads None and
    never refuses. Every check reads a value from the family's real processor (the
    pan-and-scan crop settings only where the call pans and scans), and prep's policy passes."""
    from trainer_adapter.hf.policy_check import CHECKS, check_processor_policy

    call, own = VARIANTS.get(family, ({}, None))
    family = family.split("-")[0]
    model = make_model_dir(tmp_path, family, tokenizer_path)
    packer = _packer(family, processor_for(family, model), model, call)
    unread = [label for label, have, *_ in CHECKS[family] if have(packer) is None]
    pans = bool(call.get("do_pan_and_scan"))
    assert unread == (
        [] if family != "gemma3" or pans else ["min_crop_size", "max_crops", "min_ratio"]
    )
    check_processor_policy(packer, _policy(own or FAMILIES[family]["policy"]))


def _set(obj: str, name: str, value):
    def change(processor):
        setattr(processor.image_processor if obj == "ip" else processor, name, value)
        return processor, {}

    return change


def _gemma3_tokens(n: int):
    """Gemma 3's processor writes its image sequence when it is built."""

    def change(p):
        return type(p)(
            image_processor=p.image_processor,
            tokenizer=p.tokenizer,
            image_seq_length=n,
            chat_template=p.chat_template,
        ), {}

    return change


PAN = {"do_pan_and_scan": True}
ONEVISION_2X2 = [[384, 384], [384, 768], [768, 384], [768, 768]]

# family, the change (the processor and the call's settings over ``call``), what the refusal
# names, the processor call's settings prep's policy describes
CHANGED = [
    ("qwen2vl", _set("ip", "max_pixels", 200704), r"max_pixels 200704", {}),
    (
        "glm4v",
        _set("ip", "size", {"shortest_edge": 12544, "longest_edge": 200704}),
        r"max_pixels 200704",
        {},
    ),
    ("gemma4", _set("ip", "max_soft_tokens", 70), r"max_soft_tokens 70", {}),
    ("smolvlm", _set("ip", "max_image_size", {"longest_edge": 512}), r"tile 512", {}),
    ("smolvlm", _set("pr", "image_seq_len", 64), r"tokens_per_tile 64", {}),
    ("smolvlm", _set("ip", "do_image_splitting", False), r"split False", {}),
    ("granite_docling", _set("ip", "max_patches", 2), r"max_tiles 2", {}),
    ("granite_docling", _set("pr", "image_seq_len", 81), r"tokens_per_tile 81", {}),
    ("granite_docling", _set("ip", "crop_to_patches", False), r"split False", {}),
    ("llava_next", _set("ip", "image_grid_pinpoints", [[336, 672]]), r"grids '1x2'", {}),
    ("llava_next", _set("pr", "patch_size", 16), r"tokens per tile 441", {}),
    ("llava_onevision", _set("pr", "vision_aspect_ratio", "anyres_max_4"), r"max_tiles 4", {}),
    ("llava_onevision", _set("ip", "image_grid_pinpoints", ONEVISION_2X2), r"max_grid 2", {}),
    ("llava_onevision", _set("pr", "num_image_tokens", 576), r"tokens per tile 576", {}),
    ("llava", _set("pr", "patch_size", 16), r"tokens per image 441", {}),
    ("deepseek_vl", _set("pr", "num_image_tokens", 144), r"tokens per image 144", {}),
    ("janus", _set("pr", "num_image_tokens", 144), r"tokens per image 144", {}),
    (
        "deepseek_vl_hybrid",
        _set("ip", "high_res_size", {"height": 768, "width": 768}),
        r"high_res_size 768",
        {},
    ),
    ("internvl", _set("pr", "image_seq_length", 64), r"tokens per tile 64", {}),
    ("ovis2", _set("pr", "image_seq_length", 64), r"tokens per tile 64", {}),
    ("aya_vision", _set("pr", "img_size", 448), r"tokens per tile 256", {}),
    ("mistral3", _set("pr", "spatial_merge_size", 1), r"merge_size 1", {}),
    ("aria", _set("pr", "size_conversion", {490: 128, 980: 200}), r"tokens per crop 200", {}),
    ("aria", lambda p: (p, {"split_image": True}), r"split True", {}),
    ("idefics2", _set("pr", "image_seq_len", 32), r"tokens_per_image 32", {}),
    (
        "idefics2",
        _set("ip", "size", {"shortest_edge": 224, "longest_edge": 980}),
        r"shortest_edge 224",
        {},
    ),
    ("gemma3", _gemma3_tokens(64), r"llm_tokens 64", {}),
    ("gemma3", lambda p: (p, {"pan_and_scan_max_num_crops": 2}), r"max_crops 2", PAN),
    ("gemma3", lambda p: (p, {"pan_and_scan_min_ratio_to_activate": 1.5}), r"min_ratio 1.5", PAN),
]


def _records(root) -> list[dict]:
    """Conversations, and three images alone in their samples: large, wide and thin (anyres,
    tiles, pan-and-scan crops)."""
    from tests.conftest import write_image

    alone = []
    for name, w, h in (
        ("big", 900, 880),
        ("wide", 900, 420),
        ("four-thirds", 900, 700),
        ("thin", 1024, 300),
    ):
        write_image(root / "img" / f"{name}.png", w, h, "PNG")
        turns = [{"from": "human", "value": "<image>\nwhat is it?"}, {"from": "gpt", "value": "a"}]
        alone.append({"id": name, "image": [f"img/{name}.png"], "conversations": turns})
    return [*conversations(root, 8, seed=5), *alone]


def _outputs(processor, family, records, root, call) -> list:
    """What the processor makes of each conversation: its tokens and the shape of every array."""
    out = []
    for rec in records:
        got, _ = processor_call(processor, family, rec, root, **call)
        out.append({k: getattr(v, "shape", v) for k, v in got.items() if k != "attention_mask"})
        out[-1]["input_ids"] = got["input_ids"][0].tolist()
    return out


@pytest.mark.parametrize(
    "family, change, names, call",
    sweep(
        "a processor with one setting changed",
        CHANGED,
        ids=[f"{c[0]}-{c[2].split()[0]}" for c in CHANGED],
        # a pixel bound, a grid, a crop count, an edge, a token count, a split switch
        fast=(
            "qwen2vl-max_pixels",
            "llava_onevision-max_grid",
            "gemma3-max_crops",
            "idefics2-shortest_edge",
            "internvl-tokens",
            "smolvlm-split",
            "aria-split",
        ),
    ),
)
def test_a_processor_with_one_setting_changed_is_refused(
    family, change, names, call, tmp_path, tokenizer_path
):
    """Bug: an LLaVA-NeXT, LLaVA-OneVision, SmolVLM, GLM-4.1V, Gemma 4, Granite Docling, ...
    processor with another grid, tile, token count or pixel bound than prep's policy was found
    only at the first sample whose image it changes (or, with check_costs off, never): refused
    when the packer is built, naming the setting and both values."""
    from trainer_adapter.hf.policy_check import check_processor_policy

    model = make_model_dir(tmp_path, family, tokenizer_path)
    policy = _policy("gemma3:pan_and_scan=1" if call else FAMILIES[family]["policy"])
    records = _records(tmp_path)
    original = processor_for(family, model)
    check_processor_policy(_packer(family, original, model, call), policy)
    changed, more = change(processor_for(family, model))
    with pytest.raises(SettingsMismatch, match=names + r" \(processor\) vs "):
        check_processor_policy(_packer(family, changed, model, {**call, **more}), policy)
    # the anchor: the change makes other rows or pixels for these conversations
    before = _outputs(original, family, records, tmp_path, call)
    assert _outputs(changed, family, records, tmp_path, {**call, **more}) != before


def test_a_setting_the_call_does_not_read_is_not_refused(tmp_path, tokenizer_path):
    """Bug: a check that reads what the processor's call does not: a GLM-4.1V image processor's
    ``max_pixels`` attribute (its call takes no such keyword and reads ``size``; Qwen2-VL's call
    does take it, refused in CHANGED) makes the same rows as without it, and is not refused."""
    from trainer_adapter.hf.policy_check import check_processor_policy

    model = make_model_dir(tmp_path, "glm4v", tokenizer_path)
    records = _records(tmp_path)
    original = processor_for("glm4v", model)
    stray, _ = _set("ip", "max_pixels", 200704)(processor_for("glm4v", model))
    assert _outputs(stray, "glm4v", records, tmp_path, {}) == _outputs(
        original, "glm4v", records, tmp_path, {}
    )
    check_processor_policy(_packer("glm4v", stray, model), _policy("glm4v"))
