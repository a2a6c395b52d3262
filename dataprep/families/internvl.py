"""InternVL 1.5 to 3: dynamic tiling of 448-px tiles, 256 LLM tokens a tile."""

from dataprep.families.processor_settings import SEQ_LEN_CHECKS, TILER_CHECKS
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules, policy
from dataprep.policies.internvl import InternVLPolicy

SPEC = FamilySpec(
    name="internvl",
    models="InternVL",
    policies=("internvl",),
    policy_specs={
        "internvl": policy(
            InternVLPolicy,
            ("min_tiles", "max_tiles", "tile_size", "patch_size"),
            ("thumbnail",),
            help="InternVL dynamic tiling, 448px tiles, 256 LLM tokens per tile\n"
            "options: internvl:min_tiles=1,max_tiles=12,thumbnail=1",
        )
    },
    template="internvl",
    image_tokens=ImageTokens("<IMG_CONTEXT>", "<img>", "</img>"),
    processor_checks=(*TILER_CHECKS, *SEQ_LEN_CHECKS),
    # its videos built (hf.frame_videos, the transformers source): each frame a tile, among the
    # images' tiles in pixel_values, as its processor merges them
    packer=PackerRules(videos=True, videos_with_images=True),
    # its processor replaces <video> with "Frame{i}: <img>...</img>" a frame
    media_tokens={"video": ImageTokens("<video>")},
    video_rules=("internvl",),
)
