"""LLaVA-OneVision: anyres_max_9 for a sample's only image, a tile each for several."""

import math
import re

from dataprep.families.llava import LLAVA_IMAGE
from dataprep.families.processor_settings import image_setting, pinpoints, processor_attr
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules, policy
from dataprep.policies.anyres import OneVisionPolicy, square_grids


def _max_grid(packer):
    """LLaVA-OneVision's pinpoints as the policy's ``max_grid`` (every i x j tiles up to it)."""
    pins, tile = pinpoints(packer), image_setting("size", "height")(packer)
    if pins is None or not tile:
        return None
    most = math.isqrt(len(pins))
    return most if pins == square_grids(tile, most) else f"{len(pins)} other pinpoints"


def _max_tiles(packer):
    """LLaVA-OneVision's ``vision_aspect_ratio`` (``anyres_max_9``) as the policy's max_tiles."""
    ratio = processor_attr("vision_aspect_ratio")(packer)
    if ratio is None:
        return None
    match = re.fullmatch(r"anyres_max_(\d+)", str(ratio))
    return int(match.group(1)) if match else str(ratio)


def _tokens(packer):
    proc = getattr(packer, "processor", None)
    n = getattr(proc, "num_image_tokens", None)
    if n is None:
        return None
    return n - (getattr(proc, "vision_feature_select_strategy", None) == "default")


SPEC = FamilySpec(
    name="llava_onevision",
    models="LLaVA-OneVision",
    policies=("llava-onevision",),
    policy_specs={
        "llava-onevision": policy(
            OneVisionPolicy,
            ("tile_size", "patch_size", "max_grid", "max_tiles"),
            help="LLaVA-OneVision anyres_max_9: 384px tiles (729 patches), a sample's only image\n"
            "on the best 1x1..6x6 grid + a base tile, several images one tile each\n"
            "options: llava-onevision:max_grid=6,max_tiles=9",
        )
    },
    template="llava",
    image_tokens=LLAVA_IMAGE,
    processor_checks=(
        ("tile_size", image_setting("size", "height")),
        ("max_grid", _max_grid),
        ("max_tiles", _max_tiles),
        ("tokens per tile", _tokens, lambda p: p.patches_per_tile),
    ),
    # its videos built (hf.frame_videos): each frame a tile of its tower
    packer=PackerRules(nested=True, spelled=True, beside=("image_sizes",), videos=True),
    media_tokens={"video": ImageTokens("<video>")},  # the processor repeats it per token
    video_rules=("llava-onevision",),
)
