"""GLM-4.1V / GLM-4.5V / GLM-4.6V's vision policy: patches and LLM tokens from image sizes alone.

What ``Glm4vImageProcessor`` (transformers; GLM-4.6V's ``Glm46VImageProcessor`` is the same)
does with an image, reproduced from the sizes in its header. Its ``smart_resize`` is Qwen2-VL's
with three differences that change counts:

1. A side shorter than ``factor`` (``patch_size * merge_size``, 28) first scales the whole
   image up until it is ``factor`` (each side truncated), before anything else.
2. An image is two frames (``temporal_patch_size``: it is repeated to fill one temporal patch),
   so the pixel bounds hold for ``temporal_patch_size * h * w``: an image keeps at most half of
   ``max_pixels`` and at least half of ``min_pixels``.
3. The aspect-ratio check (at most 200) runs after that upscaling.

The image is then ``(h / patch) x (w / patch)`` encoder patches in one sequence (one temporal
patch), and a quarter of that (the 2x2 merge) ``<|image|>`` tokens in the prompt.

Spec: ``glm4v[:min_pixels=12544,max_pixels=11760000,patch_size=14,merge_size=2,
temporal_patch_size=2]``: the defaults are transformers' image processor's; take your
checkpoint's ``preprocessor_config.json`` (``size.shortest_edge`` / ``size.longest_edge``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dataprep.errors import SampleRejected
from dataprep.policies.base import ImageCost, VisionPolicy

__all__ = ["Glm4vPolicy", "glm4v_smart_resize"]

MAX_ASPECT = 200


def glm4v_video_resize(
    frames: int,
    height: int,
    width: int,
    factor: int,
    temporal: int,
    min_px: int,
    max_px: int,
    model: str = "glm4v",
) -> tuple[int, int]:
    """GLM-4V's ``smart_resize`` over ``frames`` frames of ``height`` x ``width`` (Qwen3-VL's video
    processor uses the same): (height, width) after resizing, multiples of ``factor``, the
    pixel bounds over all the frames (rounded to ``temporal``); ``model`` names it in a
    refusal. One image is ``temporal`` frames (:func:`glm4v_smart_resize`)."""
    if frames < temporal:
        raise SampleRejected(
            "video_too_short",
            f"{frames} frame(s) sampled: the {model} video processor needs at least {temporal}",
        )
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise SampleRejected(
            "aspect_ratio_out_of_range",
            f"{width}x{height}: {model} accepts aspect ratios up to {MAX_ASPECT} (after scaling "
            f"the short side up to {factor} px)",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_px:
        beta = math.sqrt(frames * height * width / max_px)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_px:
        beta = math.sqrt(min_px / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def glm4v_smart_resize(
    height: int,
    width: int,
    factor: int = 28,
    min_pixels: int = 112 * 112,
    max_pixels: int = 28 * 28 * 15000,
    temporal: int = 2,
) -> tuple[int, int]:
    """GLM-4V's ``smart_resize`` for one image: (height, width) after resizing, multiples of
    ``factor``; ``temporal`` frames count against the pixel bounds (the image is repeated to
    fill them)."""
    return glm4v_video_resize(temporal, height, width, factor, temporal, min_pixels, max_pixels)


@lru_cache(maxsize=65536)
def _glm4v_cost(
    width: int, height: int, min_px: int, max_px: int, patch: int, merge: int, temporal: int
) -> ImageCost:
    h, w = glm4v_smart_resize(height, width, patch * merge, min_px, max_px, temporal)
    patches = (h // patch) * (w // patch)
    return ImageCost((patches,), patches // (merge * merge))


@dataclass(frozen=True, kw_only=True)
class Glm4vPolicy(VisionPolicy):
    min_pixels: int = 112 * 112
    max_pixels: int = 28 * 28 * 15000
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"glm4v needs 0 < min_pixels <= max_pixels, got {self.min_pixels}, "
                f"{self.max_pixels}: take size.shortest_edge and size.longest_edge from the "
                "checkpoint's preprocessor_config.json"
            )
        if min(self.patch_size, self.merge_size, self.temporal_patch_size) < 1:
            raise ValueError(
                f"glm4v needs patch_size, merge_size and temporal_patch_size >= 1, got "
                f"{self.patch_size}, {self.merge_size}, {self.temporal_patch_size} (defaults: "
                "14, 2, 2)"
            )

    def image_cost(self, width: int, height: int) -> ImageCost:
        return _glm4v_cost(
            width,
            height,
            self.min_pixels,
            self.max_pixels,
            self.patch_size,
            self.merge_size,
            self.temporal_patch_size,
        )

    def spec(self) -> str:
        return (
            f"glm4v:min_pixels={self.min_pixels},max_pixels={self.max_pixels},"
            f"patch_size={self.patch_size},merge_size={self.merge_size},"
            f"temporal_patch_size={self.temporal_patch_size}"
        )
