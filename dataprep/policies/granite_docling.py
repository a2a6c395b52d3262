"""Granite Docling's vision policy: page tiles, LLM tokens and the tile markers, from sizes alone.

What ``GraniteDoclingImageProcessor`` + ``GraniteDoclingProcessor`` (transformers) do with a
page, reproduced from the sizes in its header:

1. The tile grid: among the grids of ``min_tiles..max_tiles`` tiles of ``tile_size`` px (512)
   with at most 16 tiles a side (the tokenizer's ``<row_i_col_j>`` markers stop at 16), the one
   whose aspect ratio is closest to the page's; where two are equally close, the later (more
   tiles) wins while the page has more than half its area (InternVL's rule). More than one
   tile adds the whole page resized to one tile (the thumbnail). ``split=0``
   (``crop_to_patches=False``): one tile.
2. Every tile is one encoder sequence of ``(tile_size / patch_size)^2`` patches (1024), its
   connector's ``tokens_per_tile`` LLM tokens (the processor's ``image_seq_len``, 64), four times
   as many on the fine path (``fine=1``: the processor's ``fine_route``).
3. The prompt spells the page out, SmolVLM's way: ``<fake_token_around_image><row_r_col_c>``
   before each tile's tokens, a newline after each row of tiles, then (more than one tile)
   ``\\n<fake_token_around_image><global-img>``, the thumbnail's tokens and
   ``<fake_token_around_image>``. A one-tile page is ``<fake_token_around_image><row_1_col_1>``,
   its tokens and a newline, which joins the template's text after the image: that newline is
   the policy's :attr:`~dataprep.policies.base.ImageCost.after`, the rest its ``text`` (each
   tile's tokens an ``<image>`` placeholder there, not counted).

4. The spread rule (the image processor's ``dense_max_patches``, off by default): a page whose
   ``max_tiles`` grid leaves it under-resolved (the grid's width in pixels below
   ``dense_max_scale`` times the page's) and whose width/height ratio is above
   ``dense_min_aspect`` (and at most ``dense_max_aspect`` where set) takes its grid among up
   to ``dense_max_tiles`` tiles instead (newspaper spreads, wide scans); a test whose
   threshold is 0 is skipped, and with both of the first two 0 the rule is off.

Spec: ``granite-docling[:max_tiles=32,min_tiles=1,tile_size=512,patch_size=16,
tokens_per_tile=64,fine=0,split=1,dense_max_tiles=0,dense_max_scale=0,dense_min_aspect=0,
dense_max_aspect=0]``. Its chat template writes ``<image>``, as LLaVA's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from dataprep.policies.base import ImageCost, VisionPolicy, closest_aspect_grid, tile_grids
from dataprep.records import IMAGE_PLACEHOLDER

__all__ = ["GraniteDoclingPolicy", "granite_docling_grid"]

FAKE, GLOBAL = "<fake_token_around_image>", "<global-img>"
MAX_SIDE = 16  # tiles a side: the tokenizer's <row_i_col_j> markers


@lru_cache(maxsize=65536)
def granite_docling_grid(
    width: int, height: int, min_tiles: int, max_tiles: int, tile: int
) -> tuple[int, int]:
    """The (columns, rows) grid of a page (see the module doc)."""
    grids = tile_grids(min_tiles, max_tiles, min(max_tiles, MAX_SIDE))
    return closest_aspect_grid(width, height, grids, tile)


@lru_cache(maxsize=4096)
def _cost(rows: int, cols: int, patches: int, tokens: int) -> ImageCost:
    if rows * cols == 1:  # the tile's tokens (the template's placeholder), then its newline
        return ImageCost((patches,), tokens, f"{FAKE}<row_1_col_1>", "\n")
    grid = "".join(
        "".join(f"{FAKE}<row_{r + 1}_col_{c + 1}>{IMAGE_PLACEHOLDER}" for c in range(cols)) + "\n"
        for r in range(rows)
    )
    n = rows * cols + 1  # the thumbnail last: the template's placeholder
    return ImageCost((patches,) * n, tokens * n, f"{grid}\n{FAKE}{GLOBAL}", FAKE)


@dataclass(frozen=True, kw_only=True)
class GraniteDoclingPolicy(VisionPolicy):
    max_tiles: int = 32
    min_tiles: int = 1
    tile_size: int = 512
    patch_size: int = 16
    tokens_per_tile: int = 64
    fine: bool = False
    split: bool = True
    dense_max_tiles: int = 0
    dense_max_scale: float = 0.0
    dense_min_aspect: float = 0.0
    dense_max_aspect: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.min_tiles <= self.max_tiles:
            raise ValueError(
                f"granite-docling needs 1 <= min_tiles <= max_tiles, got {self.min_tiles}.."
                f"{self.max_tiles} (the image processor's min_patches and max_patches: 1 and 32)"
            )
        if (
            self.patch_size < 1
            or self.tile_size < self.patch_size
            or self.tile_size % self.patch_size
            or self.tokens_per_tile < 1
        ):
            raise ValueError(
                f"granite-docling needs tile_size a multiple of patch_size and tokens_per_tile "
                f">= 1, got {self.tile_size}, {self.patch_size}, {self.tokens_per_tile} "
                "(Granite Docling 258M: 512, 16 and the processor's image_seq_len, 64)"
            )
        dense = (self.dense_max_scale, self.dense_min_aspect, self.dense_max_aspect)
        if self.dense_max_tiles < 0 or 0 < self.dense_max_tiles < self.min_tiles or min(dense) < 0:
            raise ValueError(
                f"granite-docling's spread rule needs dense_max_tiles 0 (off) or >= min_tiles "
                f"and thresholds >= 0, got {self.dense_max_tiles} and {dense} (the image "
                "processor's dense_max_patches, dense_max_scale, dense_min_aspect, "
                "dense_max_aspect)"
            )

    def budget(self, width: int, height: int) -> int:
        """The most tiles the page may take: ``dense_max_tiles`` where the spread rule selects
        it (step 4 of the module doc), else ``max_tiles``."""
        off = self.dense_max_scale <= 0 and self.dense_min_aspect <= 0
        if not self.dense_max_tiles or off or width <= 0 or height <= 0:
            return self.max_tiles
        aspect = width / height
        if self.dense_min_aspect > 0 and not aspect > self.dense_min_aspect:
            return self.max_tiles
        if self.dense_max_aspect > 0 and aspect > self.dense_max_aspect:
            return self.max_tiles
        if self.dense_max_scale > 0:
            cols, _ = granite_docling_grid(
                width, height, self.min_tiles, self.max_tiles, self.tile_size
            )
            if not cols * self.tile_size / width < self.dense_max_scale:
                return self.max_tiles
        return self.dense_max_tiles

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, columns) of the page's tiles."""
        if not self.split or self.max_tiles <= 1 or (budget := self.budget(width, height)) <= 1:
            return 1, 1
        cols, rows = granite_docling_grid(width, height, self.min_tiles, budget, self.tile_size)
        return rows, cols

    def image_cost(self, width: int, height: int) -> ImageCost:
        rows, cols = self.grid(width, height)
        tokens = self.tokens_per_tile * (4 if self.fine else 1)
        return _cost(rows, cols, (self.tile_size // self.patch_size) ** 2, tokens)

    def spec(self) -> str:
        dense = (self.dense_max_scale, self.dense_min_aspect, self.dense_max_aspect)
        rule = (
            f",dense_max_tiles={self.dense_max_tiles},dense_max_scale={dense[0]!r},"
            f"dense_min_aspect={dense[1]!r},dense_max_aspect={dense[2]!r}"
            if self.dense_max_tiles or any(dense)
            else ""
        )
        return (
            f"granite-docling:max_tiles={self.max_tiles},min_tiles={self.min_tiles},"
            f"tile_size={self.tile_size},patch_size={self.patch_size},"
            f"tokens_per_tile={self.tokens_per_tile},fine={int(self.fine)},split={int(self.split)}"
            + rule
        )
