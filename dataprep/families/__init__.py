"""Model families, one module each, each one :class:`~dataprep.families.spec.FamilySpec`:
the vision policies that count its images, the image marker its chat template writes, the
processor settings to check and how the Hugging Face packer builds its rows. The registry
(:mod:`dataprep.families.registry`) lists them and derives every table from them."""

from dataprep.families.registry import (
    FAMILIES,
    FAMILY_MODULES,
    family_spec,
)
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules, PolicySpec

__all__ = [
    "FAMILIES",
    "FAMILY_MODULES",
    "FamilySpec",
    "ImageTokens",
    "PackerRules",
    "PolicySpec",
    "family_spec",
]
