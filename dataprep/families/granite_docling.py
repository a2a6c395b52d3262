"""Granite Docling: 512-px page tiles on the closest-aspect grid, SmolVLM's markers."""

from dataprep.families.llava import LLAVA_IMAGE
from dataprep.families.processor_settings import image_setting, processor_attr
from dataprep.families.spec import FamilySpec, PackerRules, policy
from dataprep.policies.granite_docling import GraniteDoclingPolicy

SPEC = FamilySpec(
    name="granite_docling",
    models="Granite Docling",
    policies=("granite-docling",),
    policy_specs={
        "granite-docling": policy(
            GraniteDoclingPolicy,
            (
                "max_tiles",
                "min_tiles",
                "tile_size",
                "patch_size",
                "tokens_per_tile",
                "dense_max_tiles",
            ),
            ("fine", "split"),
            floats=("dense_max_scale", "dense_min_aspect", "dense_max_aspect"),
            help="Granite Docling: 512px page tiles (aspect grid, 1..32) + a thumbnail, 64 tokens\n"
            "each (fine=1: 256), SmolVLM's markers in the prompt\n"
            "options: granite-docling:max_tiles=32,fine=0,split=1 and the spread rule's\n"
            "dense_max_tiles=64,dense_max_scale=0.8,dense_min_aspect=1.2,dense_max_aspect=0",
        )
    },
    template="llava",
    image_tokens=LLAVA_IMAGE,
    processor_checks=(
        ("min_tiles", image_setting("min_patches")),
        ("max_tiles", image_setting("max_patches")),
        ("split", image_setting("crop_to_patches")),
        ("tile_size", image_setting("size", "height")),
        ("tokens_per_tile", processor_attr("image_seq_len")),
        ("fine", image_setting("fine_route")),
        ("dense_max_tiles", image_setting("dense_max_patches")),
        ("dense_max_scale", image_setting("dense_max_scale")),
        ("dense_min_aspect", image_setting("dense_min_aspect")),
        ("dense_max_aspect", image_setting("dense_max_aspect")),
    ),
    packer=PackerRules(nested=True, tiles=True, spelled=True),
)
