"""LLaVA-NeXT (llava-v1.6) and LLaVA-NeXT-Video: anyres for every image over the model's own
grids, never pooled; a video's frames pooled 2 x 2."""

from dataprep.families.llava import LLAVA_IMAGE
from dataprep.families.processor_settings import image_setting, llava_tokens, pinpoints
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules, policy
from dataprep.policies.anyres import LlavaNextPolicy


def _grids(packer):
    """LLaVA-NeXT's ``image_grid_pinpoints`` in tiles of its crop size, as the policy's grids
    (``"1x2.2x1"``); pinpoints that are no whole tiles are written in px."""
    pins, tile = pinpoints(packer), image_setting("crop_size", "height")(packer)
    if pins is None or not tile:
        return None
    if any(h % tile or w % tile for h, w in pins):
        return "px " + ".".join(f"{h}x{w}" for h, w in pins)
    return ".".join(f"{h // tile}x{w // tile}" for h, w in pins)


SPEC = FamilySpec(
    name="llava_next",
    models="LLaVA-NeXT, LLaVA-NeXT-Video",
    policies=("llava-next",),
    policy_specs={
        "llava-next": policy(
            LlavaNextPolicy,
            ("tile_size", "patch_size"),
            strings={"grids": ()},
            help="LLaVA-NeXT (llava-v1.6): every image on the best of the model's grids of 336px\n"
            "tiles + a base tile, never pooled\n"
            "options: llava-next:grids=1x2.2x1.2x2.3x1.1x3 (image_grid_pinpoints in tiles)",
        )
    },
    template="llava",
    image_tokens=LLAVA_IMAGE,
    processor_checks=(
        ("tile_size", image_setting("crop_size", "height")),
        ("tile_size (size)", image_setting("size", "shortest_edge"), lambda p: p.tile_size),
        ("grids", _grids),
        (
            "tokens per tile",
            lambda pk: llava_tokens(pk, image_setting("crop_size", "height")(pk)),
            lambda p: (p.tile_size // p.patch_size) ** 2,
        ),
    ),
    # one image at a time: its processor pads a call's images to the most tiles
    packer=PackerRules(
        one_image_per_call=("pixel_values", "image_sizes"),
        beside=("image_sizes",),
        videos=True,  # LLaVA-NeXT-Video's (hf.frame_videos): each frame a tile of its tower
    ),
    # LLaVA-NeXT-Video: the same images; its template writes a video as <video>
    media_tokens={"video": ImageTokens("<video>")},
    video_rules=("llava-next-video",),
)
