"""Reading a Hugging Face processor's settings for the families' processor checks.

Each accessor takes the packer (anything with ``processor``, ``_setting(name)`` — an image
setting as the processor's call runs it — and ``_images_kw``) and returns the value, or None
where the processor has no such setting (then nothing is compared).
"""

from __future__ import annotations

__all__ = [
    "FIXED_SIZE_CHECKS",
    "QWEN_CHECKS",
    "SEQ_LEN_CHECKS",
    "TILER_CHECKS",
    "fixed_tokens",
    "image_setting",
    "llava_tokens",
    "pinpoints",
    "pixel_bound",
    "processor_attr",
    "tile_bound",
]


def _field(value, key: str):
    """``value[key]`` of a dict setting, or its attribute (transformers' SizeDict)."""
    return value.get(key) if isinstance(value, dict) else getattr(value, key, None)


def image_setting(name: str, key: str | None = None):
    """The image processor's setting ``name`` (its ``key``) as the call runs it."""

    def get(packer):
        value = packer._setting(name)
        return value if key is None or value is None else _field(value, key)

    return get


def processor_attr(name: str):
    """The processor's own attribute ``name``."""
    return lambda packer: getattr(getattr(packer, "processor", None), name, None)


def pixel_bound(name: str, key: str):
    """Qwen2-VL's pixel bound: ``min_pixels`` / ``max_pixels`` where the call passes it (the
    image processor's attribute only where its call takes that keyword: Qwen2-VL's does,
    GLM-4.1V's does not), else the size's edge."""

    def get(packer):
        call = getattr(packer, "_images_kw", None)
        if not isinstance(call, dict):  # no processor call: the setting as given
            return packer._setting(name) or image_setting("size", key)(packer)
        ip = packer.processor.image_processor
        takes = getattr(getattr(ip, "valid_kwargs", None), "__annotations__", {})
        given = call.get(name, getattr(ip, name, None) if name in takes else None)
        return given or image_setting("size", key)(packer)

    return get


def tile_bound(packer):
    """GOT-OCR2's tile bound: one tile without ``crop_to_patches``."""
    return 1 if packer._setting("crop_to_patches") is False else packer._setting("max_patches")


def fixed_tokens(policy) -> int:
    """A fixed-size policy's tokens an image."""
    return (policy.image_size // policy.patch_size) ** 2


QWEN_CHECKS = (
    ("min_pixels", pixel_bound("min_pixels", "shortest_edge")),
    ("max_pixels", pixel_bound("max_pixels", "longest_edge")),
    ("patch_size", image_setting("patch_size")),
    ("merge_size", image_setting("merge_size")),
)
TILER_CHECKS = (
    ("min_tiles", image_setting("min_patches")),
    ("max_tiles", tile_bound),
    ("tile_size", image_setting("size", "height")),
)
SEQ_LEN_CHECKS = (
    ("tokens per tile", processor_attr("image_seq_length"), lambda p: p.llm_tokens_per_tile),
)
FIXED_SIZE_CHECKS = (
    ("image_size", image_setting("size", "height")),
    ("tokens per image", processor_attr("num_image_tokens"), fixed_tokens),
)


def llava_tokens(packer, side):
    """LLaVA's tokens an image (tile) of ``side`` px: its patches, the CLS token dropped by the
    ``default`` feature strategy (``LlavaProcessor._expand_image_tokens``)."""
    proc = getattr(packer, "processor", None)
    patch = getattr(proc, "patch_size", None)
    if side is None or not isinstance(patch, int) or patch < 1:
        return None
    extra = int(getattr(proc, "num_additional_image_tokens", 0) or 0)
    drop = getattr(proc, "vision_feature_select_strategy", None) == "default"
    return (side // patch) ** 2 + extra - drop


def pinpoints(packer):
    """The image processor's ``image_grid_pinpoints`` as tuples (None: it has none)."""
    pins = packer._setting("image_grid_pinpoints")
    return None if pins is None else tuple(tuple(int(v) for v in p) for p in pins)
