"""SmolVLM's and Idefics3's image splitting: tiles, LLM tokens and the prompt text around them,
from image sizes alone.

What ``SmolVLMImageProcessor`` / ``Idefics3ImageProcessor`` + their processors (transformers)
do with an image, reproduced from the sizes in its header:

1. The longest side is scaled to ``longest_edge`` (up or down), the other keeping the aspect
   ratio (truncated, then made even); no side above 4096.
2. With splitting on, both sides are rounded up to multiples of ``tile`` (the longer side first,
   the other from the aspect ratio, truncated, then rounded up). An image larger than one tile is
   cut into its ``rows x cols`` tiles plus one global tile (the whole image resized to a tile);
   otherwise it is one tile. Without splitting every image is one tile.
3. Every tile is one encoder sequence of ``(tile // patch_size)^2`` patches (384/14: 729) and
   ``tokens_per_tile`` LLM tokens (after the pixel shuffle). The prompt wraps them:
   ``<fake_token_around_image><row_r_col_c>`` before each split tile, a newline after each row,
   then ``\\n<fake_token_around_image><global-img>`` before the global tile and
   ``<fake_token_around_image>`` after it; a single tile is ``<fake_token_around_image>
   <global-img>`` ... ``<fake_token_around_image>``. That text is counted with the tokenizer
   (:attr:`~dataprep.policies.base.ImageCost.text`), the image tokens from the policy.

Specs: ``smolvlm[:longest_edge=1536,tile=384,patch_size=14,tokens_per_tile=81,split=1]`` (the
defaults are SmolVLM-Instruct's; SmolVLM-256M/500M and SmolVLM2: ``longest_edge=2048,tile=512,
patch_size=16,tokens_per_tile=64``) and ``idefics3`` (Idefics3-8B: 1456, 364, 14, 169).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dataprep.policies.base import ImageCost, VisionPolicy

__all__ = ["IDEFICS3_DEFAULTS", "SmolVLMPolicy", "smolvlm_grid"]

MAX_SIDE = 4096  # the image processors' upper bound on either side
IDEFICS3_DEFAULTS = {"longest_edge": 1456, "tile": 364, "patch_size": 14, "tokens_per_tile": 169}
FAKE, GLOBAL = "<fake_token_around_image>", "<global-img>"


def _scaled(height: int, width: int, longest: int) -> tuple[int, int]:
    """Step 1: the longest side to ``longest``, then both sides within :data:`MAX_SIDE`."""
    ratio = width / height
    if width >= height:
        width, height = longest, int(longest / ratio)
        height += height % 2
    else:
        height, width = longest, int(longest * ratio)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    ratio = width / height
    if width >= height and width > MAX_SIDE:
        width, height = MAX_SIDE, int(MAX_SIDE / ratio)
    elif height > width and height > MAX_SIDE:
        height, width = MAX_SIDE, int(MAX_SIDE * ratio)
    return max(height, 1), max(width, 1)


@lru_cache(maxsize=65536)
def smolvlm_grid(width: int, height: int, longest: int, tile: int) -> tuple[int, int]:
    """(rows, cols) of split tiles for an image of ``width x height``; (0, 0): one tile."""
    height, width = _scaled(height, width, longest)
    ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * ratio) / tile) * tile
    if height > tile or width > tile:
        return (height - tile) // tile + 1, (width - tile) // tile + 1
    return 0, 0


@lru_cache(maxsize=4096)
def _cost(rows: int, cols: int, patches: int, tokens: int) -> ImageCost:
    """An image of ``rows x cols`` split tiles (0 x 0: one tile) and its prompt text."""
    tiles = rows * cols + 1
    if rows:
        text = "".join(
            "".join(f"{FAKE}<row_{r + 1}_col_{c + 1}>" for c in range(cols)) + "\n"
            for r in range(rows)
        )
        text += f"\n{FAKE}{GLOBAL}{FAKE}"
    else:
        text = f"{FAKE}{GLOBAL}{FAKE}"
    return ImageCost((patches,) * tiles, tokens * tiles, text)


@dataclass(frozen=True, kw_only=True)
class SmolVLMPolicy(VisionPolicy):
    longest_edge: int = 1536
    tile: int = 384
    patch_size: int = 14
    tokens_per_tile: int = 81
    split: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patch_size < 1 or self.tile < self.patch_size:
            raise ValueError(
                f"smolvlm needs patch_size >= 1 and tile >= patch_size, got tile={self.tile}, "
                f"patch_size={self.patch_size} (SmolVLM-Instruct: 384 and 14; the image "
                "processor's max_image_size and the vision config's patch_size)"
            )
        if self.longest_edge < 1 or self.tokens_per_tile < 1:
            raise ValueError(
                f"smolvlm needs longest_edge >= 1 and tokens_per_tile >= 1, got "
                f"{self.longest_edge} and {self.tokens_per_tile} (the image processor's size "
                "and the processor's image_seq_len)"
            )

    def image_cost(self, width: int, height: int) -> ImageCost:
        rows, cols = (
            smolvlm_grid(width, height, self.longest_edge, self.tile) if self.split else (0, 0)
        )
        side = self.tile // self.patch_size
        return _cost(rows, cols, side * side, self.tokens_per_tile)

    def spec(self) -> str:
        return (
            f"smolvlm:longest_edge={self.longest_edge},tile={self.tile},"
            f"patch_size={self.patch_size},tokens_per_tile={self.tokens_per_tile},"
            f"split={int(self.split)}"
        )
