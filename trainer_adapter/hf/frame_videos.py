"""A LLaVA-OneVision / LLaVA-Video, LLaVA-NeXT-Video or InternVL video's inputs, as its video
processor makes them, from the frames prep counted: towers that run each frame as an image's
tile.

LLaVA-OneVision's vision tower runs each frame of a video as it runs an image's tile: for one
video, :class:`OneVisionVideo` makes what ``LlavaOnevisionVideoProcessor`` gives the model,
from the rule the generation recorded (:mod:`dataprep.media_rules.onevision_video`):

1. the ``num_frames`` frames transformers' ``default_sample_indices_fn`` takes
   (``arange(n) * total // n``), decoded with PyAV (:func:`~shards.read.media.decode_video`);
2. each resized to ``image_size`` x ``image_size`` with torchvision's bicubic, antialiased
   kernel on the uint8 frames (torch's native uint8 kernel), as the video processor resizes
   them on a CPU, and scaled as its ``rescale_and_normalize`` fuses rescale and normalize
   (shared with :class:`~trainer_adapter.hf.video_inputs.QwenVideo`);
3. the row's ``pixel_values_videos``: ``[videos, frames, C, image_size, image_size]``.

The video's text is ``<video>`` once a token: ``frames * ceil(side / 2)^2 + 1`` (each frame's
patch grid pooled 2 x 2, one newline a video), as ``LlavaOnevisionProcessor`` writes it.

LLaVA-NeXT-Video (:class:`NextVideo`, :mod:`dataprep.media_rules.llava_next_video`) resizes a
frame's shortest side to ``image_size`` (the other by ``int(image_size * long / short)``) and
center-crops it square (``int((side - image_size) / 2)`` from the top and left), as
transformers' torchvision backend does; its text is ``<video>`` once a token, a frame's patches
average-pooled 2 x 2 (``side^2 // 4``), no newline.

InternVL's ``-hf`` checkpoints (:class:`InternVLVideo`, the rule's ``transformers`` source):
``InternVLVideoProcessor``'s frames (``arange(shift, total, total / n)``), each resized to one
tile; the prompt's ``Frame{i}: <img>`` + the tile's context tokens + ``</img>`` a frame, joined
by newlines; the frames travel among the images' tiles in ``pixel_values``, in the order their
marks stand, as ``InternVLProcessor`` merges them (the model takes only ``pixel_values``).

The LLaVA models take a row's videos as one tensor, so they need one frame count: the rule must
sample a fixed ``num_frames`` (a rule by rate, or every frame, is refused at construction).
The rule's frame side and patch grid are checked against the processor's
``num_image_tokens`` and, where the processor has a video processor, against its size and
frame count; the mean and std are its video processor's, else its image processor's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from dataprep.media_rules import InternVLVideoRule, LlavaNextVideoRule, OneVisionVideoRule
from shards.read.prep_settings import SettingsMismatch
from trainer_adapter.hf.video_inputs import QwenVideo, decoded_frames, scaling_of

__all__ = ["InternVLVideo", "NextVideo", "OneVisionVideo", "check_processor_frames"]


def check_processor_frames(processor, rule: OneVisionVideoRule, family: str) -> None:
    """A fixed frame count, and the rule's frame side and patches against the processor's
    (``num_image_tokens``: the patches of a tile) and its video processor's size and frame
    count where it has one. A difference is a
    :class:`~shards.read.prep_settings.SettingsMismatch` naming both values."""
    if not isinstance(rule, InternVLVideoRule) and not rule.num_frames:
        raise ValueError(
            f"video rule {rule.spec()!r}: the {family} model takes a row's videos as one "
            "[videos, frames, C, H, W] tensor, so every video needs one frame count: measure "
            "with num_frames (e.g. llava-onevision:num_frames=32), not a rate or every frame"
        )
    if isinstance(rule, LlavaNextVideoRule):
        _check_next(processor, rule, family)
        return
    if isinstance(rule, InternVLVideoRule):
        _check_internvl(processor, rule, family)
        return
    side = rule.image_size // rule.patch_size
    tokens = getattr(processor, "num_image_tokens", None)
    if tokens is not None and math.isqrt(int(tokens)) != side:
        raise SettingsMismatch(
            f"the {family} processor's num_image_tokens is {tokens} ({math.isqrt(int(tokens))} "
            f"patches a side), the generation's video rule {rule.spec()!r} has {side} "
            f"({rule.image_size} px / {rule.patch_size}): prep again with the model's own settings"
        )
    vp = getattr(processor, "video_processor", None)
    if vp is None:
        return
    size = getattr(vp, "size", None)
    have = {"height": _get(size, "height"), "width": _get(size, "width"),
            "num_frames": getattr(vp, "num_frames", None)}  # fmt: skip
    want = {"height": rule.image_size, "width": rule.image_size, "num_frames": rule.num_frames}
    for key, value in have.items():
        if value is not None and value != want[key]:
            raise SettingsMismatch(
                f"the {family} processor's {type(vp).__name__} {key} is {value}, the "
                f"generation's video rule {rule.spec()!r} has {want[key]}: prep again with the "
                "model's own settings"
            )


def _check_next(processor, rule: LlavaNextVideoRule, family: str) -> None:
    """LLaVA-NeXT-Video: the processor's patch size, its video processor's shortest side, crop
    and frame count against the rule's."""
    vp = getattr(processor, "video_processor", None)
    have = [(processor, "patch_size", getattr(processor, "patch_size", None), rule.patch_size)]
    if vp is not None:
        crop = getattr(vp, "crop_size", None)
        have += [
            (vp, "size['shortest_edge']", _get(getattr(vp, "size", None), "shortest_edge"),
             rule.image_size),
            (vp, "crop_size['height']", _get(crop, "height"), rule.image_size),
            (vp, "crop_size['width']", _get(crop, "width"), rule.image_size),
            (vp, "num_frames", getattr(vp, "num_frames", None), rule.num_frames),
        ]  # fmt: skip
    for owner, key, value, want in have:
        if value is not None and value != want:
            raise SettingsMismatch(
                f"the {family} processor's {type(owner).__name__} {key} is {value}, the "
                f"generation's video rule {rule.spec()!r} has {want}: prep again with the "
                "model's own settings"
            )


