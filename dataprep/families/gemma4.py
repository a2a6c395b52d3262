"""Gemma 4: aspect kept within a patch budget, at most ``max_soft_tokens`` pooled tokens."""

from dataprep.families.processor_settings import image_setting
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules, policy
from dataprep.policies.gemma4 import Gemma4Policy

SPEC = FamilySpec(
    name="gemma4",
    models="Gemma 4",
    policies=("gemma4",),
    policy_specs={
        "gemma4": policy(
            Gemma4Policy,
            ("max_soft_tokens", "patch_size", "pooling_kernel_size"),
            help="Gemma 4: aspect kept, at most 280 soft tokens (3x3 pools of 16px patches),\n"
            "every image padded to 2520 encoder rows\n"
            "options: gemma4:max_soft_tokens=280 (70, 140, 280, 560 or 1120)",
        )
    },
    template="gemma4",
    # <|image|> is GLM-4V's marker too: Gemma 4's templates also write <|turn>
    image_tokens=ImageTokens("<|image|>", "<|image>", "<image|>", also="<|turn>"),
    processor_checks=(
        ("max_soft_tokens", image_setting("max_soft_tokens")),
        ("patch_size", image_setting("patch_size")),
        ("pooling_kernel_size", image_setting("pooling_kernel_size")),
    ),
    packer=PackerRules(beside=("image_position_ids",), per_token="mm_token_type_ids"),
    # the processor expands <|video|> into each frame's time and tokens between image markers,
    # <|audio|> into a recording's tokens between <|audio> and <audio|>
    media_tokens={"video": ImageTokens("<|video|>"), "audio": ImageTokens("<|audio|>")},
    video_rules=("gemma4",),
    audio_rules=("gemma4",),
)
