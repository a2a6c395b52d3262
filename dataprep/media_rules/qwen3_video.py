"""The video rule of Qwen3-VL: Qwen2-VL's frames and patches with 16-px patches (32-px
resize factor), and a timestamp in the prompt before each pair of frames.

The processor (``Qwen3VLProcessor.replace_video_token``) writes, for each temporal patch,
``<{t:.1f} seconds>`` then ``<|vision_start|>``, the patch's ``<|video_pad|>`` tokens and
``<|vision_end|>``, where ``t`` is the mean time of the pair's two sampled frames (the last
frame repeated to fill a pair); the chat template's own ``<|vision_start|><|video_pad|>
<|vision_end|>`` around the whole video is collapsed into those (``collapses``). The
timestamps are text: prep counts them with the tokenizer (``MediaCost.text``).

``source`` picks who samples and resizes the frames:

* ``transformers`` (default; ``Qwen3VLVideoProcessor``): ``int(total / video_fps * fps)``
  frames within ``[min_frames, min(max_frames, total)]`` (or ``num_frames`` as given), at
  ``np.linspace(0, total - 1, n).round()``; the video resized by Qwen3-VL's video
  ``smart_resize`` (GLM-4V's: :func:`~dataprep.policies.glm4v.glm4v_video_resize`), whose
  pixel budget (``max_pixels``, the processor's ``size.longest_edge``) holds for the whole
  video, ``round(n / 2) * 2`` frames of it, unless ``cap_pixels_per_frame=1`` gives each frame
  its share (qwen-vl-utils' form); fewer than two frames is its error, a refusal here.
* ``qwen-vl-utils`` (``process_vision_info(..., image_patch_size=16)``, then the processor
  with ``do_resize=False`` and the returned metadata): qwen-vl-utils' frames and per-frame
  budget (:class:`~dataprep.media_rules.qwen_video.QwenVideoRule` with 16-px patches), at
  ``torch.linspace(0, total - 1, n).round()`` (computed in float32, as torch does).

The encoder runs each pair of frames as one sequence of ``(h/16) * (w/16)`` patches; the LLM
sees a quarter of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dataprep.media_rules.base import MediaCost, MediaRule
from dataprep.media_rules.qwen_video import QwenVideoRule
from dataprep.policies.glm4v import glm4v_video_resize
from dataprep.video_header import VideoHeader

__all__ = ["QWEN3_VIDEO_SOURCES", "Qwen3VideoRule", "torch_linspace"]

QWEN3_VIDEO_SOURCES = ("transformers", "qwen-vl-utils")
START, END = "<|vision_start|>", "<|vision_end|>"


def torch_linspace(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps)`` in float32 as torch's CPU kernel computes it: the
    first half from the start, the second half back from the end."""
    f32 = np.float32
    lo, hi = f32(start), f32(end)
    if steps == 1:
        return np.array([lo], dtype=f32)
    step = f32((hi - lo) / f32(steps - 1))
    idx = np.arange(steps)
    half = steps // 2
    out = np.empty(steps, dtype=f32)
    out[:half] = lo + step * idx[:half].astype(f32)
    out[half:] = hi - step * (steps - idx[half:] - 1).astype(f32)
    return out


