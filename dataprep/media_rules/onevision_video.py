"""The video rule of LLaVA-OneVision and LLaVA-Video: frames sampled uniformly, each a 384-px
SigLIP image of 27 x 27 patches, pooled 2 x 2 (rounded up) for the LLM, one newline a video.

Frames are taken as transformers' ``default_sample_indices_fn`` takes them: ``num_frames``
spread uniformly over the video (LLaVA-Video trains on 64, LLaVA-OneVision on 32), or, with
``num_frames=0``, ``max(1, int(total / video_fps * fps))`` at ``fps``; with both 0, every frame
(the video processor's ``do_sample_frames=False``, its default). More frames than the video has
is the processor's error, a refusal here (``video_too_short``). The processor writes
``frames * ceil(27 / 2)^2 + 1`` video tokens (``LlavaOnevisionProcessor.replace_video_token``);
the vision tower runs each frame as one sequence of 729 patches, as it runs an image's tile
(``tower = vision``: balancing adds the frames to the vision phase).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dataprep.media_rules.base import MediaCost, MediaRule, default_frames
from dataprep.video_header import VideoHeader

__all__ = ["OneVisionVideoRule"]


@dataclass(frozen=True, kw_only=True)
class OneVisionVideoRule(MediaRule):
    modality = "video"
    tower = "vision"  # SigLIP runs each frame as it runs an image's tile

    num_frames: int = 32
    fps: float = 0.0
    image_size: int = 384
    patch_size: int = 14

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fps < 0:
            raise ValueError(f"onevision video fps must be >= 0, got {self.fps}")
        if self.num_frames and self.fps:
            raise ValueError(
                "onevision video takes num_frames or fps, not both (as the video processor): "
                f"got num_frames={self.num_frames}, fps={self.fps}"
            )
        if self.patch_size < 1 or self.image_size < self.patch_size:
            raise ValueError(
                f"onevision video needs 1 <= patch_size <= image_size, got {self.patch_size}, "
                f"{self.image_size}"
            )

    def frames(self, total: int, video_fps: float) -> int:
        """The frames the processor keeps (``default_sample_indices_fn``)."""
        return default_frames(total, video_fps, self.num_frames, self.fps)

    def cost(self, header: VideoHeader) -> MediaCost:
        n = self.frames(header.frames, header.fps)
        side = self.image_size // self.patch_size
        pooled = math.ceil(side / 2)
        return MediaCost((side * side,) * n, n * pooled * pooled + 1)

    def spec(self) -> str:
        return (
            f"llava-onevision:num_frames={self.num_frames},fps={self.fps:g},"
            f"image_size={self.image_size},patch_size={self.patch_size}"
        )
