"""Vision policy specs: ``NAME[:KEY=VALUE,...]`` strings -> :class:`VisionPolicy` objects.

The names and what they reproduce are listed in :mod:`dataprep.vision_policy`; the policies of
one family each live in their own module (``anyres_policy``, ``glm4v_policy``,
``pixtral_policy``, ``smolvlm_policy``, ``aya_policy``, ``gemma4_policy``, ``ovis2_policy``,
``aria_policy``, ``granite_docling_policy``, ``idefics2_policy``, ``gemma3_policy``,
``deepseek_hybrid_policy``), imported when a spec names them.
"""

from __future__ import annotations

from dataprep.vision_policy import (
    ERNIE45VL_DEFAULTS,
    QWEN2VL_RESIZE,
    QWEN3VL_DEFAULTS,
    FixedPolicy,
    InternVLPolicy,
    Qwen2VLPolicy,
    VisionPolicy,
)

__all__ = ["parse_vision_policy"]

_INT_OPTIONS = {
    "gemma3": {
        "image_size",
        "patch_size",
        "llm_tokens",
        "pan_and_scan",
        "min_crop_size",
        "max_crops",
    },
    "gemma4": {"max_soft_tokens", "patch_size", "pooling_kernel_size"},
    "deepseek-vl-hybrid": {"image_size", "patch_size", "high_res_size", "high_res_patch_size"},
    "glm4v": {"min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size"},
    "smolvlm": {"longest_edge", "tile", "patch_size", "tokens_per_tile", "split"},
    "idefics3": {"longest_edge", "tile", "patch_size", "tokens_per_tile", "split"},
    "internvl": {"min_tiles", "max_tiles", "tile_size", "patch_size", "thumbnail"},
    "aya-vision": {"min_tiles", "max_tiles", "tile_size", "patch_size"},
    "ovis2": {"max_tiles", "tile_size", "patch_size", "hidden_stride", "covering", "min_tiles"},
    "aria": {"max_image_size", "split", "patch_size"},
    "idefics2": {"shortest_edge", "longest_edge", "patch_size", "tokens_per_image", "split"},
    "granite-docling": {
        "max_tiles",
        "min_tiles",
        "tile_size",
        "patch_size",
        "tokens_per_tile",
        "fine",
        "split",
        "dense_max_tiles",
    },
    "llava-onevision": {"tile_size", "patch_size", "max_grid", "max_tiles"},
    "llava-next": {"tile_size", "patch_size"},
    "pixtral": {"longest_edge", "patch_size", "merge_size"},
    "mistral3": {"longest_edge", "patch_size", "merge_size"},
    "qwen2vl": {"min_pixels", "max_pixels", "patch_size", "merge_size"},
    "qwen3vl": {"min_pixels", "max_pixels", "patch_size", "merge_size"},
    "ernie45vl": {"min_pixels", "max_pixels", "patch_size", "merge_size"},
}
_FLOAT_OPTIONS = {
    "gemma3": {"min_ratio"},
    "granite-docling": {"dense_max_scale", "dense_min_aspect", "dense_max_aspect"},
}
_STR_OPTIONS = {
    "gemma3": {},
    "gemma4": {},
    "deepseek-vl-hybrid": {},
    "glm4v": {},
    "smolvlm": {},
    "idefics3": {},
    "internvl": {},
    "aya-vision": {},
    "ovis2": {},
    "aria": {},
    "idefics2": {},
    "granite-docling": {},
    "llava-onevision": {},
    "llava-next": {"grids": ()},  # () : any text, checked by the policy
    "pixtral": {},
    "mistral3": {},
    "qwen2vl": {"resize": QWEN2VL_RESIZE},
    "qwen3vl": {"resize": QWEN2VL_RESIZE},
    "ernie45vl": {},
}


