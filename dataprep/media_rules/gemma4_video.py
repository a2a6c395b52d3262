"""The video rule of Gemma 4: frames sampled uniformly, each resized as an image is within the
video's smaller patch budget, a timestamp before each.

The video processor (``Gemma4VideoProcessor``) samples ``num_frames`` frames (32) with the
transformers default sampler: ``np.arange(n) * total // n``, raising for a video of fewer than
``n`` frames. A processor configured with ``num_frames`` unset and ``fps`` set asks for
``max(1, int(total / video_fps * fps))`` frames instead; one that does not sample
(``do_sample_frames=False``) keeps every frame. Here ``num_frames=0`` with ``fps=F`` is the
first, ``num_frames=0`` with ``fps=0`` the second; both set is refused, as the sampler refuses
them.

Each frame is resized by the image processor's rule (:func:`~dataprep.policies.gemma4.
gemma4_resize`, the same function transformers copies into the video processor) within
``max_soft_tokens * pooling_kernel_size^2`` patches of ``patch_size`` (70 soft tokens, 630
patches, by default: a smaller budget than an image's 280), and its patch rows are padded to
that budget, so the vision tower runs ``max_soft_tokens * k^2`` rows a frame whatever its size,
and the LLM sees ``patches / k^2`` ``<|video|>`` tokens a frame.

``Gemma4Processor.replace_video_token`` writes, for each frame, its time as ``MM:SS`` (the
frame's index over the stream's average rate), a space, then its tokens between ``<|image>``
and ``<image|>``; the frames joined by spaces. That text, the tokens apart, is counted by the
tokenizer where it stands (``MediaCost.text``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dataprep.media_rules.base import MediaCost, MediaRule, default_frames
from dataprep.policies.gemma4 import check_gemma4, gemma4_cost
from dataprep.video_header import VideoHeader

__all__ = ["Gemma4VideoRule"]

BOI, EOI = "<|image>", "<image|>"  # the processor's boi_token / eoi_token around each frame


@dataclass(frozen=True, kw_only=True)
class Gemma4VideoRule(MediaRule):
    modality = "video"
    tower = "vision"  # the vision tower runs each frame's patch rows as it runs an image's

    num_frames: int = 32  # 0: fps frames a second, or every frame where fps is 0 too
    fps: float = 0.0
    max_soft_tokens: int = 70  # the video processor's (an image's is 280)
    patch_size: int = 16
    pooling_kernel_size: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fps < 0 or (self.num_frames and self.fps):
            raise ValueError(
                f"gemma4 video needs fps >= 0, and num_frames and fps not both set, got "
                f"num_frames={self.num_frames}, fps={self.fps:g}: the sampler takes one of "
                "them (num_frames=0,fps=F for F frames a second; both 0 keeps every frame)"
            )
        check_gemma4(self, "gemma4 video", "video", 70)

    @property
    def budget(self) -> int:
        """The patch rows each frame is padded to (``max_soft_tokens * k^2``)."""
        return self.max_soft_tokens * self.pooling_kernel_size**2

    def indices(self, total: int, video_fps: float) -> list[int]:
        """The frames the processor keeps, by index (``video_too_short`` where it raises)."""
        n = default_frames(total, video_fps, self.num_frames, self.fps)
        return [i * total // n for i in range(n)]

    def tokens_per_frame(self, width: int, height: int) -> int:
        """The soft tokens of one frame of ``width`` x ``height``."""
        return gemma4_cost(
            width, height, self.max_soft_tokens, self.patch_size, self.pooling_kernel_size
        ).llm_tokens

    @staticmethod
    def text(indices: list[int], video_fps: float) -> str:
        """The prompt's text for the frames at ``indices``, their video tokens left out."""
        stamps = []
        for i in indices:
            second = i / video_fps
            stamps.append(f"{int(second // 60):02d}:{int(second % 60):02d} {BOI}{EOI}")
        return " ".join(stamps)

    def cost(self, header: VideoHeader) -> MediaCost:
        idx = self.indices(header.frames, header.fps)
        per_frame = self.tokens_per_frame(header.width, header.height)
        return MediaCost(
            (self.budget,) * len(idx), len(idx) * per_frame, self.text(idx, header.fps)
        )

    def spec(self) -> str:
        return (
            f"gemma4:num_frames={self.num_frames},fps={self.fps!r},"
            f"max_soft_tokens={self.max_soft_tokens},patch_size={self.patch_size},"
            f"pooling_kernel_size={self.pooling_kernel_size}"
        )