def _check_internvl(processor, rule: InternVLVideoRule, family: str) -> None:
    """InternVL: the transformers source (the model card's ``load_video`` tiles frames with PIL
    and ``dynamic_preprocess``, which this does not model), the processor's tokens a tile, and
    its video processor's tile size, frame count and shift."""
    if rule.source != "transformers":
        raise ValueError(
            f"video rule {rule.spec()!r}: HFPacker builds InternVL's videos as its transformers "
            "video processor does (the -hf checkpoints): measure them with source=transformers"
        )
    vp = getattr(processor, "video_processor", None)
    size = getattr(vp, "size", None)
    have = [(processor, "image_seq_length", getattr(processor, "image_seq_length", None),
             rule.tokens_per_tile)]  # fmt: skip
    if vp is not None:
        have += [
            (vp, "size['height']", _get(size, "height"), rule.tile_size),
            (vp, "size['width']", _get(size, "width"), rule.tile_size),
            (vp, "num_frames", getattr(vp, "num_frames", None), rule.num_frames or None),
            (vp, "initial_shift", getattr(vp, "initial_shift", None), rule.initial_shift),
        ]
    for owner, key, value, want in have:
        if value is not None and value != want:
            raise SettingsMismatch(
                f"the {family} processor's {type(owner).__name__} {key} is {value}, the "
                f"generation's video rule {rule.spec()!r} has {want}: prep again with the "
                "model's own settings"
            )


def _get(size, key: str):
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


