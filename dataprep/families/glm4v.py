"""GLM-4.1V, GLM-4.5V and GLM-4.6V: Qwen2-VL-like resize, two frames per image."""

from dataclasses import replace

from dataprep.families.processor_settings import QWEN_CHECKS, image_setting
from dataprep.families.qwen2vl import QWEN_OPTIONS, QWEN_PACKER
from dataprep.families.spec import FamilySpec, ImageTokens, policy
from dataprep.policies.glm4v import Glm4vPolicy

SPEC = FamilySpec(
    name="glm4v",
    models="GLM-4.1V, GLM-4.5V, GLM-4.6V",
    policies=("glm4v",),
    policy_specs={
        "glm4v": policy(
            Glm4vPolicy,
            (*QWEN_OPTIONS, "temporal_patch_size"),
            help="GLM-4.1V / 4.5V / 4.6V: Qwen2-VL-like resize, two frames per image\n"
            "options: glm4v:min_pixels=12544,max_pixels=11760000",
        )
    },
    template="glm4v",
    image_tokens=ImageTokens("<|image|>"),
    processor_checks=(*QWEN_CHECKS, ("temporal_patch_size", image_setting("temporal_patch_size"))),
    # its videos built (hf.video_inputs), each pair among the images: its model takes both
    # kinds' features at every <|image|> token
    packer=replace(QWEN_PACKER, videos=True, videos_with_images=True),
    # <|begin_of_video|><|video|><|end_of_video|>: the processor expands <|video|> only
    media_tokens={"video": ImageTokens("<|video|>")},
    video_rules=("glm4v",),
)
