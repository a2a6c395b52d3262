"""Gemma 4's vision policy: encoder rows and soft tokens from image sizes alone.

What ``Gemma4ImageProcessor`` (transformers) does with an image, reproduced from the sizes in
its header:

1. The image is resized, keeping its aspect ratio, to the largest size whose sides are
   multiples of ``pooling_kernel_size * patch_size`` (3 x 16 = 48 px) and that holds at most
   ``max_soft_tokens * pooling_kernel_size^2`` patches of ``patch_size`` (the "patch budget":
   the image is scaled by ``sqrt(budget * patch^2 / (h * w))``, up or down, and each side
   rounded down to the multiple). A side that rounds to nothing becomes one multiple, the other
   side ``floor(long / short)`` multiples, at most the budget's worth.
2. Its ``(h / patch) x (w / patch)`` patches are flattened in rows and padded to the budget
   (``max_soft_tokens * k^2`` rows, positions ``-1``): the tower attends over every row of the
   padded block, so every image costs the encoder the same ``max_soft_tokens * k^2`` rows.
3. Each ``k x k`` block of patches is average-pooled to one soft token: ``patches / k^2``
   ``<|image|>`` tokens, between ``<|image>`` and ``<image|>`` (the chat template's
   ``<|image|>`` marker is expanded so; :data:`~dataprep.jinja_template.IMAGE_TOKENS`).

Spec: ``gemma4[:max_soft_tokens=280,patch_size=16,pooling_kernel_size=3]``: the image
processor's defaults; ``max_soft_tokens`` is one of 70, 140, 280, 560, 1120 (the image
processor refuses others), the trade of detail for tokens the Gemma 4 model card describes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dataprep.policies.base import ImageCost, VisionPolicy

__all__ = ["GEMMA4_SOFT_TOKENS", "Gemma4Policy", "check_gemma4", "gemma4_cost", "gemma4_resize"]

GEMMA4_SOFT_TOKENS = (70, 140, 280, 560, 1120)  # what the image processor accepts


def gemma4_resize(height: int, width: int, patch: int, budget: int, k: int) -> tuple[int, int]:
    """(height, width) Gemma 4's image processor resizes an image to: the largest multiples of
    ``k * patch`` keeping the aspect ratio within ``budget`` patches (see the module doc)."""
    scale = math.sqrt(budget * patch * patch / (height * width))
    side = k * patch
    h = math.floor(scale * height / side) * side
    w = math.floor(scale * width / side) * side
    longest = (budget // (k * k)) * side
    # both sides cannot floor to nothing: that needs a budget under k * k patches (one block)
    if not h:
        h, w = side, min(math.floor(width / height) * side, longest)
    elif not w:
        h, w = min(math.floor(height / width) * side, longest), side
    return h, w


@lru_cache(maxsize=65536)
def gemma4_cost(width: int, height: int, soft: int, patch: int, k: int) -> ImageCost:
    """One image's (or video frame's) cost: its patch rows padded to the budget of ``soft``
    tokens, and its soft tokens."""
    budget = soft * k * k
    h, w = gemma4_resize(height, width, patch, budget, k)
    patches = (h // patch) * (w // patch)
    return ImageCost((budget,), patches // (k * k))


def check_gemma4(settings, name: str, processor: str, default: int) -> None:
    """Refuse ``settings``' ``max_soft_tokens``, ``patch_size`` and ``pooling_kernel_size``
    where Gemma 4's ``processor`` (image or video) would, naming ``name`` and the fix."""
    if settings.max_soft_tokens not in GEMMA4_SOFT_TOKENS:
        raise ValueError(
            f"{name} needs max_soft_tokens one of {GEMMA4_SOFT_TOKENS}, got "
            f"{settings.max_soft_tokens}: take the {processor} processor's max_soft_tokens from "
            f"the checkpoint's processor_config.json ({default} by default)"
        )
    if settings.patch_size < 1 or settings.pooling_kernel_size < 1:
        raise ValueError(
            f"{name} needs patch_size and pooling_kernel_size >= 1, got {settings.patch_size}, "
            f"{settings.pooling_kernel_size} (the released models: 16 and 3)"
        )


@dataclass(frozen=True, kw_only=True)
class Gemma4Policy(VisionPolicy):
    max_soft_tokens: int = 280
    patch_size: int = 16
    pooling_kernel_size: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        check_gemma4(self, "gemma4", "image", 280)

    def image_cost(self, width: int, height: int) -> ImageCost:
        return gemma4_cost(
            width, height, self.max_soft_tokens, self.patch_size, self.pooling_kernel_size
        )

    def spec(self) -> str:
        return (
            f"gemma4:max_soft_tokens={self.max_soft_tokens},patch_size={self.patch_size},"
            f"pooling_kernel_size={self.pooling_kernel_size}"
        )
