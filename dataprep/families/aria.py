"""Aria (``AriaProcessor``): every image (or each crop) padded to 980 px, fixed tokens a crop."""

from dataprep.families.processor_settings import image_setting, processor_attr
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules, policy
from dataprep.policies.aria import ARIA_TOKENS, AriaPolicy


def _tokens(packer):
    """Aria's LLM tokens a crop: its processor's ``size_conversion`` at the crop size."""
    table, size = processor_attr("size_conversion")(packer), packer._setting("max_image_size")
    return None if not isinstance(table, dict) or size is None else table.get(int(size))


def _policy_tokens(policy) -> int:
    return policy.tokens or ARIA_TOKENS[policy.max_image_size]


SPEC = FamilySpec(
    name="aria",
    models="Aria",
    policies=("aria",),
    policy_specs={
        "aria": policy(
            AriaPolicy,
            ("max_image_size", "patch_size", "tokens"),
            ("split",),
            help="Aria: every image one crop padded to 980px (4900 patches), 256 tokens; split=1\n"
            "cuts it into crops as its image processor's split_image\n"
            "options: aria:max_image_size=980,split=0",
        )
    },
    template="aria",
    image_tokens=ImageTokens("<|img|>"),
    processor_checks=(
        ("max_image_size", image_setting("max_image_size")),
        ("split", image_setting("split_image")),
        ("tokens per crop", _tokens, _policy_tokens),
    ),
    # one image at a time: its processor counts every image as the call's most crops
    packer=PackerRules(one_image_per_call=("pixel_values", "pixel_mask"), beside=("pixel_mask",)),
)
