"""The video rule of LLaVA-NeXT-Video: frames sampled uniformly, each a square CLIP image,
pooled 2 x 2 for the LLM.

``LlavaNextVideoProcessor`` takes frames as transformers' default sampler does
(:func:`~dataprep.media_rules.base.default_frames`): ``num_frames`` spread uniformly (8, as the
model cards sample), ``num_frames=0,fps=F``, or every frame with both 0 (the video processor's
own default, ``do_sample_frames=False``). Each frame is resized to ``image_size`` on its
shortest side and center-cropped to ``image_size`` square (336: the released checkpoints'
CLIP ViT-L/14-336; the class default, 224, fits no released tower), so every frame is one
encoder sequence of ``(image_size / patch_size)^2`` patches (576), as an image's tile is
(:mod:`dataprep.policies.anyres`), whatever the video's size. ``replace_video_token`` writes
``patches // 4`` tokens a frame (144): the model average-pools the patches 2 x 2. No text
besides.

The family's images are LLaVA-NeXT's (``--vision-policy llava-next``, its anyres grids), and its
template writes a video as ``<video>``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataprep.media_rules.base import MediaCost, MediaRule, default_frames
from dataprep.video_header import VideoHeader

__all__ = ["LlavaNextVideoRule"]


@dataclass(frozen=True, kw_only=True)
class LlavaNextVideoRule(MediaRule):
    modality = "video"
    tower = "vision"  # CLIP runs each frame as it runs an image's tile

    num_frames: int = 8
    fps: float = 0.0
    image_size: int = 336  # crop_size (and size.shortest_edge) of the video processor
    patch_size: int = 14

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fps < 0 or (self.num_frames and self.fps):
            raise ValueError(
                f"llava-next-video needs fps >= 0, and num_frames and fps not both set, got "
                f"num_frames={self.num_frames}, fps={self.fps:g}: the sampler takes one of them"
            )
        if self.patch_size < 1 or self.image_size < self.patch_size:
            raise ValueError(
                f"llava-next-video needs 1 <= patch_size <= image_size, got {self.patch_size}, "
                f"{self.image_size}"
            )

    def frames(self, total: int, video_fps: float) -> int:
        """The frames the processor keeps (``default_sample_indices_fn``)."""
        return default_frames(total, video_fps, self.num_frames, self.fps)

    def cost(self, header: VideoHeader) -> MediaCost:
        n = self.frames(header.frames, header.fps)
        side = self.image_size // self.patch_size
        return MediaCost((side * side,) * n, n * (side * side // 4))

    def spec(self) -> str:
        return (
            f"llava-next-video:num_frames={self.num_frames},fps={self.fps!r},"
            f"image_size={self.image_size},patch_size={self.patch_size}"
        )
