"""Mistral 3 and Pixtral (``PixtralProcessor``): the longest edge fitted, rows of image tokens
each closed by a break."""

from dataprep.families.processor_settings import image_setting, processor_attr
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules, policy
from dataprep.policies.pixtral import MISTRAL3_DEFAULTS, PixtralPolicy

_OPTIONS = ("longest_edge", "patch_size", "merge_size")

SPEC = FamilySpec(
    name="mistral3",
    models="Mistral 3, Pixtral",
    policies=("mistral3", "pixtral"),
    policy_specs={
        "mistral3": policy(
            PixtralPolicy,
            _OPTIONS,
            defaults=MISTRAL3_DEFAULTS,
            fixed={"name": "mistral3"},
            help="Mistral 3: longest side to 1540, 14px patches merged 2x2, a row break token\n"
            "per row\noptions: mistral3:longest_edge=1540,patch_size=14,merge_size=2",
        ),
        "pixtral": policy(
            PixtralPolicy,
            _OPTIONS,
            fixed={"name": "pixtral"},
            help="Pixtral-12B: the same with 1024 / 16 / no merge",
        ),
    },
    template="mistral3",
    image_tokens=ImageTokens("[IMG]"),
    processor_checks=(
        ("longest_edge", image_setting("size", "longest_edge")),
        ("patch_size", image_setting("patch_size", "height")),
        ("merge_size", processor_attr("spatial_merge_size")),
    ),
    packer=PackerRules(spelled=True, beside=("image_sizes",)),
)
