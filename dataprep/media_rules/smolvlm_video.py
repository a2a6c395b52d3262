"""The video rule of SmolVLM2 (and SmolVLM): frames as single tiles, a sentence before them and
a timestamp before each.

The video processor (``SmolVLMVideoProcessor``) keeps every frame where it does not sample
(``num_frames=0``: its ``do_sample_frames=False`` default), or samples as its
``sample_frames`` does: ``round(fps * duration)`` frames, at most ``num_frames`` (the
checkpoints' ``video_sampling.max_frames``, 64) and at least one, spread by
``np.linspace(start, end, n, dtype=int)`` over the video less ``skip_secs`` at each end where
the video is long enough, duplicates dropped (``np.unique``: a short video gives fewer
frames). Each frame is resized to one ``tile`` square (``max_image_size``), so the vision
tower runs ``(tile / patch_size)^2`` patches and the LLM sees ``tokens_per_tile``
(``image_seq_len``) tokens a frame.

``SmolVLMProcessor.replace_video_token`` writes ``You are provided the following series of
{frame count in words} frames from a {H:MM:SS} [H:MM:SS] video.``, then for each frame
``Frame from {MM:SS}:`` and its image tokens between ``<fake_token_around_image>`` and
``<global-img>`` markers, then two newlines: all of it text the tokenizer counts
(``MediaCost.text``), the image tokens apart. The duration and the timestamps are the frame
count and indices over the stream's average rate, as transformers' PyAV and decord readers
give them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from dataprep.media_rules.base import MediaCost, MediaRule
from dataprep.video_header import VideoHeader

__all__ = ["SmolVLMVideoRule"]

AROUND, GLOBAL = "<fake_token_around_image>", "<global-img>"
INTRO = "You are provided the following series of {} frames from a {} [H:MM:SS] video.\n"


@dataclass(frozen=True, kw_only=True)
class SmolVLMVideoRule(MediaRule):
    modality = "video"
    tower = "vision"  # SigLIP runs each frame as it runs an image's tile

    num_frames: int = 64  # video_sampling.max_frames; 0: every frame (no sampling)
    fps: float = 1.0  # video_sampling.fps
    skip_secs: float = 1.0
    tile: int = 384  # max_image_size.longest_edge
    patch_size: int = 14
    tokens_per_tile: int = 81  # the processor's image_seq_len

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fps <= 0 or self.skip_secs < 0:
            raise ValueError(
                f"smolvlm video needs fps > 0 and skip_secs >= 0, got {self.fps:g}, "
                f"{self.skip_secs:g}"
            )
        if self.patch_size < 1 or self.tile < self.patch_size or self.tokens_per_tile < 1:
            raise ValueError(
                "smolvlm video needs 1 <= patch_size <= tile and tokens_per_tile >= 1, got "
                f"patch_size={self.patch_size}, tile={self.tile}, "
                f"tokens_per_tile={self.tokens_per_tile}"
            )

    def indices(self, total: int, video_fps: float) -> list[int]:
        """The frames the processor keeps, by index."""
        if not self.num_frames:
            return list(range(total))
        duration = total / video_fps
        wanted = max(1, min(round(self.fps * duration), self.num_frames))
        start, end = 0, total - 1
        if self.skip_secs > 0 and duration - 2 * self.skip_secs > self.num_frames * self.fps:
            start = int(self.skip_secs * video_fps)
            end = int(total - self.skip_secs * video_fps)
        start, end = max(0, start), min(end, total - 1)
        if start >= end:
            start, end = 0, total - 1
        return np.unique(np.linspace(start, end, wanted, dtype=int)).tolist()

    def text(self, indices: list[int], total: int, video_fps: float) -> str:
        """The prompt's text for the frames at ``indices``, their image tokens left out."""
        from num2words import num2words

        length = timedelta(seconds=int(total / video_fps))
        out = [INTRO.format(num2words(len(indices)), length)]
        for i in indices:
            second = i / video_fps
            out.append(f"\nFrame from {int(second // 60):02d}:{int(second % 60):02d}:")
            out.append(f"{AROUND}{GLOBAL}{AROUND}")
        return "".join(out) + "\n\n"

    def cost(self, header: VideoHeader) -> MediaCost:
        idx = self.indices(header.frames, header.fps)
        side = self.tile // self.patch_size
        return MediaCost(
            (side * side,) * len(idx),
            len(idx) * self.tokens_per_tile,
            self.text(idx, header.frames, header.fps),
        )

    def spec(self) -> str:
        return (
            f"smolvlm:num_frames={self.num_frames},fps={self.fps!r},"
            f"skip_secs={self.skip_secs!r},tile={self.tile},patch_size={self.patch_size},"
            f"tokens_per_tile={self.tokens_per_tile}"
        )
