"""Aya Vision 8B / 32B (``AyaVisionProcessor``): InternVL's tiling with 364-px tiles."""

from dataprep.families.llava import LLAVA_IMAGE
from dataprep.families.processor_settings import TILER_CHECKS, processor_attr
from dataprep.families.spec import FamilySpec, PackerRules, policy
from dataprep.policies.aya import AyaVisionPolicy


def _tokens(packer):
    """Aya Vision's tokens a tile: ``(img_size / (patch_size * downsample))^2``."""
    size, patch = processor_attr("img_size")(packer), processor_attr("patch_size")(packer)
    return (size // patch) ** 2 if size and patch else None


SPEC = FamilySpec(
    name="aya_vision",
    models="Aya Vision",
    policies=("aya-vision",),
    policy_specs={
        "aya-vision": policy(
            AyaVisionPolicy,
            ("min_tiles", "max_tiles", "tile_size", "patch_size"),
            help="Aya Vision: InternVL's tiling with 364px tiles (676 patches, 169 tokens each),\n"
            "TILE_k markers in the prompt\n"
            "options: aya-vision:min_tiles=1,max_tiles=12,tile_size=364",
        )
    },
    template="llava",
    image_tokens=LLAVA_IMAGE,
    processor_checks=(*TILER_CHECKS, ("tokens per tile", _tokens, lambda p: p.llm_tokens_per_tile)),
    packer=PackerRules(spelled=True),
)
