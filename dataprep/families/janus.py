"""Janus and Janus-Pro: DeepSeek-VL's marker between ``<begin_of_image>`` and ``<end_of_image>``."""

from dataprep.families.processor_settings import FIXED_SIZE_CHECKS
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules

SPEC = FamilySpec(
    name="janus",
    models="Janus, Janus-Pro",
    policies=("fixed",),
    template="janus",
    image_tokens=ImageTokens("<image_placeholder>", "<begin_of_image>", "<end_of_image>"),
    processor_checks=FIXED_SIZE_CHECKS,
    packer=PackerRules(fixed_tokens=True),
)
