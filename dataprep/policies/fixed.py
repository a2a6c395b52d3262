"""``fixed:S/P``: every image resized to S x S, (S/P)^2 patches, one LLM token per patch
(LLaVA-1.5: ``fixed:336/14``)."""

from __future__ import annotations

from dataclasses import dataclass

from dataprep.policies.base import ImageCost, VisionPolicy


@dataclass(frozen=True, kw_only=True)
class FixedPolicy(VisionPolicy):
    image_size: int = 336
    patch_size: int = 14

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.image_size <= 0 or self.patch_size <= 0 or self.image_size % self.patch_size:
            raise ValueError(
                f"fixed policy needs image_size divisible by patch_size, got "
                f"{self.image_size}/{self.patch_size}; use e.g. 'fixed:336/14'"
            )

    def image_cost(self, width: int, height: int) -> ImageCost:
        n = (self.image_size // self.patch_size) ** 2
        return ImageCost((n,), n)

    def spec(self) -> str:
        return f"fixed:{self.image_size}/{self.patch_size}"
