"""LLaVA-OneVision's ``anyres_max_9`` vision policy: tiles and LLM tokens from image sizes alone.

What ``LlavaOnevisionImageProcessor`` + ``LlavaOnevisionProcessor`` (transformers) and the
LLaVA-OneVision model do with an image, reproduced from the sizes in its header:

* **A sample with one image** is cut "anyres": of the grid resolutions (every ``i x j`` tiles of
  ``tile_size`` px, ``1 <= i, j <= max_grid``, in that order) the one that keeps most of the
  image's pixels when it is scaled to fit, then wastes the least area, is chosen; the image is
  fitted and padded into it and cut into its ``i * j`` tiles, plus one base tile of the whole
  image. Every tile is one encoder sequence of ``(tile_size // patch_size)^2`` patches (SigLIP
  384/14: 729). LLM tokens: the base tile's 729 features, then the grid's features with the
  padding taken off again (the unpadded rows and columns of the ``27 i x 27 j`` feature map),
  pooled down when they exceed ``max_tiles`` tiles' worth by more than 10 %, plus one newline
  embedding per feature row.
* **A sample with several images** has no anyres: each image is padded to a square and is one
  tile; its LLM tokens are the tile's features and one newline.

So an image's cost depends on its sample (:meth:`OneVisionPolicy.sample_costs`).
:class:`LlavaNextPolicy` (LLaVA-NeXT, ``LlavaNextProcessor``) cuts every image anyres, over its
own list of grids, and never pools. OneVision's spec:
``llava-onevision[:tile_size=384,patch_size=14,max_grid=6,max_tiles=9]`` (the released models'
values are the defaults; ``max_grid`` and ``tile_size`` must match the model's
``image_grid_pinpoints``, ``max_tiles`` its ``vision_aspect_ratio``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dataprep.policies.base import ImageCost, VisionPolicy

__all__ = [
    "LLAVA_NEXT_GRIDS",
    "LlavaNextPolicy",
    "OneVisionPolicy",
    "best_resolution",
    "parse_grids",
]

# llava-v1.6's image_grid_pinpoints in tiles (height x width), in their order (ties go first)
LLAVA_NEXT_GRIDS = "1x2.2x1.2x2.3x1.1x3"


def best_resolution(height: int, width: int, grids: tuple) -> tuple[int, int]:
    """The (height, width) of ``grids`` an image is fitted into: most of its pixels kept once
    scaled to fit (never more than it has), then the least area left empty; the first wins ties."""
    best, kept, waste = grids[0], -1, math.inf
    for h, w in grids:
        scale = min(w / width, h / height)
        eff = min(int(width * scale) * int(height * scale), width * height)
        if eff > kept or (eff == kept and h * w - eff < waste):
            best, kept, waste = (h, w), eff, h * w - eff
    return best


@lru_cache(maxsize=64)
def square_grids(tile: int, most: int) -> tuple:
    """LLaVA-OneVision's pinpoints: every ``i x j`` tiles, ``1 <= i, j <= most``, rows first."""
    return tuple((i * tile, j * tile) for i in range(1, most + 1) for j in range(1, most + 1))


