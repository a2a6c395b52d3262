"""The registry of vision policies: a spec name -> the family that builds it, and the parser of
``NAME[:KEY=VALUE,...]`` spec strings (``internvl:max_tiles=6,thumbnail=0``,
``qwen2vl:min_pixels=3136,max_pixels=1003520,resize=qwen-vl-utils``, ``fixed:336/14``).

A family lists the options its spec takes by kind (integers, numbers, flags written 0/1, and
strings with their choices) and the defaults its name stands for (``qwen3vl`` is Qwen2-VL's
resize with Qwen3-VL's patch and pixel bounds). Adding a policy is one module and one entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dataprep.policies.anyres import LlavaNextPolicy, OneVisionPolicy
from dataprep.policies.aria import AriaPolicy
from dataprep.policies.aya import AyaVisionPolicy
from dataprep.policies.base import VisionPolicy
from dataprep.policies.deepseek_hybrid import DeepseekHybridPolicy
from dataprep.policies.fixed import FixedPolicy
from dataprep.policies.gemma3 import Gemma3Policy
from dataprep.policies.gemma4 import Gemma4Policy
from dataprep.policies.glm4v import Glm4vPolicy
from dataprep.policies.granite_docling import GraniteDoclingPolicy
from dataprep.policies.idefics2 import Idefics2Policy
from dataprep.policies.internvl import InternVLPolicy
from dataprep.policies.ovis2 import Ovis2Policy
from dataprep.policies.pixtral import MISTRAL3_DEFAULTS, PixtralPolicy
from dataprep.policies.qwen2vl import (
    ERNIE45VL_DEFAULTS,
    QWEN2VL_RESIZE,
    QWEN3VL_DEFAULTS,
    Qwen2VLPolicy,
)
from dataprep.policies.smolvlm import IDEFICS3_DEFAULTS, SmolVLMPolicy

__all__ = ["POLICIES", "PolicyFamily", "parse_vision_policy"]


@dataclass(frozen=True, kw_only=True)
class PolicyFamily:
    """How a spec name builds its policy: ``cls(**defaults, **options, **fixed)``.

    ``ints``: options given as non-negative integers; ``flags``: those of them that are 0/1
    switches; ``floats``: options given as numbers; ``strings``: string options and their allowed
    values (empty: any text, checked by the policy); ``fixed``: keyword arguments the spec cannot
    change (Pixtral's policy learns which name it was built under)."""

    cls: type[VisionPolicy]
    ints: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    floats: frozenset[str] = frozenset()
    strings: dict[str, tuple[str, ...]] = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    fixed: dict = field(default_factory=dict)

    def build(self, options: dict) -> VisionPolicy:
        return self.cls(**{**self.defaults, **options, **self.fixed})


def _family(cls, ints, flags=(), floats=(), strings=None, defaults=None, fixed=None):
    return PolicyFamily(
        cls=cls,
        ints=frozenset(ints) | frozenset(flags),
        flags=frozenset(flags),
        floats=frozenset(floats),
        strings=strings or {},
        defaults=defaults or {},
        fixed=fixed or {},
    )


_QWEN = ("min_pixels", "max_pixels", "patch_size", "merge_size")
_SMOLVLM = ("longest_edge", "tile", "patch_size", "tokens_per_tile")
_PIXTRAL = ("longest_edge", "patch_size", "merge_size")

POLICIES: dict[str, PolicyFamily] = {
    "internvl": _family(
        InternVLPolicy, ("min_tiles", "max_tiles", "tile_size", "patch_size"), ("thumbnail",)
    ),
    "qwen2vl": _family(Qwen2VLPolicy, _QWEN, strings={"resize": QWEN2VL_RESIZE}),
    "qwen3vl": _family(
        Qwen2VLPolicy, _QWEN, strings={"resize": QWEN2VL_RESIZE}, defaults=QWEN3VL_DEFAULTS
    ),
    "ernie45vl": _family(Qwen2VLPolicy, _QWEN, defaults=ERNIE45VL_DEFAULTS),
    "llava-onevision": _family(
        OneVisionPolicy, ("tile_size", "patch_size", "max_grid", "max_tiles")
    ),
    "llava-next": _family(LlavaNextPolicy, ("tile_size", "patch_size"), strings={"grids": ()}),
    "gemma3": _family(
        Gemma3Policy,
        ("image_size", "patch_size", "llm_tokens", "min_crop_size", "max_crops"),
        ("pan_and_scan",),
        floats=("min_ratio",),
    ),
    "gemma4": _family(Gemma4Policy, ("max_soft_tokens", "patch_size", "pooling_kernel_size")),
    "smolvlm": _family(SmolVLMPolicy, _SMOLVLM, ("split",)),
    "idefics3": _family(SmolVLMPolicy, _SMOLVLM, ("split",), defaults=IDEFICS3_DEFAULTS),
    "glm4v": _family(Glm4vPolicy, (*_QWEN, "temporal_patch_size")),
    "pixtral": _family(PixtralPolicy, _PIXTRAL, fixed={"name": "pixtral"}),
    "mistral3": _family(
        PixtralPolicy, _PIXTRAL, defaults=MISTRAL3_DEFAULTS, fixed={"name": "mistral3"}
    ),
    "aya-vision": _family(AyaVisionPolicy, ("min_tiles", "max_tiles", "tile_size", "patch_size")),
    "ovis2": _family(
        Ovis2Policy,
        ("max_tiles", "tile_size", "patch_size", "hidden_stride", "min_tiles"),
        ("covering",),
    ),
    "aria": _family(AriaPolicy, ("max_image_size", "patch_size", "tokens"), ("split",)),
    "granite-docling": _family(
        GraniteDoclingPolicy,
        ("max_tiles", "min_tiles", "tile_size", "patch_size", "tokens_per_tile", "dense_max_tiles"),
        ("fine", "split"),
        floats=("dense_max_scale", "dense_min_aspect", "dense_max_aspect"),
    ),
    "idefics2": _family(
        Idefics2Policy,
        ("shortest_edge", "longest_edge", "patch_size", "tokens_per_image"),
        ("split",),
    ),
    "deepseek-vl-hybrid": _family(
        DeepseekHybridPolicy, ("image_size", "patch_size", "high_res_size", "high_res_patch_size")
    ),
}


def parse_vision_policy(spec: str) -> VisionPolicy:
    """Build a policy from a spec string: ``fixed:336/14`` or ``NAME[:k=v,...]`` with NAME one
    of :data:`POLICIES` (``internvl``, ``qwen2vl``, ``qwen3vl``, ``ernie45vl``,
    ``llava-onevision``, ``llava-next``, ``gemma3``, ``gemma4``, ``smolvlm``, ``idefics3``,
    ``glm4v``, ``pixtral``, ``mistral3``, ``aya-vision``, ``ovis2``, ``aria``,
    ``granite-docling``, ``idefics2``, ``deepseek-vl-hybrid``)."""
    name, _, opts = spec.partition(":")
    name = name.strip().lower()
    if name == "fixed":
        size, sep, patch = opts.partition("/")
        if not sep or not size.isdigit() or not patch.isdigit():
            raise ValueError(
                f"bad vision policy {spec!r}: write fixed:SIZE/PATCH, e.g. fixed:336/14"
            )
        return FixedPolicy(image_size=int(size), patch_size=int(patch))
    family = POLICIES.get(name)
    if family is None:
        names = list(POLICIES)
        raise ValueError(
            f"unknown vision policy {spec!r}: choose fixed:S/P, {', '.join(names[:-1])} or "
            f"{names[-1]}"
        )
    options: dict = {}
    for item in filter(None, (o.strip() for o in opts.split(","))):
        key, sep, value = item.partition("=")
        if key in options:  # the last would win unseen
            raise ValueError(f"bad vision policy {spec!r}: option {key} is given twice")
        if sep and key in family.floats:
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if not math.isfinite(number):  # nan and inf pass every comparison check wrongly
                raise ValueError(
                    f"bad option {item!r} in vision policy {spec!r}: {key} takes a finite "
                    f"number, e.g. {key}=1.5"
                )
            options[key] = number
            continue
        choices = family.strings.get(key)
        if sep and choices is not None:
            if choices and value not in choices:
                raise ValueError(
                    f"bad option {item!r} in vision policy {spec!r}: {key} is one of "
                    f"{', '.join(choices)}"
                )
            options[key] = value
            continue
        if not sep or key not in family.ints or not value.isdigit():
            allowed = ", ".join(sorted(family.ints | set(family.strings) | family.floats))
            raise ValueError(
                f"bad option {item!r} in vision policy {spec!r}: use KEY=INT with KEY in {allowed}"
                + (" (or resize=transformers|qwen-vl-utils)" if name.startswith("qwen") else "")
            )
        if key in family.flags and value not in ("0", "1"):
            raise ValueError(
                f"bad option {item!r} in vision policy {spec!r}: {key} is a switch, 0 or 1"
            )
        options[key] = bool(int(value)) if key in family.flags else int(value)
    return family.build(options)
