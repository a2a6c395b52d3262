"""``qwen2vl`` / ``qwen3vl`` / ``ernie45vl``: Qwen2-VL's ``smart_resize``.

Height and width are rounded to multiples of 28 keeping the pixel count within
[min_pixels, max_pixels]; patches of 14; 2x2 merge for LLM tokens. Two published forms differ
for small and extreme-aspect images (10x500 px: 60 patches against 72): ``resize=transformers``
(default) is the Qwen2-VL image processor of ``transformers`` (``Qwen2VLProcessor``:
LLaMA-Factory, TRL, ms-swift and other trainers built on HF processors);
``resize=qwen-vl-utils`` is ``qwen_vl_utils.fetch_image``, which rounds each side to at least
28 px first (the Qwen2-VL / Qwen2.5-VL repositories' own fine-tuning code and vLLM-style
pipelines that call ``process_vision_info``). Pick the one your training data loader runs.
``qwen3vl`` is the same resize with Qwen3-VL's 16-px patches and pixel bounds, ``ernie45vl``
with ERNIE 4.5-VL's pixel bounds (its image processor is Qwen2-VL's under another name)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dataprep.errors import SampleRejected
from dataprep.policies.base import ImageCost, VisionPolicy

QWEN2VL_RESIZE = ("transformers", "qwen-vl-utils")


def qwen2vl_smart_resize(
    height: int,
    width: int,
    factor: int = 28,
    min_pixels: int = 56 * 56,
    max_pixels: int = 28 * 28 * 1280,
    resize: str = "transformers",
) -> tuple[int, int]:
    """Qwen2-VL's ``smart_resize``: (height, width) after resizing, multiples of ``factor``.

    ``resize="transformers"``: the transformers image processor's form (a side may round to 0
    before the min_pixels branch scales it up; a shrunk side is kept >= ``factor``).
    ``resize="qwen-vl-utils"``: qwen-vl-utils' form (each side first rounded to >= ``factor``;
    a shrunk side is floored without that clamp).
    """
    if resize not in QWEN2VL_RESIZE:
        raise ValueError(f"resize must be one of {', '.join(QWEN2VL_RESIZE)}, got {resize!r}")
    if max(height, width) / min(height, width) > 200:
        raise SampleRejected(
            "aspect_ratio_out_of_range",
            f"{width}x{height}: qwen2vl accepts aspect ratios up to 200",
        )
    utils = resize == "qwen-vl-utils"
    floor = factor if utils else 0
    h_bar = max(floor, round(height / factor) * factor)
    w_bar = max(floor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
        if not utils:
            h_bar, w_bar = max(factor, h_bar), max(factor, w_bar)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@lru_cache(maxsize=65536)
def _qwen2vl_cost(
    width: int, height: int, min_px: int, max_px: int, patch: int, merge: int, resize: str
) -> ImageCost:
    h, w = qwen2vl_smart_resize(height, width, patch * merge, min_px, max_px, resize)
    patches = (h // patch) * (w // patch)
    return ImageCost((patches,), patches // (merge * merge))


@dataclass(frozen=True, kw_only=True)
class Qwen2VLPolicy(VisionPolicy):
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    merge_size: int = 2
    resize: str = "transformers"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.resize not in QWEN2VL_RESIZE:
            raise ValueError(
                f"qwen2vl resize must be one of {', '.join(QWEN2VL_RESIZE)}, got {self.resize!r}: "
                "'transformers' as Qwen2VLProcessor resizes, 'qwen-vl-utils' as fetch_image does"
            )
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"qwen2vl needs 0 < min_pixels <= max_pixels, got {self.min_pixels}, {self.max_pixels}"
            )
        if self.patch_size < 1 or self.merge_size < 1:
            raise ValueError(
                f"qwen2vl needs patch_size >= 1 and merge_size >= 1, got {self.patch_size} and "
                f"{self.merge_size} (defaults: 14 and 2)"
            )

    def image_cost(self, width: int, height: int) -> ImageCost:
        return _qwen2vl_cost(
            width,
            height,
            self.min_pixels,
            self.max_pixels,
            self.patch_size,
            self.merge_size,
            self.resize,
        )

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(height, width) the image is resized to before cutting patches."""
        factor = self.patch_size * self.merge_size
        return qwen2vl_smart_resize(
            height, width, factor, self.min_pixels, self.max_pixels, self.resize
        )

    def spec(self) -> str:
        return (
            f"qwen2vl:min_pixels={self.min_pixels},max_pixels={self.max_pixels},"
            f"patch_size={self.patch_size},merge_size={self.merge_size},resize={self.resize}"
        )


# ERNIE 4.5-VL: its image processor is Qwen2-VL's (transformers' smart resize, patch 14, 2x2
# merge) with its own pixel bounds (size: shortest_edge 3136, longest_edge 28 * 28 * 6177)
ERNIE45VL_DEFAULTS = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 6177}


# Qwen3-VL: Qwen2-VL's smart resize with 16-px patches (multiples of 32) and the pixel bounds of
# its released image processor (size: shortest_edge 65536, longest_edge 16777216)
QWEN3VL_DEFAULTS = {"patch_size": 16, "min_pixels": 65536, "max_pixels": 16777216}