@dataclass(frozen=True, kw_only=True)
class OneVisionVideo(QwenVideo):
    """One video's frames and text, as ``processor``'s video processor makes them for ``rule``
    (a :class:`~dataprep.media_rules.OneVisionVideoRule`); the resize and scaling are
    :class:`~trainer_adapter.hf.video_inputs.QwenVideo`'s (its transformers source)."""

    @classmethod
    def of(cls, processor, rule, family: str) -> OneVisionVideo:
        from dataprep.families.registry import family_spec

        check_processor_frames(processor, rule, family)
        # the processor's, else the marker prep counted (LLaVA-NeXT's image processor alone)
        token = (
            getattr(processor, "video_token", None)
            or family_spec(family).media_tokens["video"].marker
        )
        return cls(rule=rule, token=token, **scaling_of(processor))

    @property
    def side(self) -> int:
        """The square each frame becomes."""
        return self.rule.image_size

    def indices(self, header) -> list[int]:
        """The frames transformers' ``default_sample_indices_fn`` takes."""
        n = self.rule.frames(header.frames, header.fps)
        return (np.arange(n, dtype=np.int64) * header.frames // n).tolist()

    def __call__(self, data: bytes, where: str) -> dict:
        """One video (its encoded bytes): ``frames`` ``[n, C, S, S]`` and ``indices``."""
        from dataprep.video_header import probe_video_bytes

        header = probe_video_bytes(data, where)
        idx = self.indices(header)
        frames = decoded_frames(data, idx, header, where)
        return {"frames": self.scaled(self.resized(frames, (self.side, self.side))), "indices": idx}

    def text(self, video: dict) -> str:
        """``<video>`` once a token: each frame's pooled patches, one newline."""
        pooled = math.ceil(self.rule.image_size // self.rule.patch_size / 2)
        return self.token * (len(video["frames"]) * pooled * pooled + 1)


@dataclass(frozen=True, kw_only=True)
class NextVideo(OneVisionVideo):
    """One LLaVA-NeXT-Video video's frames and text, as ``LlavaNextVideoVideoProcessor`` makes
    them for ``rule`` (a :class:`~dataprep.media_rules.LlavaNextVideoRule`): each frame's
    shortest side resized to the tile, then center-cropped square."""

    def resized(self, frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """The shortest side to ``size`` (square), the other in proportion, then the centre."""
        h, w = frames.shape[-2:]
        s = size[0]
        short, long = (w, h) if w <= h else (h, w)
        new = (int(s * long / short), s) if w <= h else (s, int(s * long / short))
        x = super().resized(frames, new)
        top, left = int((new[0] - s) / 2.0), int((new[1] - s) / 2.0)
        return x[..., top : top + s, left : left + s]

    def text(self, video: dict) -> str:
        """``<video>`` once a token: each frame's patches pooled 2 x 2."""
        side = self.rule.image_size // self.rule.patch_size
        return self.token * (len(video["frames"]) * (side * side // 4))


@dataclass(frozen=True, kw_only=True)
class InternVLVideo(OneVisionVideo):
    """One InternVL video's frames and text, as ``InternVLVideoProcessor`` and
    ``InternVLProcessor`` make them for ``rule`` (an
    :class:`~dataprep.media_rules.InternVLVideoRule`, source ``transformers``): each frame one
    tile, ``tile_tokens`` context tokens (``token``) a frame."""

    tile_tokens: int

    @classmethod
    def of(cls, processor, rule, family: str) -> InternVLVideo:
        check_processor_frames(processor, rule, family)
        return cls(rule=rule, token=processor.image_token,
                   tile_tokens=int(processor.image_seq_length), **scaling_of(processor))  # fmt: skip

    @property
    def side(self) -> int:
        return self.rule.tile_size

    def indices(self, header) -> list[int]:
        """``InternVLVideoProcessor.sample_frames``' frames (the rule's)."""
        return self.rule.frame_indices(header.frames, header.fps)

    def text(self, video: dict) -> str:
        """``Frame{i}: <img>`` + a tile's context tokens + ``</img>`` a frame, by newlines."""
        tile = f"<img>{self.token * self.tile_tokens}</img>"
        return "\n".join(f"Frame{i + 1}: {tile}" for i in range(len(video["frames"])))

    def among_images(self, processed: dict, videos: list[dict], order: list[bool]) -> dict:
        """``processed`` (a sample's images: ``pixel_values`` tiles, ``num_patches`` each) with
        each video's frames among them, in the order their marks stand (``order``: True for
        a video's; a mark past its kind's items stays text), as ``InternVLProcessor`` merges
        them."""
        sizes = [int(n) for n in processed.get("num_patches", ())]
        images = iter(torch.split(processed["pixel_values"], sizes)) if sizes else iter(())
        own, blocks = iter(videos), []
        for is_video in order:
            block = next(own, None) if is_video else next(images, None)
            if block is not None:
                blocks.append(block["frames"] if is_video else block)
        return {**processed, "pixel_values": torch.cat(blocks)}
