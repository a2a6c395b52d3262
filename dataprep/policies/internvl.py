"""``internvl``: InternVL 1.5/2 ``dynamic_preprocess``. The tile grid (i, j) with min..max tiles
whose aspect ratio is closest to the image's (ties go to the larger grid when the image has more
than half of that grid's area), plus a thumbnail tile when more than one tile; 448 px tiles,
patch 14 (1024 patches per tile), pixel shuffle 0.5 (256 LLM tokens per tile)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

from dataprep.policies.base import ImageCost, VisionPolicy, closest_aspect_grid


def _internvl_target_ratios(min_num: int, max_num: int) -> list[tuple[int, int]]:
    # Same construction and order as the reference: a set of grids sorted (stably) by tile count.
    ratios = {
        (i, j)
        for n in range(min_num, max_num + 1)
        for i in range(1, n + 1)
        for j in range(1, n + 1)
        if min_num <= i * j <= max_num
    }
    return sorted(ratios, key=lambda r: r[0] * r[1])


@lru_cache(maxsize=65536)
def internvl_grid(width: int, height: int, min_num: int, max_num: int, image_size: int) -> tuple:
    """The (columns, rows) tile grid InternVL's ``dynamic_preprocess`` picks for an image."""
    return closest_aspect_grid(width, height, _internvl_target_ratios(min_num, max_num), image_size)


@dataclass(frozen=True, kw_only=True)
class InternVLPolicy(VisionPolicy):
    min_tiles: int = 1
    max_tiles: int = 12
    tile_size: int = 448
    patch_size: int = 14
    downsample_ratio: float = 0.5
    thumbnail: bool = True
    family: ClassVar[str] = "internvl"  # the spec name errors speak of (subclasses: their own)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.min_tiles <= self.max_tiles:
            raise ValueError(
                f"{self.family} needs 1 <= min_tiles <= max_tiles, got {self.min_tiles}..{self.max_tiles}"
            )
        if not 0 < self.downsample_ratio <= 1:
            raise ValueError(
                f"{self.family} needs 0 < downsample_ratio <= 1 (the pixel shuffle's scale, "
                f"0.5 for InternVL), got {self.downsample_ratio}"
            )
        if self.patch_size < 1 or self.tile_size < self.patch_size:
            raise ValueError(
                f"{self.family} needs patch_size >= 1 and tile_size >= patch_size, got tile_size="
                f"{self.tile_size}, patch_size={self.patch_size} (defaults: 448 and 14)"
            )
        if self.tile_size % self.patch_size:
            raise ValueError(f"tile_size {self.tile_size} must be a multiple of {self.patch_size}")
        if (self.tile_size // self.patch_size) % 2:
            raise ValueError(
                f"{self.family}'s 2x2 pixel shuffle needs an even number of patches per tile side; "
                f"tile_size {self.tile_size} / patch_size {self.patch_size} is "
                f"{self.tile_size // self.patch_size}"
            )
        if self.llm_tokens_per_tile < 1:
            raise ValueError(
                f"{self.family}'s downsample_ratio {self.downsample_ratio} leaves no LLM token of "
                f"a tile's {self.patches_per_tile} patches (InternVL's is 0.5)"
            )

    @property
    def patches_per_tile(self) -> int:
        return (self.tile_size // self.patch_size) ** 2

    @property
    def llm_tokens_per_tile(self) -> int:
        return int(self.patches_per_tile * self.downsample_ratio**2)

    def num_tiles(self, width: int, height: int) -> int:
        cols, rows = internvl_grid(width, height, self.min_tiles, self.max_tiles, self.tile_size)
        tiles = cols * rows
        return tiles + 1 if self.thumbnail and tiles != 1 else tiles

    def image_cost(self, width: int, height: int) -> ImageCost:
        tiles = self.num_tiles(width, height)
        return ImageCost((self.patches_per_tile,) * tiles, self.llm_tokens_per_tile * tiles)

    def spec(self) -> str:
        # patch_size only where it is not InternVL's 14, so the specs of existing tables stay
        # as they were; every field the counts depend on is in it (parsed back, the same policy)
        patch = f",patch_size={self.patch_size}" if self.patch_size != 14 else ""
        return (
            f"internvl:min_tiles={self.min_tiles},max_tiles={self.max_tiles},"
            f"tile_size={self.tile_size},thumbnail={int(self.thumbnail)}{patch}"
        )
