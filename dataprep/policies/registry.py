"""The vision policies by spec name (:data:`POLICIES`, derived from the model families'
specs: :mod:`dataprep.families`) and the parser of
``NAME[:KEY=VALUE,...]`` spec strings (``internvl:max_tiles=6,thumbnail=0``,
``qwen2vl:min_pixels=3136,max_pixels=1003520,resize=qwen-vl-utils``, ``fixed:336/14``).

A policy spec lists the options it takes by kind (integers, numbers, flags written 0/1, and
strings with their choices) and the defaults its name stands for (``qwen3vl`` is Qwen2-VL's
resize with Qwen3-VL's patch and pixel bounds). A policy is added with its family: the policy's
module here, its spec in the family's module.
"""

from __future__ import annotations

import math

from dataprep.families.registry import POLICIES
from dataprep.families.spec import PolicySpec
from dataprep.policies.base import VisionPolicy
from dataprep.policies.fixed import FixedPolicy

__all__ = ["POLICIES", "PolicyFamily", "parse_vision_policy"]

PolicyFamily = PolicySpec  # its name before the families had specs


def parse_vision_policy(spec: str) -> VisionPolicy:
    """Build a policy from a spec string: ``fixed:336/14`` or ``NAME[:k=v,...]`` with NAME one
    of :data:`POLICIES`."""
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
