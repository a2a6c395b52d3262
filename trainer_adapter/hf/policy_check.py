"""A Hugging Face processor checked against the vision policy a generation was measured with,
at construction (:meth:`HFPacker.from_generation`), so a mismatch is one error naming both values
instead of other lengths at sample N: the policy must be this model family's, and for Qwen-VL the
processor's pixel bounds, patch and merge sizes, and for the GOT-OCR2-style tilers (InternVL, Aya
Vision, Ovis2) its tile counts and tile size, Mistral 3's longest edge, Aria's image size and
splitting, Idefics2's splitting and Gemma 3's pan-and-scan (with the packer's ``images_kwargs``
over them, as the processor call runs them) must equal the policy's. Before, a tiler's other tile bounds were
found only at the first sample whose image they change, possibly far into a run."""

from __future__ import annotations

from shards.prep_settings import SettingsMismatch

__all__ = ["FAMILY_POLICIES", "check_processor_policy"]

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


_QWEN_LIKE = ("qwen2vl", "qwen3vl", "ernie45vl")  # Qwen2-VL's image processor
_TILERS = ("internvl", "aya_vision", "ovis2")  # min_patches..max_patches tiles of size x size


def _field(value, key: str):
    """``value[key]`` of a dict setting, or its attribute (transformers' SizeDict)."""
    return value.get(key) if isinstance(value, dict) else getattr(value, key, None)


def _size(packer, key: str):
    return _field(packer._setting("size"), key)


def _tiler_settings(packer) -> dict:
    """(min_tiles, max_tiles, tile_size) as the image processor runs them; without
    ``crop_to_patches`` every image is one tile."""
    crop = packer._setting("crop_to_patches")
    return {
        "min_tiles": packer._setting("min_patches"),
        "max_tiles": 1 if crop is False else packer._setting("max_patches"),
        "tile_size": _size(packer, "height"),
    }


# other families: policy field -> (the processor call's setting, a key inside it)
_SETTINGS = {
    "mistral3": {"longest_edge": ("size", "longest_edge")},
    "aria": {"max_image_size": ("max_image_size", None), "split": ("split_image", None)},
    "idefics2": {"split": ("do_image_splitting", None)},
    "gemma3": {"pan_and_scan": ("do_pan_and_scan", None)},
}


def _settings_of(packer) -> dict:
    out = {}
    for field, (name, key) in _SETTINGS[packer.family].items():
        v = packer._setting(name)
        out[field] = v if key is None else _field(v, key)
    return out


def _qwen_processor_bounds(packer) -> dict:
    """(min_pixels, max_pixels, patch_size, merge_size) as the image processor runs them."""
    return {
        "min_pixels": packer._setting("min_pixels") or _size(packer, "shortest_edge"),
        "max_pixels": packer._setting("max_pixels") or _size(packer, "longest_edge"),
        "patch_size": packer._setting("patch_size"),
        "merge_size": packer._setting("merge_size"),
    }


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
    if packer.family in _QWEN_LIKE:
        have = _qwen_processor_bounds(packer)
    elif packer.family in _TILERS:
        have = _tiler_settings(packer)
    elif packer.family in _SETTINGS:
        have = _settings_of(packer)
    else:
        return
    diff = [
        f"{k} {have[k]!r} (processor) vs {policy.get(k)!r} (prep)"
        for k in have
        if have[k] is not None and k in policy and int(have[k]) != int(policy[k])
    ]
    if diff:
        raise SettingsMismatch(
            f"the {packer.family} processor resizes images otherwise than vision policy {spec!r} "
            f"the generation was measured with: {'; '.join(diff)}; build the processor with "
            "the policy's bounds (or pass them in images_kwargs), or prep with the processor's"
        )
