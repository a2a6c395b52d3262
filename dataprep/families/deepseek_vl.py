"""DeepSeek-VL 1.3B: a fixed number of ``<image_placeholder>`` an image (``fixed:S/P``)."""

from dataprep.families.processor_settings import FIXED_SIZE_CHECKS
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules

SPEC = FamilySpec(
    name="deepseek_vl",
    models="DeepSeek-VL 1.3B",
    policies=("fixed",),
    template="deepseek_vl",
    # Janus writes the same marker: its template is named with #images=deepseek_vl|janus
    image_tokens=ImageTokens("<image_placeholder>"),
    processor_checks=FIXED_SIZE_CHECKS,
    packer=PackerRules(fixed_tokens=True),
)