def parse_vision_policy(spec: str) -> VisionPolicy:
    """Build a policy from a spec string: ``fixed:336/14``, ``internvl[:k=v,...]``,
    ``qwen2vl[:k=v,...]``, ``qwen3vl[:k=v,...]`` (Qwen2-VL's resize with Qwen3-VL's patch and
    pixel bounds), ``llava-onevision[:k=v,...]``, ``gemma3[:k=v,...]``, ``gemma4[:k=v,...]``,
    ``smolvlm[:k=v,...]``, ``idefics3[:k=v,...]``, ``glm4v[:k=v,...]``, ``llava-next[:k=v,...]``,
    ``pixtral[:k=v,...]``, ``mistral3[:k=v,...]``, ``aya-vision[:k=v,...]``, ``ovis2[:k=v,...]``,
    ``aria[:k=v,...]``, ``granite-docling[:k=v,...]``, ``idefics2[:k=v,...]``,
    ``deepseek-vl-hybrid[:k=v,...]``,
    ``ernie45vl[:k=v,...]`` (Qwen2-VL's resize with ERNIE 4.5-VL's pixel bounds)."""
    name, _, opts = spec.partition(":")
    name = name.strip().lower()
    if name == "fixed":
        size, sep, patch = opts.partition("/")
        if not sep or not size.isdigit() or not patch.isdigit():
            raise ValueError(
                f"bad vision policy {spec!r}: write fixed:SIZE/PATCH, e.g. fixed:336/14"
            )
        return FixedPolicy(image_size=int(size), patch_size=int(patch))
    if name not in _INT_OPTIONS:
        raise ValueError(
            f"unknown vision policy {spec!r}: choose fixed:S/P, internvl, qwen2vl, qwen3vl, "
            "ernie45vl, llava-onevision, llava-next, gemma3, gemma4, smolvlm, idefics3, glm4v, pixtral, "
            "mistral3, aya-vision, ovis2, aria, granite-docling, idefics2 or deepseek-vl-hybrid"
        )
    kwargs: dict = {}
    for item in filter(None, (o.strip() for o in opts.split(","))):
        key, sep, value = item.partition("=")
        choices = _STR_OPTIONS[name].get(key)
        if sep and key in _FLOAT_OPTIONS.get(name, ()):
            try:
                kwargs[key] = float(value)
            except ValueError:
                raise ValueError(
                    f"bad option {item!r} in vision policy {spec!r}: {key} takes a number, "
                    f"e.g. {key}=1.5"
                ) from None
            continue
        if sep and choices is not None:
            if choices and value not in choices:
                raise ValueError(
                    f"bad option {item!r} in vision policy {spec!r}: {key} is one of "
                    f"{', '.join(choices)}"
                )
            kwargs[key] = value
            continue
        if not sep or key not in _INT_OPTIONS[name] or not value.isdigit():
            allowed = ", ".join(
                sorted(
                    _INT_OPTIONS[name] | set(_STR_OPTIONS[name]) | _FLOAT_OPTIONS.get(name, set())
                )
            )
            raise ValueError(
                f"bad option {item!r} in vision policy {spec!r}: use KEY=INT with KEY in {allowed}"
                + (" (or resize=transformers|qwen-vl-utils)" if name.startswith("qwen") else "")
            )
        kwargs[key] = int(value)
    if name == "internvl":
        if "thumbnail" in kwargs:
            kwargs["thumbnail"] = bool(kwargs["thumbnail"])
        return InternVLPolicy(**kwargs)
    if name == "gemma3":
        from dataprep.gemma3_policy import Gemma3Policy

        if "pan_and_scan" in kwargs:
            kwargs["pan_and_scan"] = bool(kwargs["pan_and_scan"])
        return Gemma3Policy(**kwargs)
    if name == "deepseek-vl-hybrid":
        from dataprep.deepseek_hybrid_policy import DeepseekHybridPolicy

        return DeepseekHybridPolicy(**kwargs)
    if name == "gemma4":
        from dataprep.gemma4_policy import Gemma4Policy

        return Gemma4Policy(**kwargs)
    if name == "aya-vision":
        from dataprep.aya_policy import AyaVisionPolicy

        return AyaVisionPolicy(**kwargs)
    if name == "granite-docling":
        from dataprep.granite_docling_policy import GraniteDoclingPolicy

        for flag in ("fine", "split"):
            if flag in kwargs:
                kwargs[flag] = bool(kwargs[flag])
        return GraniteDoclingPolicy(**kwargs)
    if name == "idefics2":
        from dataprep.idefics2_policy import Idefics2Policy

        if "split" in kwargs:
            kwargs["split"] = bool(kwargs["split"])
        return Idefics2Policy(**kwargs)
    if name == "aria":
        from dataprep.aria_policy import AriaPolicy

        if "split" in kwargs:
            kwargs["split"] = bool(kwargs["split"])
        return AriaPolicy(**kwargs)
    if name == "ovis2":
        from dataprep.ovis2_policy import Ovis2Policy

        if "covering" in kwargs:
            kwargs["covering"] = bool(kwargs["covering"])
        return Ovis2Policy(**kwargs)
    if name == "glm4v":
        from dataprep.glm4v_policy import Glm4vPolicy

        return Glm4vPolicy(**kwargs)
    if name in ("smolvlm", "idefics3"):
        from dataprep.smolvlm_policy import IDEFICS3_DEFAULTS, SmolVLMPolicy

        if "split" in kwargs:
            kwargs["split"] = bool(kwargs["split"])
        defaults = IDEFICS3_DEFAULTS if name == "idefics3" else {}
        return SmolVLMPolicy(**{**defaults, **kwargs})
    if name == "llava-onevision":
        from dataprep.anyres_policy import OneVisionPolicy

        return OneVisionPolicy(**kwargs)
    if name == "llava-next":
        from dataprep.anyres_policy import LlavaNextPolicy

        return LlavaNextPolicy(**kwargs)
    if name in ("pixtral", "mistral3"):
        from dataprep.pixtral_policy import MISTRAL3_DEFAULTS, PixtralPolicy

        defaults = MISTRAL3_DEFAULTS if name == "mistral3" else {}
        return PixtralPolicy(**{**defaults, **kwargs}, name=name)
    if name == "qwen3vl":
        kwargs = {**QWEN3VL_DEFAULTS, **kwargs}
    if name == "ernie45vl":
        kwargs = {**ERNIE45VL_DEFAULTS, **kwargs}
    return Qwen2VLPolicy(**kwargs)
