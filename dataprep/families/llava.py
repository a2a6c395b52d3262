"""LLaVA-1.5: every image resized to one square (``fixed:336/14``: 576 tokens)."""

from dataprep.families.processor_settings import fixed_tokens, image_setting, llava_tokens
from dataprep.families.spec import FamilySpec, ImageTokens

LLAVA_IMAGE = ImageTokens("<image>")  # written by every LLaVA-like template

SPEC = FamilySpec(
    name="llava",
    models="LLaVA-1.5",
    policies=("fixed",),
    template="llava",
    image_tokens=LLAVA_IMAGE,
    processor_checks=(
        ("image_size", image_setting("crop_size", "height")),
        (
            "tokens per image",
            lambda pk: llava_tokens(pk, image_setting("crop_size", "height")(pk)),
            fixed_tokens,
        ),
    ),
)
