"""The video rule of ERNIE 4.5-VL: frames clamped to 16..180, each resized alone, each its own
sequence in the vision tower, pairs merged in time for the LLM.

The video processor (``Ernie4_5_VLMoeVideoProcessor``) samples in its ``sample_frames``:

* ``num_frames=N``: N frames, refused by the processor unless ``min_frames <= N <=
  max_frames`` (16..180), and for a video of fewer than N frames;
* else ``total / video_fps * fps`` frames (``fps`` set) or every frame, clamped to
  ``min_frames``..``max_frames`` and to the video's own frames (a 10-frame clip keeps 10);
* at ``torch.arange(0, total, total / n)``, whose length is computed in double precision
  (``ceil(total / (total / n))``; ``n`` may be fractional with ``fps``).

An odd count gets its last frame repeated (its ``_prepare_input_videos``). Each frame is
resized by ERNIE's ``smart_resize`` (Qwen2-VL's, transformers' form, :func:`~dataprep.
policies.qwen2vl.qwen2vl_smart_resize`) within ``min_pixels``..``max_pixels`` of one frame
(299 x 28^2 .. 1196 x 28^2), not a budget of the whole video. The vision tower attends within
each frame (``grid_t`` sequences of ``grid_h * grid_w`` patches), and the LLM sees
``grid_t * grid_h * grid_w / (merge^2 * 2)`` tokens: the resampler merges 2 x 2 patches and
pairs of frames.

The processor draws each frame's timestamp into its pixels: no text. The template writes
``Video k:<|VIDEO_START|><|VIDEO_PLACEHOLDER|><|VIDEO_END|>``, counted by the tokenizer; the
processor expands the placeholder only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dataprep.media_rules.base import MediaCost, MediaRule, frames_asked
from dataprep.policies.qwen2vl import qwen2vl_smart_resize
from dataprep.video_header import VideoHeader

__all__ = ["ErnieVideoRule"]

TEMPORAL = 2  # frames a token pair merges in time; the processor pads to an even count


@dataclass(frozen=True, kw_only=True)
class ErnieVideoRule(MediaRule):
    modality = "video"
    tower = "vision"

    num_frames: int = 0  # 0: not set (fps, or every frame, within min..max)
    fps: float = 0.0  # 0: not set
    min_frames: int = 16
    max_frames: int = 180
    min_pixels: int = 299 * 28 * 28  # size.shortest_edge, a frame's
    max_pixels: int = 1196 * 28 * 28  # size.longest_edge
    patch_size: int = 14
    merge_size: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fps < 0 or (self.num_frames and self.fps):
            raise ValueError(
                f"ernie45vl video needs fps >= 0, and num_frames and fps not both set, got "
                f"num_frames={self.num_frames}, fps={self.fps:g}: its sampler takes one of them"
            )
        if not 1 <= self.min_frames <= self.max_frames:
            raise ValueError(
                f"ernie45vl video needs 1 <= min_frames <= max_frames, got {self.min_frames}, "
                f"{self.max_frames} (the processor's: 16 and 180)"
            )
        if self.num_frames and not self.min_frames <= self.num_frames <= self.max_frames:
            raise ValueError(
                f"ernie45vl video: num_frames={self.num_frames} is outside min_frames.."
                f"max_frames ({self.min_frames}..{self.max_frames}); the processor raises for "
                "it on every video: ask within them, or widen them as your checkpoint does"
            )
        if not 1 <= self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"ernie45vl video needs 1 <= min_pixels <= max_pixels, got {self.min_pixels}, "
                f"{self.max_pixels}"
            )
        if self.patch_size < 1 or self.merge_size < 1:
            raise ValueError(
                f"ernie45vl video needs patch_size and merge_size >= 1, got {self.patch_size}, "
                f"{self.merge_size}"
            )

    def frames(self, total: int, video_fps: float) -> int:
        """The frames the processor samples (before the pad to an even count)."""
        if self.num_frames:
            n = frames_asked(total, self.num_frames)
        else:
            n = total / video_fps * self.fps if self.fps else total
            n = min(max(n, self.min_frames), self.max_frames, total)
        return math.ceil(total / (total / n))  # torch.arange's length, in double precision

    def cost(self, header: VideoHeader) -> MediaCost:
        n = self.frames(header.frames, header.fps)
        grid_t = n + n % TEMPORAL
        factor = self.patch_size * self.merge_size
        h, w = qwen2vl_smart_resize(
            header.height, header.width, factor, self.min_pixels, self.max_pixels
        )
        per_frame = (h // self.patch_size) * (w // self.patch_size)
        tokens = grid_t * per_frame // (self.merge_size**2 * TEMPORAL)
        return MediaCost((per_frame,) * grid_t, tokens)

    def spec(self) -> str:
        return (
            f"ernie45vl:num_frames={self.num_frames},fps={self.fps!r},"
            f"min_frames={self.min_frames},max_frames={self.max_frames},"
            f"min_pixels={self.min_pixels},max_pixels={self.max_pixels},"
            f"patch_size={self.patch_size},merge_size={self.merge_size}"
        )
