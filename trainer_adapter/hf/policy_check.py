"""A Hugging Face processor checked against the vision policy a generation was measured with,
at construction (:meth:`HFPacker.from_generation`), so a mismatch is one error naming both values
instead of other lengths at sample N (or, with ``check_costs`` off, silently other batches than
the plan balanced).

The policy must be this model family's, and every setting of the processor that the policy
models must equal the policy's: the image processor's as the processor's call runs it (the
packer's ``images_kwargs`` over its own attributes: pixel bounds, tile counts and sizes,
splitting, pan-and-scan, anyres grids) and the processor's own (LLM tokens per tile or image,
patch and merge sizes). :data:`CHECKS` lists them per family, each as (the policy's field, the
processor's value, the policy's value); a setting the processor does not have (``None``) is not
compared. Settings of the vision encoder's config (e.g. SmolVLM's patch size) are not on the
processor and stay checked per sample (``check_costs``)."""

from __future__ import annotations

import dataclasses
import math
import re

from shards.prep_settings import SettingsMismatch

__all__ = ["CHECKS", "FAMILY_POLICIES", "check_processor_policy"]

# packer family -> the vision policies (dataprep.policies names) that count its images
FAMILY_POLICIES = {
    "qwen2vl": ("qwen2vl",),
    "qwen3vl": ("qwen3vl",),
    "glm4v": ("glm4v",),
    "internvl": ("internvl",),
    "llava": ("fixed",),
    "llava_next": ("llava-next",),
    "llava_onevision": ("llava-onevision",),
    "gemma3": ("gemma3",),
    "gemma4": ("gemma4",),
    "smolvlm": ("smolvlm", "idefics3"),
    "mistral3": ("mistral3", "pixtral"),
    "aya_vision": ("aya-vision",),
    "ernie45vl": ("ernie45vl",),
    "deepseek_vl": ("fixed",),
    "janus": ("fixed",),
    "ovis2": ("ovis2",),
    "aria": ("aria",),
    "granite_docling": ("granite-docling",),
    "idefics2": ("idefics2",),
    "deepseek_vl_hybrid": ("deepseek-vl-hybrid",),
}


def _field(value, key: str):
    """``value[key]`` of a dict setting, or its attribute (transformers' SizeDict)."""
    return value.get(key) if isinstance(value, dict) else getattr(value, key, None)


def _ip(name: str, key: str | None = None):
    """The image processor's setting ``name`` (its ``key``) as the call runs it."""

    def get(packer):
        value = packer._setting(name)
        return value if key is None or value is None else _field(value, key)

    return get


def _proc(name: str):
    """The processor's own attribute ``name``."""
    return lambda packer: getattr(getattr(packer, "processor", None), name, None)


def _pixels(name: str, key: str):
    """Qwen2-VL's pixel bound: ``min_pixels`` / ``max_pixels`` where the call passes it (the
    image processor's attribute only where its call takes that keyword: Qwen2-VL's does,
    GLM-4.1V's does not), else the size's edge."""

    def get(packer):
        call = getattr(packer, "_images_kw", None)
        if not isinstance(call, dict):  # no processor call: the setting as given
            return packer._setting(name) or _ip("size", key)(packer)
        ip = packer.processor.image_processor
        takes = getattr(getattr(ip, "valid_kwargs", None), "__annotations__", {})
        given = call.get(name, getattr(ip, name, None) if name in takes else None)
        return given or _ip("size", key)(packer)

    return get


def _tiles(packer):
    """GOT-OCR2's tile bound: one tile without ``crop_to_patches``."""
    return 1 if packer._setting("crop_to_patches") is False else packer._setting("max_patches")


