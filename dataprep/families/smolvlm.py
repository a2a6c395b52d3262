"""SmolVLM and Idefics3: the longest side resized, tiles plus a global tile, tile markers."""

from dataprep.families.llava import LLAVA_IMAGE
from dataprep.families.processor_settings import image_setting, processor_attr
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules, policy
from dataprep.policies.smolvlm import IDEFICS3_DEFAULTS, SmolVLMPolicy

_OPTIONS = ("longest_edge", "tile", "patch_size", "tokens_per_tile")

SPEC = FamilySpec(
    name="smolvlm",
    models="SmolVLM, Idefics3",
    policies=("smolvlm", "idefics3"),
    policy_specs={
        "smolvlm": policy(
            SmolVLMPolicy,
            _OPTIONS,
            ("split",),
            help="SmolVLM: longest side to 1536, 384px tiles + a global tile, 81 tokens each\n"
            "options: smolvlm:longest_edge=2048,tile=512,patch_size=16,tokens_per_tile=64",
        ),
        "idefics3": policy(
            SmolVLMPolicy,
            _OPTIONS,
            ("split",),
            defaults=IDEFICS3_DEFAULTS,
            help="the same with Idefics3-8B's 1456 / 364 / 169",
        ),
    },
    template="llava",
    image_tokens=LLAVA_IMAGE,
    processor_checks=(
        ("longest_edge", image_setting("size", "longest_edge")),
        ("tile", image_setting("max_image_size", "longest_edge")),
        ("tokens_per_tile", processor_attr("image_seq_len")),
        ("split", image_setting("do_image_splitting")),
    ),
    packer=PackerRules(nested=True, tiles=True, spelled=True),
    media_tokens={"video": ImageTokens("<video>")},  # SmolVLM2's template writes <video>
    video_rules=("smolvlm",),
    video_policies=("smolvlm",),  # SmolVLM2 takes videos; Idefics3 has no video processor
)
