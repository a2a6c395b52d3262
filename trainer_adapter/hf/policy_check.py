"""A Hugging Face processor checked against the vision policy a generation was measured with,
at construction (:meth:`HFPacker.from_generation`), so a mismatch is one error naming both values
instead of other lengths at sample N (or, with ``check_costs`` off, silently other batches than
the plan balanced).

The policy must be this model family's, and every setting of the processor that the policy
models must equal the policy's: the image processor's as the processor's call runs it (the
packer's ``images_kwargs`` over its own attributes: pixel bounds, tile counts and sizes,
splitting, pan-and-scan, anyres grids) and the processor's own (LLM tokens per tile or image,
patch and merge sizes). Each family's spec lists them (``processor_checks``, collected in
:data:`CHECKS`), each as (the policy's field, the processor's value, the policy's value); a
setting the processor does not have (``None``) is not compared. Settings of the vision
encoder's config (e.g. SmolVLM's patch size) are not on the processor and stay checked per
sample (``check_costs``)."""

from __future__ import annotations

import dataclasses

from dataprep.families.registry import CHECKS, FAMILY_POLICIES  # derived from the specs
from shards.read.prep_settings import SettingsMismatch

__all__ = ["CHECKS", "FAMILY_POLICIES", "check_processor_policy"]


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