def _llava_tokens(packer, side):
    """LLaVA's tokens an image (tile) of ``side`` px: its patches, the CLS token dropped by the
    ``default`` feature strategy (``LlavaProcessor._expand_image_tokens``)."""
    proc = getattr(packer, "processor", None)
    patch = getattr(proc, "patch_size", None)
    if side is None or not isinstance(patch, int) or patch < 1:
        return None
    extra = int(getattr(proc, "num_additional_image_tokens", 0) or 0)
    drop = getattr(proc, "vision_feature_select_strategy", None) == "default"
    return (side // patch) ** 2 + extra - drop


def _onevision_tokens(packer):
    proc = getattr(packer, "processor", None)
    n = getattr(proc, "num_image_tokens", None)
    if n is None:
        return None
    return n - (getattr(proc, "vision_feature_select_strategy", None) == "default")


def _pinpoints(packer):
    pins = packer._setting("image_grid_pinpoints")
    return None if pins is None else tuple(tuple(int(v) for v in p) for p in pins)


def _grids(packer):
    """LLaVA-NeXT's ``image_grid_pinpoints`` in tiles of its crop size, as the policy's grids
    (``"1x2.2x1"``); pinpoints that are no whole tiles are written in px."""
    pins, tile = _pinpoints(packer), _ip("crop_size", "height")(packer)
    if pins is None or not tile:
        return None
    if any(h % tile or w % tile for h, w in pins):
        return "px " + ".".join(f"{h}x{w}" for h, w in pins)
    return ".".join(f"{h // tile}x{w // tile}" for h, w in pins)


def _max_grid(packer):
    """LLaVA-OneVision's pinpoints as the policy's ``max_grid`` (every i x j tiles up to it)."""
    from dataprep.policies.anyres import square_grids

    pins, tile = _pinpoints(packer), _ip("size", "height")(packer)
    if pins is None or not tile:
        return None
    most = math.isqrt(len(pins))
    return most if pins == square_grids(tile, most) else f"{len(pins)} other pinpoints"


def _max_tiles(packer):
    """LLaVA-OneVision's ``vision_aspect_ratio`` (``anyres_max_9``) as the policy's max_tiles."""
    ratio = _proc("vision_aspect_ratio")(packer)
    if ratio is None:
        return None
    match = re.fullmatch(r"anyres_max_(\d+)", str(ratio))
    return int(match.group(1)) if match else str(ratio)


def _aya_tokens(packer):
    """Aya Vision's tokens a tile: ``(img_size / (patch_size * downsample))^2``."""
    size, patch = _proc("img_size")(packer), _proc("patch_size")(packer)
    return (size // patch) ** 2 if size and patch else None


def _aria_tokens(packer):
    """Aria's LLM tokens a crop: its processor's ``size_conversion`` at the crop size."""
    table, size = _proc("size_conversion")(packer), packer._setting("max_image_size")
    return None if not isinstance(table, dict) or size is None else table.get(int(size))


def _aria_policy_tokens(policy) -> int:
    from dataprep.policies.aria import ARIA_TOKENS

    return policy.tokens or ARIA_TOKENS[policy.max_image_size]


def _when_pan_and_scan(name: str):
    """A pan-and-scan setting, which counts only when the call pans and scans."""
    return lambda packer: packer._setting(name) if packer._setting("do_pan_and_scan") else None


def _fixed_tokens(policy) -> int:
    return (policy.image_size // policy.patch_size) ** 2


_QWEN = (
    ("min_pixels", _pixels("min_pixels", "shortest_edge")),
    ("max_pixels", _pixels("max_pixels", "longest_edge")),
    ("patch_size", _ip("patch_size")),
    ("merge_size", _ip("merge_size")),
)
_TILER = (
    ("min_tiles", _ip("min_patches")),
    ("max_tiles", _tiles),
    ("tile_size", _ip("size", "height")),
)
_SEQ_LEN = (("tokens per tile", _proc("image_seq_length"), lambda p: p.llm_tokens_per_tile),)
_FIXED_SIZE = (
    ("image_size", _ip("size", "height")),
    ("tokens per image", _proc("num_image_tokens"), _fixed_tokens),
)

# family -> (policy field or label, the processor's value, the policy's value: its field)
CHECKS = {
    "qwen2vl": _QWEN,
    "qwen3vl": _QWEN,
    "ernie45vl": _QWEN,
    "glm4v": (*_QWEN, ("temporal_patch_size", _ip("temporal_patch_size"))),
    "internvl": (*_TILER, *_SEQ_LEN),
    "ovis2": (*_TILER, *_SEQ_LEN),
    "aya_vision": (
        *_TILER,
        ("tokens per tile", _aya_tokens, lambda p: p.llm_tokens_per_tile),
    ),
    "mistral3": (
        ("longest_edge", _ip("size", "longest_edge")),
        ("patch_size", _ip("patch_size", "height")),
        ("merge_size", _proc("spatial_merge_size")),
    ),
    "aria": (
        ("max_image_size", _ip("max_image_size")),
        ("split", _ip("split_image")),
        ("tokens per crop", _aria_tokens, _aria_policy_tokens),
    ),
    "idefics2": (
        ("shortest_edge", _ip("size", "shortest_edge")),
        ("longest_edge", _ip("size", "longest_edge")),
        ("tokens_per_image", _proc("image_seq_len")),
        ("split", _ip("do_image_splitting")),
    ),
    "gemma3": (
        ("image_size", _ip("size", "height")),
        ("llm_tokens", _proc("image_seq_length")),
        ("pan_and_scan", _ip("do_pan_and_scan")),
        ("min_crop_size", _when_pan_and_scan("pan_and_scan_min_crop_size")),
        ("max_crops", _when_pan_and_scan("pan_and_scan_max_num_crops")),
        ("min_ratio", _when_pan_and_scan("pan_and_scan_min_ratio_to_activate")),
    ),
    "gemma4": (
        ("max_soft_tokens", _ip("max_soft_tokens")),
        ("patch_size", _ip("patch_size")),
        ("pooling_kernel_size", _ip("pooling_kernel_size")),
    ),
    "smolvlm": (
        ("longest_edge", _ip("size", "longest_edge")),
        ("tile", _ip("max_image_size", "longest_edge")),
        ("tokens_per_tile", _proc("image_seq_len")),
        ("split", _ip("do_image_splitting")),
    ),
    "granite_docling": (
        ("min_tiles", _ip("min_patches")),
        ("max_tiles", _ip("max_patches")),
        ("split", _ip("crop_to_patches")),
        ("tile_size", _ip("size", "height")),
        ("tokens_per_tile", _proc("image_seq_len")),
        ("fine", _ip("fine_route")),
        ("dense_max_tiles", _ip("dense_max_patches")),
        ("dense_max_scale", _ip("dense_max_scale")),
        ("dense_min_aspect", _ip("dense_min_aspect")),
        ("dense_max_aspect", _ip("dense_max_aspect")),
    ),
    "llava_next": (
        ("tile_size", _ip("crop_size", "height")),
        ("tile_size (size)", _ip("size", "shortest_edge"), lambda p: p.tile_size),
        ("grids", _grids),
        (
            "tokens per tile",
            lambda pk: _llava_tokens(pk, _ip("crop_size", "height")(pk)),
            lambda p: (p.tile_size // p.patch_size) ** 2,
        ),
    ),
    "llava_onevision": (
        ("tile_size", _ip("size", "height")),
        ("max_grid", _max_grid),
        ("max_tiles", _max_tiles),
        ("tokens per tile", _onevision_tokens, lambda p: p.patches_per_tile),
    ),
    "llava": (
        ("image_size", _ip("crop_size", "height")),
        (
            "tokens per image",
            lambda pk: _llava_tokens(pk, _ip("crop_size", "height")(pk)),
            _fixed_tokens,
        ),
    ),
    "deepseek_vl": _FIXED_SIZE,
    "janus": _FIXED_SIZE,
    "deepseek_vl_hybrid": (
        *_FIXED_SIZE,
        ("high_res_size", _ip("high_res_size", "height")),
    ),
}


def _same(have, want) -> bool:
    """Numbers (and flags) by value, anything else by its text."""
    numbers = (bool, int, float)
    if isinstance(have, numbers) and isinstance(want, numbers):
        return float(have) == float(want)
    return str(have) == str(want)


def _recorded(parsed, policy: dict):
    """The policy object with the recorded fields (the generation's record over its spec)."""
    names = {f.name for f in dataclasses.fields(parsed)}
    return dataclasses.replace(parsed, **{k: v for k, v in policy.items() if k in names})


def check_processor_policy(packer, policy: dict) -> None:
    """Raise :class:`SettingsMismatch` when ``policy`` (a generation's recorded vision policy)
    does not count images as ``packer``'s processor makes them."""
    from dataprep.policies import parse_vision_policy

    spec = str(policy.get("spec", "?"))
    allowed = FAMILY_POLICIES[packer.family]
    # a spec names its policy class's form (ernie45vl and qwen3vl write qwen2vl:...)
    canonical = {parse_vision_policy(n if n != "fixed" else "fixed:1/1").spec() for n in allowed}
    if spec.partition(":")[0] not in {c.partition(":")[0] for c in canonical}:
        raise SettingsMismatch(
            f"the generation was measured with vision policy {spec!r}, but the {packer.family} "
            f"processor counts images as {' or '.join(allowed)} does: prep with the model's "
            "policy, or pack with the family the generation was measured for"
        )
    measured = _recorded(parse_vision_policy(spec), policy)
    diff = []
    for label, have_of, *want_of in CHECKS[packer.family]:
        have = have_of(packer)
        want = want_of[0](measured) if want_of else getattr(measured, label)
        if have is not None and not _same(have, want):
            diff.append(f"{label} {have!r} (processor) vs {want!r} (prep)")
    if diff:
        raise SettingsMismatch(
            f"the {packer.family} processor makes images otherwise than vision policy {spec!r} "
            f"the generation was measured with: {'; '.join(diff)}; build the processor with "
            "the policy's settings (or pass them in images_kwargs), or prep with the processor's"
        )
