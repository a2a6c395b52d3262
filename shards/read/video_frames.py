"""A video's frames as InternVL's loaders hand them to the vision tower, for the collator of
``equishard train``: the frames prep counted, each cut into the tiles it counted.

The generation records the video rule prep measured with. ``equishard train``'s vision encoder
takes a video the way InternVL does, as images: each sampled frame is tiled as an image is (one
square of ``tile_size``, or with ``max_tiles`` a grid and a thumbnail: ``dynamic_preprocess``,
the image policy's tiles) and runs through the same tower; its tokens take image-token slots.
The frames are the rule's (:meth:`~dataprep.media_rules.internvl_video.InternVLVideoRule.
frame_indices`: the model card's ``get_index`` or the video processor's ``sample_frames``),
decoded with PyAV (:func:`~shards.read.media.decode_video`) from the header prep probed. A rule
whose frames the tower takes as temporal patches (Qwen2-VL's pairs of frames) or as another
model's input is refused when the collator is built, naming what to use.
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from dataprep.media_rules.base import MediaCost
from dataprep.media_rules.internvl_video import InternVLVideoRule
from dataprep.policies import InternVLPolicy

__all__ = ["VideoFrames"]


@dataclass(frozen=True, kw_only=True)
class VideoFrames:
    """``rule``'s frames of one video, tiled with ``policy``'s patches (the image policy the
    vision encoder was sized for: same patch and pixel shuffle)."""

    rule: InternVLVideoRule
    policy: object

    def __post_init__(self) -> None:
        rule, pol = self.rule, self.policy
        if not isinstance(rule, InternVLVideoRule):
            raise ValueError(
                f"video rule {rule.spec()!r}: equishard train runs a video's frames as images "
                "(InternVL's rule, with --vision-policy internvl); other families' videos "
                "(Qwen2-VL's pairs of frames as temporal patches, ...) train with their "
                "Hugging Face model (trainer_adapter.HFPacker, balance_model)"
            )
        if not isinstance(pol, InternVLPolicy) or (pol.patch_size, pol.downsample_ratio) != (
            rule.patch_size,
            rule.downsample_ratio,
        ):
            raise ValueError(
                f"video rule {rule.spec()!r} cuts frames into {rule.patch_size}-px patches "
                f"shuffled by {rule.downsample_ratio}; the vision policy {pol.spec()!r} sizes "
                "the encoder for others: prep with an InternVL policy of the same patch_size "
                "and downsample_ratio"
            )

    @property
    def tiles(self) -> InternVLPolicy:
        """The policy a frame is tiled with: ``dynamic_preprocess`` with the rule's
        ``max_tiles`` (a thumbnail beside a grid of several)."""
        return InternVLPolicy(
            min_tiles=1,
            max_tiles=self.rule.max_tiles,
            tile_size=self.rule.tile_size,
            patch_size=self.rule.patch_size,
            downsample_ratio=self.rule.downsample_ratio,
            thumbnail=True,
        )

    def __call__(self, data: bytes, where: str) -> tuple[list[Image.Image], MediaCost]:
        """The frames the model gets, in order (a short video's repeated), and the video's
        cost as prep computed it (its frame labels, tokens and encoder sequences)."""
        from dataprep.video_header import probe_video_bytes
        from shards.read.media import decode_video

        header = probe_video_bytes(data, where)
        idx = self.rule.frame_indices(header.frames, header.fps)
        frames = decode_video(data, idx)
        return [Image.fromarray(f) for f in frames], self.rule.cost(header)
