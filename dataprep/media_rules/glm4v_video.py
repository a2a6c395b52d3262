"""The video rule of GLM-4.1V, GLM-4.5V and GLM-4.6V: frames by the second, pairs of them
through the vision tower, each pair's second in the prompt.

``Glm4vVideoProcessor.sample_frames`` takes ``floor(duration * fps)`` frames (at least one),
frame ``ceil(i * video_fps / fps)`` for the i-th, for a video up to ``max_duration`` seconds;
past it, ``max_duration * fps`` frames spread by ``np.linspace`` over the whole video (every
frame where that is not fewer). Repeated indices are dropped and the last frame repeated to an
even count. The video is resized by GLM's ``smart_resize`` (28-px factor, the pixel budget over
all its frames, which Qwen3-VL's video processor shares:
:func:`~dataprep.policies.glm4v.glm4v_video_resize`);
each pair of frames is one sequence of ``(h / 14) * (w / 14)`` patches, a quarter of them LLM
tokens.

``Glm4vProcessor.replace_video_token`` writes, for each pair, ``<|begin_of_image|>``, its
tokens, ``<|end_of_image|>`` and the whole second of its first frame (``int``): text the
tokenizer counts (``MediaCost.text``). The template's ``<|begin_of_video|>`` and
``<|end_of_video|>`` around the video stay. The duration is the frame count over the stream's
average rate, as transformers' PyAV and decord readers give it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dataprep.media_rules.base import MediaCost, MediaRule
from dataprep.policies.glm4v import glm4v_video_resize
from dataprep.video_header import VideoHeader

__all__ = ["Glm4vVideoRule"]

START, END = "<|begin_of_image|>", "<|end_of_image|>"


@dataclass(frozen=True, kw_only=True)
class Glm4vVideoRule(MediaRule):
    modality = "video"
    tower = "vision"  # GLM's ViT runs video frames as it runs images (two frames each)

    fps: float = 2.0
    max_duration: int = 300
    min_pixels: int = 112 * 112  # size.shortest_edge
    max_pixels: int = 28 * 28 * 2 * 30000  # size.longest_edge: the whole video's budget
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fps <= 0 or self.max_duration < 1:
            raise ValueError(
                f"glm4v video needs fps > 0 and max_duration >= 1, got {self.fps:g}, "
                f"{self.max_duration}"
            )
        if self.min_pixels < 1 or self.max_pixels < self.min_pixels:
            raise ValueError(
                f"glm4v video needs 1 <= min_pixels <= max_pixels, got {self.min_pixels}, "
                f"{self.max_pixels}"
            )
        if min(self.patch_size, self.merge_size, self.temporal_patch_size) < 1:
            raise ValueError("glm4v video needs patch_size, merge_size, temporal_patch_size >= 1")

    def indices(self, total: int, video_fps: float) -> list[int]:
        """The sampled frames' indices, repeated ones dropped, the last repeated to an even
        count."""
        last = total - 1
        duration = total / video_fps
        if duration <= self.max_duration:
            n = max(math.floor(duration * self.fps), 1)
            picked = [min(last, math.ceil(i * video_fps / self.fps)) for i in range(n)]
        else:
            n = int(self.max_duration * self.fps)
            if n >= total:
                picked = list(range(total))
            else:
                seconds = np.linspace(0, duration, n, endpoint=True)
                picked = [min(last, math.ceil(t * video_fps)) for t in seconds]
        out = list(dict.fromkeys(picked))
        return out + out[-1:] if len(out) % 2 else out

    def frame_size(self, width: int, height: int, n: int) -> tuple[int, int]:
        """(height, width) each of the ``n`` sampled frames is resized to: GLM's
        ``smart_resize`` over the whole video's pixel budget."""
        return glm4v_video_resize(
            n,
            height,
            width,
            self.patch_size * self.merge_size,
            self.temporal_patch_size,
            self.min_pixels,
            self.max_pixels,
            "GLM-4.1V",
        )

    def timestamps(self, indices: list[int], video_fps: float) -> list[int]:
        """Each pair's time in the prompt: the whole second of its first frame, as
        ``replace_video_token`` writes ``int(timestamps[::2][k])``."""
        pairs = len(indices) // self.temporal_patch_size
        return [int(i / video_fps) for i in indices[::2][:pairs]]

    def cost(self, header: VideoHeader) -> MediaCost:
        idx = self.indices(header.frames, header.fps)
        h, w = self.frame_size(header.width, header.height, len(idx))
        seconds = self.timestamps(idx, header.fps)
        per_t = (h // self.patch_size) * (w // self.patch_size)
        text = "".join(f"{START}{END}{s}" for s in seconds)
        return MediaCost((per_t,) * len(seconds), len(seconds) * per_t // self.merge_size**2, text)

    def spec(self) -> str:
        return (
            f"glm4v:fps={self.fps!r},max_duration={self.max_duration},"
            f"min_pixels={self.min_pixels},max_pixels={self.max_pixels},"
            f"patch_size={self.patch_size},merge_size={self.merge_size},"
            f"temporal_patch_size={self.temporal_patch_size}"
        )
