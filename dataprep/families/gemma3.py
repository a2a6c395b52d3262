"""Gemma 3: 896 x 896, pooled to 256 soft tokens; pan-and-scan crops where the call runs it."""

from dataprep.families.processor_settings import image_setting, processor_attr
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules, policy
from dataprep.policies.gemma3 import Gemma3Policy


def _when_pan_and_scan(name: str):
    """A pan-and-scan setting, which counts only when the call pans and scans."""
    return lambda packer: packer._setting(name) if packer._setting("do_pan_and_scan") else None


SPEC = FamilySpec(
    name="gemma3",
    models="Gemma 3",
    policies=("gemma3",),
    policy_specs={
        "gemma3": policy(
            Gemma3Policy,
            ("image_size", "patch_size", "llm_tokens", "min_crop_size", "max_crops"),
            ("pan_and_scan",),
            floats=("min_ratio",),
            help="Gemma 3: 896x896, patch 14 (4096 patches), pooled to 256 LLM tokens;\n"
            "pan_and_scan=1 where your processor call runs it: a long image's crops too\n"
            "options: gemma3:pan_and_scan=1,min_crop_size=256,max_crops=4,min_ratio=1.2",
        )
    },
    template="gemma3",
    image_tokens=ImageTokens("<start_of_image>", "\n\n<start_of_image>", "<end_of_image>\n\n"),
    processor_checks=(
        ("image_size", image_setting("size", "height")),
        ("llm_tokens", processor_attr("image_seq_length")),
        ("pan_and_scan", image_setting("do_pan_and_scan")),
        ("min_crop_size", _when_pan_and_scan("pan_and_scan_min_crop_size")),
        ("max_crops", _when_pan_and_scan("pan_and_scan_max_num_crops")),
        ("min_ratio", _when_pan_and_scan("pan_and_scan_min_ratio_to_activate")),
    ),
    # its processor writes each image's block (pan-and-scan's sentence and crops with it);
    # token_type_ids: 1 on image tokens, which its mask makes bidirectional inside each image
    packer=PackerRules(spelled=True, per_token="token_type_ids"),
)
