"""Pixtral's and Mistral 3's vision policy: patches and LLM tokens from image sizes alone.

What ``PixtralImageProcessor`` + ``PixtralProcessor`` (transformers; Mistral 3 ships the same
processor) do with an image, reproduced from the sizes in its header:

1. An image larger than ``longest_edge`` on either side is shrunk by the larger of the two
   ratios, each side floored (a side floored to 0 px is refused by the image processor: a
   rejection here); a smaller image keeps its size (never upscaled).
2. Each side is rounded up to a multiple of ``patch_size * merge_size`` (the processor hands
   the image processor the merged patch).
3. The tower sees ``(h / patch_size) * (w / patch_size)`` patches, all one sequence (its
   attention is block-diagonal per image). The prompt gets a row of ``[IMG]`` tokens per merged
   row, each row closed by ``[IMG_BREAK]``, the last by ``[IMG_END]``: ``rows * (cols + 1)``
   tokens, every one a special token.

Specs: ``pixtral[:longest_edge=1024,patch_size=16,merge_size=1]`` (Pixtral-12B) and
``mistral3`` (Mistral-Small-3.1 / 3.2: ``longest_edge=1540,patch_size=14,merge_size=2``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dataprep.errors import SampleRejected
from dataprep.policies.base import ImageCost, VisionPolicy

__all__ = ["MISTRAL3_DEFAULTS", "PixtralPolicy", "pixtral_resize"]

MISTRAL3_DEFAULTS = {"longest_edge": 1540, "patch_size": 14, "merge_size": 2}


def pixtral_resize(height: int, width: int, longest_edge: int, step: int) -> tuple[int, int]:
    """(height, width) after Pixtral's resize: shrunk to fit ``longest_edge`` (floored), then
    each side rounded up to a multiple of ``step``."""
    ratio = max(height / longest_edge, width / longest_edge)
    if ratio > 1:
        shrunk = math.floor(height / ratio), math.floor(width / ratio)
        if min(shrunk) < 1:  # the image processor refuses a side of 0 px
            raise SampleRejected(
                "aspect_ratio_out_of_range",
                f"{width}x{height}: shrinking it to fit {longest_edge} px leaves a side of 0 px",
            )
        height, width = shrunk
    return ((height - 1) // step + 1) * step, ((width - 1) // step + 1) * step


@lru_cache(maxsize=65536)
def _pixtral_cost(width: int, height: int, longest: int, patch: int, merge: int) -> ImageCost:
    h, w = pixtral_resize(height, width, longest, patch * merge)
    rows, cols = h // (patch * merge), w // (patch * merge)
    return ImageCost(((h // patch) * (w // patch),), rows * (cols + 1))


@dataclass(frozen=True, kw_only=True)
class PixtralPolicy(VisionPolicy):
    longest_edge: int = 1024
    patch_size: int = 16
    merge_size: int = 1
    name: str = "pixtral"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.name not in ("pixtral", "mistral3"):  # the spec name it writes back
            raise ValueError(f"pixtral policy name must be pixtral or mistral3, got {self.name!r}")
        if self.patch_size < 1 or self.merge_size < 1:
            raise ValueError(
                f"{self.name} needs patch_size >= 1 and merge_size >= 1, got {self.patch_size} "
                f"and {self.merge_size} (Pixtral-12B: 16 and 1; Mistral 3: 14 and 2)"
            )
        if self.longest_edge < self.patch_size * self.merge_size:
            raise ValueError(
                f"{self.name} needs longest_edge >= patch_size * merge_size, got "
                f"longest_edge={self.longest_edge}: take size.longest_edge from the checkpoint's "
                "preprocessor_config.json (Pixtral-12B: 1024; Mistral 3: 1540)"
            )

    def image_cost(self, width: int, height: int) -> ImageCost:
        return _pixtral_cost(width, height, self.longest_edge, self.patch_size, self.merge_size)

    def spec(self) -> str:
        return (
            f"{self.name}:longest_edge={self.longest_edge},patch_size={self.patch_size},"
            f"merge_size={self.merge_size}"
        )
