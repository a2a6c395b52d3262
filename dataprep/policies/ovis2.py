"""Ovis2's vision policy: tiles, LLM tokens and the grid markers, from image sizes alone.

What ``Ovis2ImageProcessor`` (``crop_to_patches=True``, as the converted checkpoints
``thisisiron/Ovis2-*-hf`` ship it) + ``Ovis2Processor`` (transformers) do with an image,
reproduced from the sizes in its header:

1. The tile grid: among the grids of 1..``max_tiles`` tiles of ``tile_size`` px, the fewest
   tiles whose cells cover more than 90 % of the image's area (each cell of the image cut into
   that many rows and columns covers its area, shrunk to fit ``tile_size`` along its longer
   side); ties go to the higher covering, and where no grid covers 90 % the highest covering
   wins (Ovis's ``_get_best_grid``). ``covering=0`` picks the closest aspect ratio among
   ``min_tiles..max_tiles`` instead (the processor's ``use_covering_area_grid=False``:
   InternVL's rule, the grids tried in GOT-OCR2's order, which decides between equally close
   grids of one tile count).
   transformers reads the chosen grid's rows as columns, so a wide image is cut into a tall
   grid; the tile count, and so every count here, is the same either way.
2. Every tile, plus the whole image resized to one tile (the thumbnail) when there is more
   than one, is one encoder sequence of ``(tile_size / patch_size)^2`` patches (448/14: 1024),
   merged ``hidden_stride`` x ``hidden_stride`` (padded up to a multiple) into visual tokens
   (256): the ``<IMG_ATOM>`` tokens of the prompt.
3. The prompt spells the image out: ``<IMG_START>``, the thumbnail's (or only tile's) atoms,
   ``<IMG_GRID>``, then each grid tile's atoms with ``<IMG_COL>`` between the tiles of a row and
   ``<IMG_ROW>`` between rows, then ``<IMG_END>``. The policy's
   :attr:`~dataprep.policies.base.ImageCost.text` holds those markers, each tile's atoms an
   ``<image>`` placeholder (special for prep's counter, and not counted); ``llm_tokens`` are the
   atoms.

Spec: ``ovis2[:max_tiles=12,tile_size=448,patch_size=14,hidden_stride=2,covering=1,
min_tiles=1]`` (the image processor's ``max_patches``, ``size``, ``use_covering_area_grid`` and
``min_patches``; the vision config's ``patch_size`` and ``hidden_stride``). Ovis2's chat
template writes ``<image>``, as LLaVA's, which the processor replaces with the text above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dataprep.policies.base import ImageCost, VisionPolicy, closest_aspect_grid, tile_grids
from dataprep.records import IMAGE_PLACEHOLDER

__all__ = ["OVIS2_MARKERS", "Ovis2Policy", "ovis2_covering_grid"]

# Ovis2Processor's start, grid, column, row and end markers (its visual indicator tokens)
OVIS2_MARKERS = ("<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>")


def _covered(left: int, top: int, right: int, bottom: int, side: int) -> float:
    """The area of one cell the tile covers: the cell shrunk to fit ``side`` along its longer
    side (never grown)."""
    long, short = max(right - left, bottom - top), min(right - left, bottom - top)
    if long > side:
        return side * (short / long * side)
    return long * short


@lru_cache(maxsize=65536)
def ovis2_covering_grid(
    width: int, height: int, tile: int, max_tiles: int, threshold: float = 0.9
) -> tuple[int, int]:
    """(a, b): the covering grid, a tiles by b (see the module doc; ``a`` cuts the height in
    the covering, and transformers then takes ``a`` as the number of columns)."""
    scored = []
    for a, b in tile_grids(1, max_tiles, max_tiles):
        row_h, col_w = height // a, width // b
        area = 0.0
        for r in range(a):
            for c in range(b):
                right = width if c == b - 1 else (c + 1) * col_w
                bottom = height if r == a - 1 else (r + 1) * row_h
                area += _covered(c * col_w, r * row_h, right, bottom, tile)
        scored.append(((a, b), area / (width * height)))
    enough = [s for s in scored if s[1] > threshold]
    if enough:  # the fewest tiles, then the most covered (the first of equals)
        return min(enough, key=lambda s: (s[0][0] * s[0][1], -s[1]))[0]
    return min(scored, key=lambda s: (-s[1], s[0][0] * s[0][1]))[0]


@lru_cache(maxsize=4096)
def _cost(rows: int, cols: int, patches: int, tokens: int) -> ImageCost:
    start, grid, col, row, end = OVIS2_MARKERS
    if rows * cols == 1:
        return ImageCost((patches,), tokens, start + IMAGE_PLACEHOLDER + grid + end)
    tiles = (col.join([IMAGE_PLACEHOLDER] * cols) for _ in range(rows))
    text = start + IMAGE_PLACEHOLDER + grid + row.join(tiles) + end
    n = rows * cols + 1  # the thumbnail first
    return ImageCost((patches,) * n, tokens * n, text)


@dataclass(frozen=True, kw_only=True)
class Ovis2Policy(VisionPolicy):
    max_tiles: int = 12
    tile_size: int = 448
    patch_size: int = 14
    hidden_stride: int = 2
    covering: bool = True
    min_tiles: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.min_tiles <= self.max_tiles:
            raise ValueError(
                f"ovis2 needs 1 <= min_tiles <= max_tiles, got {self.min_tiles}..{self.max_tiles}"
                " (the image processor's min_patches and max_patches: 1 and 12)"
            )
        if (
            self.patch_size < 1
            or self.hidden_stride < 1
            or self.tile_size < self.patch_size
            or self.tile_size % self.patch_size
        ):
            raise ValueError(
                f"ovis2 needs tile_size a multiple of patch_size and hidden_stride >= 1, got "
                f"tile_size={self.tile_size}, patch_size={self.patch_size}, hidden_stride="
                f"{self.hidden_stride} (Ovis2: 448, 14 and 2)"
            )

    @property
    def patches_per_tile(self) -> int:
        return (self.tile_size // self.patch_size) ** 2

    @property
    def llm_tokens_per_tile(self) -> int:
        side = self.tile_size // self.patch_size
        return math.ceil(side / self.hidden_stride) ** 2

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, columns) as ``Ovis2Processor`` writes them (``grids``)."""
        if self.max_tiles == 1:  # the processor does not crop then: one tile
            return 1, 1
        if self.covering:
            cols, rows = ovis2_covering_grid(width, height, self.tile_size, self.max_tiles)
        else:
            grids = tile_grids(self.min_tiles, self.max_tiles, self.max_tiles)
            cols, rows = closest_aspect_grid(width, height, grids, self.tile_size)
        return rows, cols

    def image_cost(self, width: int, height: int) -> ImageCost:
        rows, cols = self.grid(width, height)
        return _cost(rows, cols, self.patches_per_tile, self.llm_tokens_per_tile)

    def spec(self) -> str:
        return (
            f"ovis2:max_tiles={self.max_tiles},tile_size={self.tile_size},"
            f"patch_size={self.patch_size},hidden_stride={self.hidden_stride},"
            f"covering={int(self.covering)},min_tiles={self.min_tiles}"
        )
