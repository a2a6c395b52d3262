"""The registry of model families: one line per family module, and every table the stages read,
derived from the families' specs (:class:`~dataprep.families.spec.FamilySpec`).

Adding a family is one module exporting ``SPEC`` and its line in :data:`FAMILY_MODULES` (a name
of this package, or any importable module). The tables — the vision policies by
name, the template image markers, which templates go with which policy, which policies a packer
family takes, the processor checks — are filled from the specs by :func:`load`, in place, so a
module that imported one sees every family. The order of the modules is the order of the
tables: a template that writes the markers of several families is taken as the first one's.
"""

from __future__ import annotations

import importlib
import importlib.util

from dataprep.families.spec import FamilySpec, ImageTokens, PolicySpec

__all__ = [
    "CHECKS",
    "FAMILIES",
    "FAMILY_MODULES",
    "FAMILY_POLICIES",
    "IMAGE_TOKENS",
    "MEDIA_TOKENS",
    "POLICIES",
    "POLICY_TEMPLATE_FAMILIES",
    "family_spec",
    "load",
    "rule_owners",
]

FAMILY_MODULES = (
    "qwen2vl",
    "qwen3vl",
    "internvl",
    "llava",
    "llava_next",
    "llava_onevision",
    "gemma3",
    "gemma4",
    "glm4v",
    "smolvlm",
    "mistral3",
    "aya_vision",
    "ernie45vl",
    "deepseek_vl",
    "janus",
    "ovis2",
    "aria",
    "granite_docling",
    "idefics2",
    "deepseek_vl_hybrid",
    "qwen2_5_omni",
    "qwen2_audio",
    "audioflamingo3",
)

FAMILIES: dict[str, FamilySpec] = {}  # packer family name -> its spec
POLICIES: dict[str, PolicySpec] = {}  # vision-policy spec name -> how it builds (not ``fixed``)
IMAGE_TOKENS: dict[str, ImageTokens] = {}  # template image family -> its marker's expansion
# template image family -> {modality: its video or audio marker's expansion}
MEDIA_TOKENS: dict[str, dict[str, ImageTokens]] = {}
POLICY_TEMPLATE_FAMILIES: dict[str, tuple[str, ...]] = {}  # policy -> its models' templates
FAMILY_POLICIES: dict[str, tuple[str, ...]] = {}  # packer family -> the policies it takes
CHECKS: dict[str, tuple] = {}  # packer family -> its processor checks


def _spec_of(module: str) -> FamilySpec:
    """The ``SPEC`` of a module of this package (by its name) or of any importable module."""
    own = f"{__package__}.{module}"
    path = own if "." not in module and importlib.util.find_spec(own) is not None else module
    spec = getattr(importlib.import_module(path), "SPEC", None)
    if not isinstance(spec, FamilySpec):
        raise TypeError(f"family module {path} has no SPEC = FamilySpec(...)")
    return spec


def load(modules: tuple[str, ...] | None = None) -> None:
    """Fill every table from the specs of ``modules`` (default :data:`FAMILY_MODULES`);
    ``ValueError`` where two families disagree (a policy defined twice, a template family whose
    marker two specs write differently, a policy nobody defines)."""
    specs = [_spec_of(m) for m in (FAMILY_MODULES if modules is None else modules)]
    families: dict[str, FamilySpec] = {}
    policies: dict[str, PolicySpec] = {}
    tokens: dict[str, ImageTokens] = {}
    media: dict[str, dict[str, ImageTokens]] = {}
    templates: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        if spec.name in families:
            raise ValueError(f"family {spec.name} is registered twice")
        families[spec.name] = spec
        for name, pol in spec.policy_specs.items():
            if name in policies or name == "fixed":
                raise ValueError(f"vision policy {name} is defined by two families")
            policies[name] = pol
        known = spec.image_tokens
        if known is not None:  # audio-only families write no image marker
            known = tokens.setdefault(spec.template, spec.image_tokens)
        if known != spec.image_tokens:
            raise ValueError(
                f"family {spec.name} writes template family {spec.template}'s marker as "
                f"{spec.image_tokens}, another family as {known}"
            )
        for modality, marker in spec.media_tokens.items():
            known = media.setdefault(spec.template, {}).setdefault(modality, marker)
            if known != marker:
                raise ValueError(
                    f"family {spec.name} writes template family {spec.template}'s {modality} "
                    f"marker as {marker}, another family as {known}"
                )
        for name in spec.policies:
            have = templates.get(name, ())
            if spec.template not in have:
                templates[name] = (*have, spec.template)
    undefined = sorted(set(templates) - set(policies) - {"fixed"})
    if undefined:
        raise ValueError(f"vision policies {undefined} are named by a family but defined by none")
    for table, content in (
        (FAMILIES, families),
        (POLICIES, policies),
        (IMAGE_TOKENS, tokens),
        (MEDIA_TOKENS, media),
        (POLICY_TEMPLATE_FAMILIES, templates),
        (FAMILY_POLICIES, {s.name: s.policies for s in specs}),
        (CHECKS, {s.name: s.processor_checks for s in specs}),
    ):
        table.clear()
        table.update(content)


def rule_owners(modality: str, name: str) -> list[FamilySpec]:
    """The families that name the ``modality`` (``video`` / ``audio``) rule ``name`` as their
    processor's (``FamilySpec.video_rules`` / ``audio_rules``); none for a shared rule."""
    return [f for f in FAMILIES.values() if name in getattr(f, f"{modality}_rules")]


def family_spec(name: str) -> FamilySpec:
    """The spec of family ``name``; ``ValueError`` naming the families there are."""
    spec = FAMILIES.get(name)
    if spec is None:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {name!r}")
    return spec


load()
