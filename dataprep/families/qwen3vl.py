"""Qwen3-VL and Qwen3.5: Qwen2-VL's resize with 16-px patches (multiples of 32)."""

from dataclasses import replace

from dataprep.families.processor_settings import QWEN_CHECKS
from dataprep.families.qwen2vl import QWEN_IMAGE, QWEN_OPTIONS, QWEN_PACKER, QWEN_VIDEO
from dataprep.families.spec import FamilySpec, policy
from dataprep.policies.qwen2vl import QWEN2VL_RESIZE, QWEN3VL_DEFAULTS, Qwen2VLPolicy

SPEC = FamilySpec(
    name="qwen3vl",
    models="Qwen3-VL, Qwen3.5",
    policies=("qwen3vl",),
    policy_specs={
        "qwen3vl": policy(
            Qwen2VLPolicy,
            QWEN_OPTIONS,
            strings={"resize": QWEN2VL_RESIZE},
            defaults=QWEN3VL_DEFAULTS,
            help="the same with Qwen3-VL's 16-px patches (multiples of 32), 65536..16777216 px",
        )
    },
    template="qwen2vl",
    image_tokens=QWEN_IMAGE,
    processor_checks=QWEN_CHECKS,
    packer=replace(QWEN_PACKER, videos=True),  # its videos built (hf.video_inputs)
    media_tokens={"video": QWEN_VIDEO},
    video_rules=("qwen3vl",),  # timestamps in the prompt, the template's wrapper collapsed
)
