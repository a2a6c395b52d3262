"""Qwen2-VL and Qwen2.5-VL: smart resize to multiples of 28, 14-px patches merged 2x2, 3-D
positions from the model's ``get_rope_index``."""

from dataclasses import replace

from dataprep.families.processor_settings import QWEN_CHECKS
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules, policy
from dataprep.policies.qwen2vl import QWEN2VL_RESIZE, Qwen2VLPolicy

QWEN_OPTIONS = ("min_pixels", "max_pixels", "patch_size", "merge_size")
QWEN_PACKER = PackerRules(rope_positions=True, beside=("image_grid_thw",))
QWEN_IMAGE = ImageTokens("<|image_pad|>")
QWEN_VIDEO = ImageTokens("<|video_pad|>")  # <|vision_start|><|video_pad|><|vision_end|>

SPEC = FamilySpec(
    name="qwen2vl",
    models="Qwen2-VL, Qwen2.5-VL",
    policies=("qwen2vl",),
    policy_specs={
        "qwen2vl": policy(
            Qwen2VLPolicy,
            QWEN_OPTIONS,
            strings={"resize": QWEN2VL_RESIZE},
            help="Qwen2-VL smart resize (multiples of 28), 2x2 merge\n"
            "options: qwen2vl:min_pixels=3136,max_pixels=1003520",
        )
    },
    template="qwen2vl",
    image_tokens=QWEN_IMAGE,
    processor_checks=QWEN_CHECKS,
    packer=replace(QWEN_PACKER, videos=True),  # its videos built (hf.video_inputs)
    media_tokens={"video": QWEN_VIDEO},
    video_rules=("qwen2vl",),  # Qwen3-VL's video prompts carry timestamps: not this rule
)
