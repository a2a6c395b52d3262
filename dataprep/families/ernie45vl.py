"""ERNIE 4.5-VL: Qwen2-VL's image processor under another name; vision experts per token."""

from dataclasses import replace

from dataprep.families.processor_settings import QWEN_CHECKS
from dataprep.families.qwen2vl import QWEN_OPTIONS, QWEN_PACKER
from dataprep.families.spec import FamilySpec, ImageTokens, policy
from dataprep.policies.qwen2vl import ERNIE45VL_DEFAULTS, Qwen2VLPolicy

SPEC = FamilySpec(
    name="ernie45vl",
    models="ERNIE 4.5-VL",
    policies=("ernie45vl",),
    policy_specs={
        "ernie45vl": policy(
            Qwen2VLPolicy,
            QWEN_OPTIONS,
            defaults=ERNIE45VL_DEFAULTS,
            help="Qwen2-VL's resize with ERNIE 4.5-VL's 14-px patches, 3136..4842768 px",
        )
    },
    template="ernie45vl",
    image_tokens=ImageTokens("<|IMAGE_PLACEHOLDER|>"),
    processor_checks=QWEN_CHECKS,
    # image tokens and their start / end go to the vision experts
    packer=replace(QWEN_PACKER, per_token="moe_mm_token_type_ids"),
    # Video k:<|VIDEO_START|><|VIDEO_PLACEHOLDER|><|VIDEO_END|>: the processor expands the
    # placeholder only
    media_tokens={"video": ImageTokens("<|VIDEO_PLACEHOLDER|>")},
    video_rules=("ernie45vl",),
)
