"""Ovis2 (``Ovis2Processor``): the fewest 448-px tiles covering 90 % of the image."""

from dataprep.families.llava import LLAVA_IMAGE
from dataprep.families.processor_settings import SEQ_LEN_CHECKS, TILER_CHECKS
from dataprep.families.spec import FamilySpec, PackerRules, policy
from dataprep.policies.ovis2 import Ovis2Policy

SPEC = FamilySpec(
    name="ovis2",
    models="Ovis2",
    policies=("ovis2",),
    policy_specs={
        "ovis2": policy(
            Ovis2Policy,
            ("max_tiles", "tile_size", "patch_size", "hidden_stride", "min_tiles"),
            ("covering",),
            help="Ovis2: the fewest 448px tiles covering 90% of the image + a thumbnail, 256\n"
            "tokens each, grid markers in the prompt\n"
            "options: ovis2:max_tiles=12,tile_size=448,covering=1",
        )
    },
    template="llava",
    image_tokens=LLAVA_IMAGE,
    processor_checks=(*TILER_CHECKS, *SEQ_LEN_CHECKS),
    packer=PackerRules(spelled=True),
)
