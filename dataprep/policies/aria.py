"""Aria's vision policy: crops, padded encoder patches and LLM tokens, from image sizes alone.

What ``AriaImageProcessor`` + ``AriaProcessor`` (transformers) do with an image, reproduced from
the sizes in its header:

1. Without splitting (``split_image=False``, the processor's default) the image is one crop;
   with it (``split=1``), the image is fitted into the best of the split resolutions
   (LLaVA-NeXT's rule: most pixels kept, then least area left empty; the processor's 19
   default grids of 490-px cells, height x width) and cut into ``max_image_size`` squares:
   ``ceil(H / max) * ceil(W / max)`` crops.
2. Every crop is resized so that its longer side is ``max_image_size`` (490 or 980) and padded
   to a square of it (the shorter side no less than ``min_image_size``, which changes no
   count), with a pixel mask: the tower (Idefics3's SigLIP) runs over all
   ``(max_image_size / patch_size)^2`` patches (4900 for 980 / 14), the mask only hiding the
   padding from attention, so that is the encoder cost.
3. The projector's queries give a fixed number of LLM tokens a crop (its
   ``projector_patch_to_query_dict``; the processor's ``size_conversion``: 256 for 980, 128 for
   490): N ``<|img|>`` tokens where the template writes ``<fim_prefix><|img|><fim_suffix>``.

``AriaProcessor`` writes every image of one call as many tokens as the call's image with the
most crops: with splitting, a sample whose images have different crop counts gets more image
tokens than the model makes features (which it refuses). Prep counts each image's own crops,
which is what ``HFPacker(family="aria")`` builds (it processes each image on its own).

Spec: ``aria[:max_image_size=980,split=0,patch_size=14,tokens=0]`` (``max_image_size`` and
``split_image`` as the processor's call runs them: 980 and no splitting unless the call passes
others, whatever the image processor's own attributes; the vision config's ``patch_size``;
``tokens``: the LLM tokens a crop where a model's ``size_conversion`` differs from the
released one, 0 for 128 at 490 px and 256 at 980 px).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dataprep.policies.anyres import best_resolution
from dataprep.policies.base import ImageCost, VisionPolicy

__all__ = ["ARIA_SPLIT_GRIDS", "ARIA_TOKENS", "AriaPolicy"]

# AriaImageProcessor's default split resolutions, in 490-px cells (height x width), its order
ARIA_SPLIT_GRIDS = (
    (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (1, 7), (1, 8), (2, 4), (2, 3), (2, 2), (2, 1),
    (3, 1), (3, 2), (4, 1), (4, 2), (5, 1), (6, 1), (7, 1), (8, 1),
)  # fmt: skip
ARIA_TOKENS = {490: 128, 980: 256}  # AriaProcessor's size_conversion: LLM tokens a crop


@lru_cache(maxsize=65536)
def _crops(width: int, height: int, size: int) -> int:
    grids = tuple((h * 490, w * 490) for h, w in ARIA_SPLIT_GRIDS)
    h, w = best_resolution(height, width, grids)
    return math.ceil(h / size) * math.ceil(w / size)


@dataclass(frozen=True, kw_only=True)
class AriaPolicy(VisionPolicy):
    max_image_size: int = 980
    split: bool = False
    patch_size: int = 14
    tokens: int = 0  # LLM tokens a crop; 0: ARIA_TOKENS[max_image_size]

    def __post_init__(self) -> None:
        super().__post_init__()  # every int option a whole number >= 0 (tokens 0: released)
        if self.max_image_size not in ARIA_TOKENS:
            raise ValueError(
                f"aria needs max_image_size 490 or 980 (what its image processor accepts), got "
                f"{self.max_image_size}"
            )
        if self.patch_size < 1 or self.max_image_size % self.patch_size:
            raise ValueError(
                f"aria needs max_image_size a multiple of patch_size, got {self.max_image_size} "
                f"and {self.patch_size} (Aria: 14)"
            )

    def crops(self, width: int, height: int) -> int:
        return _crops(width, height, self.max_image_size) if self.split else 1

    def image_cost(self, width: int, height: int) -> ImageCost:
        n = self.crops(width, height)
        patches = (self.max_image_size // self.patch_size) ** 2
        return ImageCost((patches,) * n, (self.tokens or ARIA_TOKENS[self.max_image_size]) * n)

    def spec(self) -> str:
        tokens = f",tokens={self.tokens}" if self.tokens else ""  # the released counts: unsaid
        return (
            f"aria:max_image_size={self.max_image_size},split={int(self.split)},"
            f"patch_size={self.patch_size}{tokens}"
        )