@lru_cache(maxsize=65536)
def _anyres_cost(width: int, height: int, tile: int, patch: int, grids: tuple, most: int):
    """One image cut anyres into the best of ``grids`` ((height, width) px) + a base tile; the
    grid's features unpadded, pooled to about ``most`` tiles' worth (``most=0``: never)."""
    big_h, big_w = best_resolution(height, width, grids)
    side = tile // patch
    rows, cols = side * (big_h // tile), side * (big_w // tile)
    # the feature rows / columns that came from padding are cut off again
    if width / height > cols / rows:
        pad = (rows - int(round(height * (cols / width), 7))) // 2
        rows -= 2 * pad
    else:
        pad = (cols - int(round(width * (rows / height), 7))) // 2
        cols -= 2 * pad
    features, newlines = rows * cols, rows
    ratio = math.sqrt(rows * cols / (most * side * side)) if most else 0.0
    if ratio > 1.1:  # pooled down to about ``most`` tiles
        features = int(rows // ratio) * int(cols // ratio)
        newlines = int(rows // ratio)
    tiles = 1 + (big_h // tile) * (big_w // tile)
    return ImageCost((side * side,) * tiles, side * side + features + newlines)


@dataclass(frozen=True, kw_only=True)
class OneVisionPolicy(VisionPolicy):
    tile_size: int = 384
    patch_size: int = 14
    max_grid: int = 6
    max_tiles: int = 9

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patch_size < 1 or self.tile_size < self.patch_size:
            raise ValueError(
                f"llava-onevision needs patch_size >= 1 and tile_size >= patch_size, got "
                f"tile_size={self.tile_size}, patch_size={self.patch_size} (defaults: 384 and 14)"
            )
        if self.max_grid < 1 or self.max_tiles < 1:
            raise ValueError(
                f"llava-onevision needs max_grid >= 1 and max_tiles >= 1, got {self.max_grid} "
                f"and {self.max_tiles} (defaults: 6, the 6x6 pinpoints, and 9, anyres_max_9)"
            )

    @property
    def patches_per_tile(self) -> int:
        return (self.tile_size // self.patch_size) ** 2

    def image_cost(self, width: int, height: int) -> ImageCost:
        """The image alone in its sample (anyres)."""
        grids = square_grids(self.tile_size, self.max_grid)
        return _anyres_cost(width, height, self.tile_size, self.patch_size, grids, self.max_tiles)

    def sample_costs(self, sizes: list[tuple[int, int]]) -> list[ImageCost]:
        if len(sizes) == 1:
            return [self.image_cost(*sizes[0])]
        one = ImageCost((self.patches_per_tile,), self.patches_per_tile + 1)
        return [one] * len(sizes)

    def spec(self) -> str:
        return (
            f"llava-onevision:tile_size={self.tile_size},patch_size={self.patch_size},"
            f"max_grid={self.max_grid},max_tiles={self.max_tiles}"
        )


def parse_grids(text: str) -> tuple[tuple[int, int], ...]:
    """``"1x2.2x1"`` -> ((1, 2), (2, 1)): grids in tiles, height x width, in order."""
    grids = []
    for item in text.split("."):
        h, sep, w = item.partition("x")
        if not sep or not h.isdigit() or not w.isdigit() or int(h) < 1 or int(w) < 1:
            raise ValueError(
                f"bad grids {text!r}: write the model's image_grid_pinpoints in tiles, height x "
                f"width, joined by '.', e.g. {LLAVA_NEXT_GRIDS} (llava-v1.6's [[336, 672], ...] "
                "with 336-px tiles)"
            )
        grids.append((int(h), int(w)))
    return tuple(grids)


@lru_cache(maxsize=64)
def _pinpoints(grids: str, tile: int) -> tuple:
    """Parsed once per spec, not per image."""
    return tuple((h * tile, w * tile) for h, w in parse_grids(grids))


@dataclass(frozen=True, kw_only=True)
class LlavaNextPolicy(VisionPolicy):
    """LLaVA-NeXT (llava-v1.6): every image cut anyres into the best of ``grids`` (its
    ``image_grid_pinpoints`` in tiles) + a base tile, also in a multi-image sample; LLM tokens:
    the base tile's features, the grid's unpadded features and a newline per feature row, never
    pooled. Spec: ``llava-next[:tile_size=336,patch_size=14,grids=1x2.2x1.2x2.3x1.1x3]``."""

    tile_size: int = 336
    patch_size: int = 14
    grids: str = LLAVA_NEXT_GRIDS

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patch_size < 1 or self.tile_size < self.patch_size:
            raise ValueError(
                f"llava-next needs patch_size >= 1 and tile_size >= patch_size, got "
                f"tile_size={self.tile_size}, patch_size={self.patch_size} (defaults: 336 and 14)"
            )
        parse_grids(self.grids)

    @property
    def pinpoints(self) -> tuple:
        """The grids in px, (height, width), as ``image_grid_pinpoints``."""
        return _pinpoints(self.grids, self.tile_size)

    def image_cost(self, width: int, height: int) -> ImageCost:
        return _anyres_cost(width, height, self.tile_size, self.patch_size, self.pinpoints, 0)

    def spec(self) -> str:
        return (
            f"llava-next:tile_size={self.tile_size},patch_size={self.patch_size},grids={self.grids}"
        )
