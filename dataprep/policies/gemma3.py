"""Gemma 3's images: encoder patches, LLM tokens and the prompt text around them, from image
sizes alone.

What ``Gemma3ImageProcessor`` + ``Gemma3Processor`` (transformers) do with an image, reproduced
from the sizes in its header:

1. Every image is resized to ``image_size`` x ``image_size`` (896): ``(image_size /
   patch_size)^2`` encoder patches (4096), average-pooled to ``llm_tokens`` soft tokens (the
   config's ``mm_tokens_per_image``, 256), written between ``<start_of_image>`` and
   ``<end_of_image>`` with two newlines on either side.
2. With pan-and-scan (the processor call's ``do_pan_and_scan=True``; off by default), an image
   whose longer side is at least ``min_ratio`` times its shorter one is also cut along its
   longer side into ``round(ratio)`` crops (half rounds up), no more than the longer side holds
   ``min_crop_size`` pieces, at least 2 and at most ``max_crops``; none when a crop would be
   narrower than ``min_crop_size``. Each crop is resized and costs as an image of its own.
3. The prompt of an image with crops: ``Here is the original image `` before the image's own
   block, then `` and here are some crops to help you see better `` and the crops' blocks
   joined by spaces (``Gemma3Processor.replace_image_token``).

Spec: ``gemma3[:image_size=896,patch_size=14,llm_tokens=256,pan_and_scan=0,min_crop_size=256,
max_crops=4,min_ratio=1.2]`` (the released models' and the processor's defaults).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from dataprep.policies.base import ImageCost, VisionPolicy

__all__ = ["Gemma3Policy", "gemma3_crops"]

START, END = "\n\n<start_of_image>", "<end_of_image>\n\n"  # the template family's wrapper
BEFORE = "Here is the original image "
BETWEEN = " and here are some crops to help you see better "


def gemma3_crops(
    width: int, height: int, min_crop_size: int, max_crops: int, min_ratio: float
) -> tuple[int, int]:
    """(columns, rows) of pan-and-scan's crops of an image, ``(0, 0)`` where it makes none."""
    long, short = max(width, height), min(width, height)
    if long / short < min_ratio:
        return 0, 0
    n = min(math.floor(long / short + 0.5), math.floor(long / min_crop_size))
    n = min(max(2, n), max_crops)
    cols, rows = (n, 1) if width >= height else (1, n)
    if min(math.ceil(width / cols), math.ceil(height / rows)) < min_crop_size:
        return 0, 0
    return cols, rows


@lru_cache(maxsize=65536)
def _cost(width: int, height: int, policy: Gemma3Policy) -> ImageCost:
    one = (policy.image_size // policy.patch_size) ** 2
    crops = 0
    if policy.pan_and_scan:
        cols, rows = gemma3_crops(
            width, height, policy.min_crop_size, policy.max_crops, policy.min_ratio
        )
        crops = cols * rows
    if not crops:
        return ImageCost((one,), policy.llm_tokens)
    # the template writes the image's own block around its placeholder; the crops' blocks
    # (their soft tokens in llm_tokens) follow, the last one's end is the template's
    after = END + BETWEEN + " ".join([START + END] * crops)[: -len(END)]
    cost = ImageCost((one,) * (1 + crops), policy.llm_tokens * (1 + crops), after=after)
    return replace(cost, before=BEFORE)  # the sentence, before the template's image start


@dataclass(frozen=True, kw_only=True)
class Gemma3Policy(VisionPolicy):
    """Gemma 3: a fixed square resize, ``(image_size / patch_size)^2`` encoder patches pooled
    to ``llm_tokens`` (a square number whose side divides the patch grid's); with
    ``pan_and_scan`` each long image's crops too."""

    image_size: int = 896
    patch_size: int = 14
    llm_tokens: int = 256
    pan_and_scan: bool = False
    min_crop_size: int = 256
    max_crops: int = 4
    min_ratio: float = 1.2

    def __post_init__(self) -> None:
        super().__post_init__()
        side = math.isqrt(self.llm_tokens) if self.llm_tokens > 0 else 0
        grid = self.image_size // self.patch_size if self.patch_size > 0 else 0
        if grid <= 0 or self.image_size % self.patch_size:
            raise ValueError(
                f"gemma3 needs image_size divisible by patch_size, got {self.image_size}/"
                f"{self.patch_size}; the released models use image_size=896,patch_size=14"
            )
        if side < 1 or side * side != self.llm_tokens or grid % side:
            raise ValueError(
                f"gemma3 pools the {grid}x{grid} patch grid to llm_tokens, which must be a square "
                f"whose side divides {grid}, got llm_tokens={self.llm_tokens}; take the model "
                "config's mm_tokens_per_image (256 for the released models)"
            )
        if self.min_crop_size < 1 or self.max_crops < 2 or not self.min_ratio >= 1:
            raise ValueError(
                f"gemma3's pan-and-scan needs min_crop_size >= 1, max_crops >= 2 and min_ratio "
                f">= 1, got {self.min_crop_size}, {self.max_crops}, {self.min_ratio} (the "
                "processor's pan_and_scan_min_crop_size, _max_num_crops and "
                "_min_ratio_to_activate: 256, 4, 1.2 by default)"
            )

    def image_cost(self, width: int, height: int) -> ImageCost:
        return _cost(width, height, self)

    def spec(self) -> str:
        pas = (
            f",pan_and_scan=1,min_crop_size={self.min_crop_size},max_crops={self.max_crops},"
            f"min_ratio={self.min_ratio!r}"
            if self.pan_and_scan
            else ""
        )
        return (
            f"gemma3:image_size={self.image_size},patch_size={self.patch_size},"
            f"llm_tokens={self.llm_tokens}{pas}"
        )
