"""The video rule of Qwen2-VL and Qwen2.5-VL: frames sampled at ``fps``, each resized by
Qwen2-VL's ``smart_resize``, pairs of frames cut into 14-px patches, merged 2x2 for the LLM.

Two published forms sample and size the frames differently; ``source`` picks the one the
training data loader runs:

* ``qwen-vl-utils`` (default; the Qwen repositories' fine-tuning code, vLLM-style pipelines
  that call ``process_vision_info``): ``smart_nframes`` takes ``total / video_fps * fps``
  frames within ``[min_frames, max_frames]`` (rounded up and down to 2), at most the video's,
  floored to 2; each frame is resized under ``max_pixels``, itself capped by the video's share
  of ``total_pixels`` (``total_pixels / frames * 2``, at least ``1.05 * min_pixels``), with
  qwen-vl-utils' ``smart_resize``.
* ``transformers`` (``Qwen2VLVideoProcessor``; LLaMA-Factory, TRL and other HF trainers): with
  ``fps > 0`` (``do_sample_frames=True``) ``sample_frames`` takes ``total / video_fps * fps``
  frames within ``[min_frames, floor(min(max_frames, total) / 2) * 2]``, floored to 2, then as
  many as ``torch.arange(0, total, total / n)`` yields; ``fps = 0`` (the processor's default
  ``do_sample_frames=False``) keeps every frame. The count is padded to a multiple of 2 by
  repeating the last frame. ``cap_pixels_per_frame=1`` caps each frame as qwen-vl-utils does
  (``max_video_tokens`` tokens' worth of pixels, 90 % of it); the transformers form of
  ``smart_resize``.

The encoder runs each pair of frames as one sequence of ``(h/14) * (w/14)`` patches; the LLM
sees a quarter of them. A frame's size enters only as the product of its resized sides, which
is the same for a frame and its rotation: the count does not depend on a display rotation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dataprep.errors import SampleRejected
from dataprep.media_rules.base import MediaCost, MediaRule
from dataprep.policies.qwen2vl import qwen2vl_smart_resize
from dataprep.video_header import VideoHeader

__all__ = ["QWEN_VIDEO_SOURCES", "QwenVideoRule"]

QWEN_VIDEO_SOURCES = ("qwen-vl-utils", "transformers")


def _floor(x: float, f: int) -> int:
    return math.floor(x / f) * f


def _ceil(x: float, f: int) -> int:
    return math.ceil(x / f) * f


@dataclass(frozen=True, kw_only=True)
class QwenVideoRule(MediaRule):
    modality = "video"
    tower = "vision"  # Qwen2-VL's ViT runs video frames as it runs images

    source: str = "qwen-vl-utils"
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 0  # 0: the source's own (qwen-vl-utils: none given; transformers: 768 tokens)
    # qwen-vl-utils: MODEL_SEQ_LEN (128000) tokens of 28x28 px, 90 % of them
    total_pixels: float = 128000 * 28 * 28 * 0.9
    cap_pixels_per_frame: bool = False  # transformers only (qwen-vl-utils always caps)
    max_video_tokens: int = 128000  # transformers only: the cap's budget
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.source not in QWEN_VIDEO_SOURCES:
            raise ValueError(
                f"qwen video source must be one of {', '.join(QWEN_VIDEO_SOURCES)}, got "
                f"{self.source!r}: the loader your training runs (process_vision_info, or the "
                "transformers video processor)"
            )
        if self.fps < 0 or (self.fps == 0 and self.source == "qwen-vl-utils"):
            raise ValueError(
                f"qwen video fps must be > 0 (0: every frame, transformers only), got {self.fps}"
            )
        if self.min_pixels <= 0 or 0 < self.max_pixels < self.min_pixels:
            raise ValueError(
                f"qwen video needs 0 < min_pixels <= max_pixels (or max_pixels 0), got {self.min_pixels}, "
                f"{self.max_pixels}"
            )
        if self.min_frames > self.max_frames or self.max_frames < 1:
            raise ValueError(
                f"qwen video needs min_frames <= max_frames and max_frames >= 1, got "
                f"{self.min_frames}, {self.max_frames}"
            )
        if min(self.patch_size, self.merge_size, self.temporal_patch_size) < 1:
            raise ValueError("qwen video needs patch_size, merge_size, temporal_patch_size >= 1")

    # the number of frames the processor keeps, before padding to the temporal patch
    def frames(self, total: int, video_fps: float) -> int:
        tps = self.temporal_patch_size
        if self.source == "qwen-vl-utils":
            lo = _ceil(self.min_frames, tps)
            hi = _floor(min(self.max_frames, total), tps)
            n = _floor(min(max(total / video_fps * self.fps, lo), hi, total), tps)
            if not tps <= n <= total:
                raise SampleRejected(
                    "video_too_short",
                    f"{total} frame(s): qwen-vl-utils samples at least {tps} (smart_nframes "
                    "raises for this video)",
                )
            return n
        if self.fps == 0:
            return total
        hi = _floor(min(self.max_frames, total), tps)
        n = _floor(min(max(total / video_fps * self.fps, self.min_frames), hi, total), tps)
        if n <= 0:
            raise SampleRejected(
                "video_too_short",
                f"{total} frame(s): the transformers video processor samples none of them "
                f"(fewer than {tps}); pass fps=0 to keep every frame",
            )
        # torch.arange(0, total, total / n): its length is computed in double precision
        return math.ceil(total / (total / n))

    def indices(self, total: int, n: int) -> list[int]:
        """The ``n`` sampled frames' indices, as the source's sampler computes them (in torch's
        float32): qwen-vl-utils' readers ``torch.linspace(0, total - 1, n).round()``, the
        transformers ``sample_frames`` ``torch.arange(0, total, total / n).int()`` (``fps=0``:
        every frame)."""
        import torch

        if self.source == "qwen-vl-utils":
            return torch.linspace(0, total - 1, n).round().long().tolist()
        if self.fps == 0:
            return list(range(total))
        return torch.arange(0, total, total / n).int().tolist()

    def frame_size(self, width: int, height: int, frames: int) -> tuple[int, int]:
        """(height, width) each of ``frames`` sampled frames is resized to."""
        factor = self.patch_size * self.merge_size
        tps = self.temporal_patch_size
        if self.source == "qwen-vl-utils":
            frame_max = 768 * factor * factor  # VIDEO_MAX_TOKEN_NUM tokens
            cap = max(min(frame_max, self.total_pixels / frames * tps), int(self.min_pixels * 1.05))
            if self.max_pixels:  # a max_pixels given lowers the cap, never raises it
                cap = min(self.max_pixels, cap)
            resize = "qwen-vl-utils"
        else:
            cap = self.max_pixels or 768 * factor * factor  # size.longest_edge
            if self.cap_pixels_per_frame:
                total = int(self.max_video_tokens * factor * factor * 0.9)
                cap = max(min(cap, total * tps // frames), int(self.min_pixels * 1.05))
            resize = "transformers"
        return qwen2vl_smart_resize(height, width, factor, self.min_pixels, cap, resize)

    def cost(self, header: VideoHeader) -> MediaCost:
        n = self.frames(header.frames, header.fps)
        h, w = self.frame_size(header.width, header.height, n)
        grid_t = -(-n // self.temporal_patch_size)
        per_t = (h // self.patch_size) * (w // self.patch_size)
        return MediaCost((per_t,) * grid_t, grid_t * per_t // (self.merge_size**2))

    def spec(self) -> str:
        return (
            f"qwen2vl:source={self.source},fps={self.fps:g},min_frames={self.min_frames},"
            f"max_frames={self.max_frames},min_pixels={self.min_pixels},"
            f"max_pixels={self.max_pixels},total_pixels={self.total_pixels!r},"
            f"cap_pixels_per_frame={int(self.cap_pixels_per_frame)},"
            f"max_video_tokens={self.max_video_tokens},patch_size={self.patch_size},"
            f"merge_size={self.merge_size},temporal_patch_size={self.temporal_patch_size}"
        )