@dataclass(frozen=True, kw_only=True)
class Qwen3VideoRule(MediaRule):
    modality = "video"
    tower = "vision"  # Qwen3-VL's ViT runs video frames as it runs images
    collapses: ClassVar[tuple[str, str]] = (START, END)

    source: str = "transformers"
    fps: float = 2.0
    num_frames: int = 0  # transformers only: this many frames instead of fps
    min_frames: int = 4
    max_frames: int = 768
    min_pixels: int = 128 * 32 * 32  # transformers: size.shortest_edge
    max_pixels: int = 768 * 32 * 32  # transformers: size.longest_edge (0: qwen-vl-utils' own)
    total_pixels: float = 128000 * 32 * 32 * 0.9  # qwen-vl-utils only
    cap_pixels_per_frame: bool = False  # transformers only
    max_video_tokens: int = 768  # transformers only: the cap's tokens a frame
    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.source not in QWEN3_VIDEO_SOURCES:
            raise ValueError(
                f"qwen3vl video source must be one of {', '.join(QWEN3_VIDEO_SOURCES)}, got "
                f"{self.source!r}: the loader your training runs"
            )
        if self.fps < 0 or (self.fps == 0) == (self.num_frames == 0):
            raise ValueError(
                f"qwen3vl video takes fps > 0 or num_frames > 0, one of them, got fps="
                f"{self.fps:g}, num_frames={self.num_frames}"
            )
        if self.num_frames and self.source == "qwen-vl-utils":
            raise ValueError("qwen3vl video: num_frames is the transformers processor's option")
        if self.min_frames > self.max_frames or self.max_frames < 1:
            raise ValueError(
                f"qwen3vl video needs min_frames <= max_frames and max_frames >= 1, got "
                f"{self.min_frames}, {self.max_frames}"
            )
        if self.min_pixels <= 0 or (
            self.source == "transformers" and self.max_pixels < self.min_pixels
        ):
            raise ValueError(
                f"qwen3vl video needs 0 < min_pixels <= max_pixels, got {self.min_pixels}, "
                f"{self.max_pixels}"
            )
        if min(self.patch_size, self.merge_size, self.temporal_patch_size) < 1:
            raise ValueError("qwen3vl video needs patch_size, merge_size, temporal_patch_size >= 1")

    def _utils(self) -> QwenVideoRule:
        return QwenVideoRule(
            source="qwen-vl-utils",
            fps=self.fps,
            min_frames=self.min_frames,
            max_frames=self.max_frames,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            total_pixels=self.total_pixels,
            patch_size=self.patch_size,
            merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
        )

    def frames(self, total: int, video_fps: float) -> int:
        """The frames sampled, before the last is repeated to fill a pair."""
        if self.source == "qwen-vl-utils":
            return self._utils().frames(total, video_fps)
        if self.num_frames:
            return self.num_frames
        n = int(total / video_fps * self.fps)
        return min(max(n, self.min_frames), self.max_frames, total)

    def indices(self, total: int, n: int) -> list[int]:
        """The sampled frames' indices, as the sampler rounds them."""
        if self.source == "qwen-vl-utils":
            return torch_linspace(0, total - 1, n).round().astype(int).tolist()
        return np.linspace(0, total - 1, n).round().astype(int).tolist()

    def frame_size(self, width: int, height: int, n: int) -> tuple[int, int]:
        """(height, width) each of the ``n`` sampled frames is resized to."""
        if self.source == "qwen-vl-utils":
            return self._utils().frame_size(width, height, n)
        factor = self.patch_size * self.merge_size
        budget = self.max_pixels
        if self.cap_pixels_per_frame:
            share = min(self.max_video_tokens * factor * factor, self.max_pixels // n)
            budget = max(share, int(self.min_pixels * 1.05)) * n
        return glm4v_video_resize(
            n, height, width, factor, self.temporal_patch_size, self.min_pixels, budget, "Qwen3-VL"
        )

    def timestamps(self, indices: list[int], video_fps: float) -> list[float]:
        """Each temporal patch's time in the prompt: the mean time of its sampled frames (the
        last repeated to fill a patch), as the processor's ``_calculate_timestamps``."""
        tps = self.temporal_patch_size
        idx = list(indices) + [indices[-1]] * (-len(indices) % tps)
        times = [i / video_fps for i in idx]
        return [(times[i] + times[i + tps - 1]) / 2 for i in range(0, len(times), tps)]

    def cost(self, header: VideoHeader) -> MediaCost:
        n = self.frames(header.frames, header.fps)
        h, w = self.frame_size(header.width, header.height, n)
        stamps = self.timestamps(self.indices(header.frames, n), header.fps)
        per_t = (h // self.patch_size) * (w // self.patch_size)
        text = "".join(f"<{t:.1f} seconds>{START}{END}" for t in stamps)
        return MediaCost((per_t,) * len(stamps), len(stamps) * per_t // self.merge_size**2, text)

    def spec(self) -> str:
        return (
            f"qwen3vl:source={self.source},fps={self.fps:g},num_frames={self.num_frames},"
            f"min_frames={self.min_frames},max_frames={self.max_frames},"
            f"min_pixels={self.min_pixels},max_pixels={self.max_pixels},"
            f"total_pixels={self.total_pixels!r},"
            f"cap_pixels_per_frame={int(self.cap_pixels_per_frame)},"
            f"max_video_tokens={self.max_video_tokens},patch_size={self.patch_size},"
            f"merge_size={self.merge_size},temporal_patch_size={self.temporal_patch_size}"
        )
