"""DeepSeek-VL's hybrid (7B): two towers on every image, from its size alone.

What ``DeepseekVLHybridImageProcessor`` + ``DeepseekVLHybridProcessor`` (transformers) do with
an image: it is fitted into an ``image_size`` square (384, padded) for the SigLIP tower and into
a ``high_res_size`` square (1024) for the SAM tower; SigLIP's ``(image_size / patch_size)^2``
patches (576) are the image's LLM tokens (the processor's ``num_image_tokens``), SAM's
``(high_res_size / high_res_patch_size)^2`` patches (4096) are a second encoder sequence of
the image (its features are pooled to SigLIP's grid and joined with them). The cost row lists
both sequences of each image, SigLIP's first.

Spec: ``deepseek-vl-hybrid[:image_size=384,patch_size=16,high_res_size=1024,
high_res_patch_size=16]``. Its chat template writes ``<image_placeholder>``, as DeepSeek-VL's:
name the family ``#images=deepseek_vl``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataprep.policies.base import ImageCost, VisionPolicy

__all__ = ["DeepseekHybridPolicy"]


@dataclass(frozen=True, kw_only=True)
class DeepseekHybridPolicy(VisionPolicy):
    image_size: int = 384
    patch_size: int = 16
    high_res_size: int = 1024
    high_res_patch_size: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        for size, patch in (
            (self.image_size, self.patch_size),
            (self.high_res_size, self.high_res_patch_size),
        ):
            if size <= 0 or patch <= 0 or size % patch:
                raise ValueError(
                    f"deepseek-vl-hybrid needs each size divisible by its patch, got {size}/"
                    f"{patch}; DeepSeek-VL 7B: image_size=384,patch_size=16 (SigLIP), "
                    "high_res_size=1024,high_res_patch_size=16 (SAM)"
                )

    def image_cost(self, width: int, height: int) -> ImageCost:
        low = (self.image_size // self.patch_size) ** 2
        high = (self.high_res_size // self.high_res_patch_size) ** 2
        return ImageCost((low, high), low)

    def spec(self) -> str:
        return (
            f"deepseek-vl-hybrid:image_size={self.image_size},patch_size={self.patch_size},"
            f"high_res_size={self.high_res_size},high_res_patch_size={self.high_res_patch_size}"
        )
