"""The video rule of InternVL (1.5 to 3): frames as 448-px tiles of 256 LLM tokens, each frame
labelled ``Frame{i}:`` in the prompt.

Two published forms sample, tile and label the frames differently; ``source`` picks the one the
training data loader runs:

* ``internvl`` (the model cards' ``load_video`` and ``chat``, default): ``num_frames``
  segments (``num_segments``, 32 by default), one frame from the middle of each, whatever the
  video's length (a short video repeats frames); each frame tiled by ``dynamic_preprocess``
  with ``max_tiles`` (``max_num``, 1 by default; with more, a thumbnail beside a grid of
  several), the tiles of the image policy :mod:`dataprep.policies.internvl`. The prompt gets
  ``Frame{i}: <image>\\n`` a frame, each ``<image>`` then ``<img>`` + 256 context tokens a tile +
  ``</img>``.
* ``transformers`` (``InternVLVideoProcessor`` and ``InternVLProcessor``, the ``-hf``
  checkpoints): every frame (``num_frames=0``, the processor's ``do_sample_frames=False``), or
  ``num_frames`` / ``fps`` frames as its ``sample_frames`` takes them
  (``torch.arange(shift, total, total / n)``, the shift half a step with ``initial_shift=1``);
  asking for more frames than the video has is the processor's error, a refusal here. Each
  frame is resized to one ``tile_size`` square. ``replace_video_token`` writes the frames
  ``Frame{i}: <img>...</img>`` joined by newlines.

The vision tower runs each tile as one sequence of ``(tile_size / patch_size)^2`` patches, as
it runs an image's (``tower = vision``). The coded frame size is what decord and PyAV hand the
model (no display rotation), so a frame's tile grid is taken from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dataprep.errors import SampleRejected
from dataprep.media_rules.base import MediaCost, MediaRule, frames_asked
from dataprep.policies.internvl import internvl_grid
from dataprep.video_header import VideoHeader

__all__ = ["INTERNVL_VIDEO_SOURCES", "InternVLVideoRule"]

INTERNVL_VIDEO_SOURCES = ("internvl", "transformers")
START, END = "<img>", "</img>"  # InternVL's IMG_START_TOKEN and IMG_END_TOKEN


@dataclass(frozen=True, kw_only=True)
class InternVLVideoRule(MediaRule):
    modality = "video"
    tower = "vision"  # InternViT runs a frame's tiles as it runs an image's

    source: str = "internvl"
    num_frames: int = 32  # internvl: num_segments; transformers: 0 keeps every frame
    fps: float = 0.0  # transformers only: frames a second instead of num_frames
    initial_shift: bool = True  # transformers only: sample from the middle of each step
    max_tiles: int = 1  # internvl only: dynamic_preprocess's max_num for each frame
    tile_size: int = 448
    patch_size: int = 14
    downsample_ratio: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.source not in INTERNVL_VIDEO_SOURCES:
            raise ValueError(
                f"internvl video source must be one of {', '.join(INTERNVL_VIDEO_SOURCES)}, got "
                f"{self.source!r}: the loader your training runs (the model card's load_video, "
                "or the transformers video processor of the -hf checkpoints)"
            )
        if self.fps < 0:  # (whole-number fields are checked >= 0 by their type)
            raise ValueError(f"internvl video needs fps >= 0, got {self.fps}")
        if self.source == "internvl" and (self.num_frames < 1 or self.fps or self.max_tiles < 1):
            raise ValueError(
                "internvl video (source=internvl) takes num_frames >= 1 segments and max_tiles "
                f">= 1, no fps (load_video's num_segments, max_num): got num_frames="
                f"{self.num_frames}, fps={self.fps:g}, max_tiles={self.max_tiles}"
            )
        if self.source == "transformers" and (
            (self.num_frames and self.fps) or self.max_tiles != 1
        ):
            raise ValueError(
                "internvl video (source=transformers) takes num_frames or fps, not both, and "
                f"one tile a frame (max_tiles=1): got num_frames={self.num_frames}, "
                f"fps={self.fps:g}, max_tiles={self.max_tiles}"
            )
        if self.patch_size < 1 or self.tile_size % self.patch_size:
            raise ValueError(
                f"internvl video needs tile_size a multiple of patch_size >= 1, got "
                f"{self.tile_size}, {self.patch_size}"
            )
        if not 0 < self.downsample_ratio <= 1 or self.tokens_per_tile < 1:
            raise ValueError(
                f"internvl video needs 0 < downsample_ratio <= 1 leaving a token a tile, got "
                f"{self.downsample_ratio}"
            )

    @property
    def patches_per_tile(self) -> int:
        return (self.tile_size // self.patch_size) ** 2

    @property
    def tokens_per_tile(self) -> int:
        return int(self.patches_per_tile * self.downsample_ratio**2)

    def frames(self, total: int, video_fps: float) -> int:
        """The frames the loader hands the model."""
        if self.source == "internvl":
            return self.num_frames  # one a segment, repeated in a short video
        n = self.num_frames
        if not n and self.fps:
            n = int(total / video_fps * self.fps)
            if not n:
                raise SampleRejected(
                    "video_too_short",
                    f"{total} frame(s) at {video_fps:g} fps: the video processor samples none "
                    f"at fps={self.fps:g} (it divides by zero)",
                )
        if not n:
            return total
        frames_asked(total, n)
        step = total / n
        shift = step / 2 if self.initial_shift else 0.0
        return math.ceil((total - shift) / step)  # torch.arange's length, in double precision

    def frame_indices(self, total: int, video_fps: float) -> list[int]:
        """Which of the video's ``total`` frames the loader hands the model, in order (as many
        as :meth:`frames`): the model card's ``get_index`` (the middle of each of
        ``num_frames`` segments over frames ``0..total-1``), or the video processor's
        ``sample_frames`` (``arange(shift, total, total / n)`` truncated; every frame for
        ``num_frames=0`` without ``fps``)."""
        n = self.frames(total, video_fps)
        if self.source == "internvl":
            seg = (total - 1) / self.num_frames
            return [int(seg / 2 + round(seg * i)) for i in range(n)]
        asked = self.num_frames or (int(total / video_fps * self.fps) if self.fps else 0)
        if not asked:
            return list(range(total))
        step = total / asked
        shift = step / 2 if self.initial_shift else 0.0
        return [int(shift + step * i) for i in range(n)]

    def tiles(self, width: int, height: int) -> int:
        """Tiles of one frame: ``dynamic_preprocess`` with ``max_tiles`` (a thumbnail beside a
        grid of several), one square for the transformers processor (its ``max_tiles`` is 1)."""
        cols, rows = internvl_grid(width, height, 1, self.max_tiles, self.tile_size)
        return cols * rows + (cols * rows != 1)

    def cost(self, header: VideoHeader) -> MediaCost:
        n = self.frames(header.frames, header.fps)
        tiles = self.tiles(header.width, header.height)
        frame = f"{START}{END}"
        if self.source == "internvl":
            text = "".join(f"Frame{i + 1}: {frame}\n" for i in range(n))
        else:
            text = "\n".join(f"Frame{i + 1}: {frame}" for i in range(n))
        return MediaCost(
            (self.patches_per_tile,) * (n * tiles), n * tiles * self.tokens_per_tile, text
        )

    def spec(self) -> str:
        return (
            f"internvl:source={self.source},num_frames={self.num_frames},fps={self.fps:g},"
            f"initial_shift={int(self.initial_shift)},max_tiles={self.max_tiles},"
            f"tile_size={self.tile_size},patch_size={self.patch_size},"
            f"downsample_ratio={self.downsample_ratio!r}"
        )
