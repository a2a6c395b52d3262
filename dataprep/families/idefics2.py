"""Idefics2 (``Idefics2Processor``): each image (or its four quarters and itself) resized
within 378..980 px, 64 resampled tokens a crop between fake tokens."""

from dataprep.families.llava import LLAVA_IMAGE
from dataprep.families.processor_settings import image_setting, processor_attr
from dataprep.families.spec import FamilySpec, PackerRules, policy
from dataprep.policies.idefics2 import Idefics2Policy

SPEC = FamilySpec(
    name="idefics2",
    models="Idefics2",
    policies=("idefics2",),
    policy_specs={
        "idefics2": policy(
            Idefics2Policy,
            ("shortest_edge", "longest_edge", "patch_size", "tokens_per_image"),
            ("split",),
            help="Idefics2: each image resized within 378..980px (split=1: its four quarters\n"
            "and itself), the 14px patches it covers, 64 resampled tokens each\n"
            "options: idefics2:shortest_edge=378,longest_edge=980,split=0",
        )
    },
    template="llava",
    image_tokens=LLAVA_IMAGE,
    processor_checks=(
        ("shortest_edge", image_setting("size", "shortest_edge")),
        ("longest_edge", image_setting("size", "longest_edge")),
        ("tokens_per_image", processor_attr("image_seq_len")),
        ("split", image_setting("do_image_splitting")),
    ),
    packer=PackerRules(nested=True, spelled=True),
)
