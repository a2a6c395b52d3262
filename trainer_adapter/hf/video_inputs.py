"""A Qwen- or GLM-family video's inputs, as its video processor makes them, from the frames prep
counted.

Qwen2-VL and Qwen2.5-VL (family ``qwen2vl``, rule ``qwen2vl``) and Qwen3-VL (``qwen3vl``) run a
video through their vision tower as pairs of frames (temporal patches). For one video,
:class:`QwenVideo` makes what the processor gives the model, from the rule the generation
recorded (:mod:`dataprep.media_rules.qwen_video`, :mod:`~dataprep.media_rules.qwen3_video`):

1. the frames the rule's source samples (:meth:`~dataprep.media_rules.QwenVideoRule.indices`:
   qwen-vl-utils' readers or the transformers ``sample_frames``), decoded with PyAV
   (:func:`~shards.read.media.decode_video`);
2. each resized to the rule's frame size with torchvision's bicubic, antialiased kernel as the
   source runs it on a CPU: the transformers video processor hands torchvision's ``resize`` the
   uint8 frames, which it resizes with torch's native uint8 kernel; qwen-vl-utils' readers call
   the older ``torchvision.transforms.functional.resize``, which resizes in float32, clamps to
   0..255 and rounds back to uint8 (torchvision 0.28's code, which calls these torch kernels);
3. scaled and normalized with the processor's mean and std, fused as its
   ``rescale_and_normalize`` fuses them, in float32;
4. the last frame repeated to fill the last temporal patch, and cut into patches in the
   processor's order (``patchify``): ``[t*h*w, C*tps*p*p]`` with the grid ``(t, h, w)``.

The video's text is its ``<|video_pad|>`` tokens, ``t*h*w / merge^2`` of them; Qwen3-VL's is,
per temporal patch, its time (``<2.3 seconds>``) before its tokens between the vision start
and end tokens, in place of the template's wrapper around the video's marker. Qwen2.5-VL's
positions take each video's seconds per temporal patch (``second_per_grid_ts``:
``temporal_patch_size`` over the sampled frame rate).

GLM-4.1V's video processor is Qwen2-VL's with its own sampling (by the second,
:class:`~dataprep.media_rules.Glm4vVideoRule`), pixel budget over the whole video and text:
each pair's ``<|image|>`` tokens between ``<|begin_of_image|>`` and ``<|end_of_image|>``, then
the whole second of its first frame; its rows carry the pairs among the images
(:func:`pairs_among_images`).

The mean and std are the video processor's, where the processor has one (it needs
torchvision); else its image processor's, which the published Qwen2-VL, Qwen2.5-VL and Qwen3-VL
configurations give the same values. The rule's patch, merge and temporal patch sizes are
checked against the processor at construction (:func:`check_processor_video`), with the pixel
bounds the processor's call passes its video processor (Qwen2.5-Omni's call gives a ``size`` of
its own, 100,352..602,112 px, over the video processor's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataprep.media_rules import Glm4vVideoRule, Qwen3VideoRule, QwenVideoRule
from shards.read.prep_settings import SettingsMismatch

__all__ = [
    "QwenVideo",
    "check_processor_video",
    "decoded_frames",
    "pack_videos",
    "pairs_among_images",
    "scaling_of",
]

START, END = "<|vision_start|>", "<|vision_end|>"
GLM_START, GLM_END = "<|begin_of_image|>", "<|end_of_image|>"  # around each pair's tokens


def _video_rule(rule, family: str):
    if not isinstance(rule, (QwenVideoRule, Qwen3VideoRule, Glm4vVideoRule)):
        raise ValueError(
            f"video rule {rule.spec()!r}: HFPacker builds the videos of Qwen2-VL, Qwen2.5-VL, "
            f"Qwen3-VL and GLM-4.1V (rules qwen2vl, qwen3vl, glm4v) only, not the {family} "
            "family's: prep without videos, or train them with equishard train where its rule "
            "is supported"
        )
    return rule


def _source(rule) -> str:
    """Whose code samples and resizes the video: GLM's rule models its transformers video
    processor only."""
    return getattr(rule, "source", "transformers")


def check_processor_video(processor, rule, family: str) -> None:
    """The rule's patch, merge and temporal patch sizes against the processor's image processor
    (the same tower runs images and videos) and its video processor where it has one; with the
    transformers source, the video processor's pixel bounds and frame counts too. A difference
    is a :class:`~shards.read.prep_settings.SettingsMismatch` naming both values."""
    _video_rule(rule, family)
    checks = [(getattr(processor, "image_processor", None), ("patch_size", "merge_size",
                                                             "temporal_patch_size"))]  # fmt: skip
    vp = getattr(processor, "video_processor", None)
    if vp is not None:
        names = ("patch_size", "merge_size", "temporal_patch_size")
        if isinstance(rule, Glm4vVideoRule):
            names += ("fps", "max_duration")
        elif rule.source == "transformers":
            names += ("min_frames", "max_frames")
        checks.append((vp, names))
    for owner, names in checks:
        for name in names:
            have = getattr(owner, name, None)
            if have is not None and have != getattr(rule, name):
                raise SettingsMismatch(
                    f"the {family} processor's {type(owner).__name__}.{name} is {have}, the "
                    f"generation's video rule {rule.spec()!r} has {getattr(rule, name)}: prep "
                    "counted other patches than this processor makes; prep again with the "
                    "model's own settings"
                )
    # the size the processor's call passes its video processor (Qwen2.5-Omni's class defaults
    # its videos_kwargs), else the video processor's own
    call = getattr(processor, "videos_kwargs", None)
    size = call.get("size") if isinstance(call, dict) else None
    size = size if size is not None else getattr(vp, "size", None)
    if _source(rule) == "transformers" and size is not None:
        factor = rule.patch_size * rule.merge_size
        want = {"shortest_edge": rule.min_pixels,
                "longest_edge": rule.max_pixels or 768 * factor * factor}  # fmt: skip
        for key, value in want.items():
            have = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
            if have is not None and have != value:
                raise SettingsMismatch(
                    f"the {family} processor's video size[{key!r}] is {have}, the generation's "
                    f"video rule {rule.spec()!r} has {value}: prep again with the model's own "
                    "settings"
                )


def scaling_of(processor) -> dict:
    """The ``rescale_and_normalize`` settings a video's frames get: the processor's video
    processor's, else (no torchvision) its image processor's."""
    vp = getattr(processor, "video_processor", None)
    src = vp if vp is not None else processor.image_processor
    return {
        "mean": tuple(float(x) for x in src.image_mean),
        "std": tuple(float(x) for x in src.image_std),
        "rescale_factor": float(src.rescale_factor),
        "do_rescale": bool(src.do_rescale),
        "do_normalize": bool(src.do_normalize),
    }


def decoded_frames(data: bytes, idx: list[int], header, where: str) -> torch.Tensor:
    """The video's frames ``idx`` as ``[n, C, H, W]`` uint8, decoded with PyAV; a video whose
    stream holds fewer frames than its header promised is refused naming ``where``."""
    from shards.read.media import decode_video

    try:
        decoded = decode_video(data, idx)
    except IndexError as exc:
        raise ValueError(
            f"{where}: {exc}, though its header says {header.frames}: the frames prep "
            "counted cannot be decoded"
        ) from None
    return torch.from_numpy(decoded).permute(0, 3, 1, 2).contiguous()


@dataclass(frozen=True, kw_only=True)
class QwenVideo:
    """One video's patches, grid and text, as ``processor``'s video processor makes them for
    ``rule`` (a :class:`~dataprep.media_rules.QwenVideoRule` or
    :class:`~dataprep.media_rules.Qwen3VideoRule`)."""

    rule: object
    token: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rescale_factor: float
    do_rescale: bool
    do_normalize: bool

    @classmethod
    def of(cls, processor, rule, family: str) -> QwenVideo:
        """The video inputs of ``processor`` (its video processor's scaling, else its image
        processor's) for ``rule``, checked against the processor."""
        check_processor_video(processor, rule, family)
        glm = isinstance(rule, Glm4vVideoRule)  # GLM's pairs are written with its image token
        token = processor.image_token if glm else processor.video_token
        return cls(rule=rule, token=token, **scaling_of(processor))

    def resized(self, frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """``[n, C, H, W]`` uint8 frames resized to ``size`` as the rule's source resizes them
        on a CPU (the module's step 2)."""
        if tuple(frames.shape[-2:]) == tuple(size):
            return frames  # torchvision returns a frame of the size asked as it is
        kw = {"size": list(size), "mode": "bicubic", "align_corners": False, "antialias": True}
        if _source(self.rule) == "transformers":  # torch's native uint8 kernel
            return torch.nn.functional.interpolate(frames, **kw)
        out = torch.nn.functional.interpolate(frames.float(), **kw)  # qwen-vl-utils' v1 resize
        return out.clamp_(0, 255).round_().to(torch.uint8)

    def scaled(self, frames: torch.Tensor) -> torch.Tensor:
        """The processor's ``rescale_and_normalize``: float32, mean and std fused with the
        rescale factor where it does both."""
        x = frames.to(torch.float32)
        if self.do_normalize:
            mean, std = torch.tensor(self.mean), torch.tensor(self.std)
            if self.do_rescale:
                mean, std = mean * (1.0 / self.rescale_factor), std * (1.0 / self.rescale_factor)
            return x.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
        return x * self.rescale_factor if self.do_rescale else x

    def patches(self, frames: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """``[n, C, h, w]`` scaled frames -> ``[t*gh*gw, C*tps*p*p]`` in the processor's order
        (the last frame repeated to fill a temporal patch) and the grid ``(t, gh, gw)``."""
        r = self.rule
        p, m, tps = r.patch_size, r.merge_size, r.temporal_patch_size
        if len(frames) % tps:
            frames = torch.cat([frames, frames[-1:].expand(tps - len(frames) % tps, -1, -1, -1)])
        n, c, h, w = frames.shape
        t, gh, gw = n // tps, h // p, w // p
        x = frames.reshape(t, tps, c, gh // m, m, p, gw // m, m, p)
        x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return x.reshape(t * gh * gw, c * tps * p * p), (t, gh, gw)

    def __call__(self, data: bytes, where: str) -> dict:
        """One video (its encoded bytes): ``patches``, ``grid`` (t, h, w), ``indices`` (the
        sampled frames), ``seconds_per_grid`` (seconds per temporal patch) and ``stamps``
        (Qwen3-VL's time of each temporal patch; empty for Qwen2-VL)."""
        from dataprep.video_header import probe_video_bytes

        r = self.rule
        header = probe_video_bytes(data, where)
        if isinstance(r, Glm4vVideoRule):  # by the second, up to its longest duration
            idx = r.indices(header.frames, header.fps)
        else:
            idx = r.indices(header.frames, r.frames(header.frames, header.fps))
        frames = decoded_frames(data, idx, header, where)
        size = r.frame_size(frames.shape[-1], frames.shape[-2], len(idx))
        patches, grid = self.patches(self.scaled(self.resized(frames, size)))
        sampled_fps = len(idx) / header.frames * header.fps
        stamps = r.timestamps(idx, header.fps) if hasattr(r, "timestamps") else []
        return {
            "patches": patches,
            "grid": grid,
            "indices": idx,
            "seconds_per_grid": r.temporal_patch_size / sampled_fps,
            "stamps": stamps,
        }

    def among_images(self, processed: dict, videos: list[dict], order: list[bool]) -> dict:
        """GLM-4.1V: the sample's images with its videos' pairs among them
        (:func:`pairs_among_images`)."""
        return pairs_among_images(processed, videos, order)

    def text(self, video: dict) -> str:
        """What the video's mark becomes in the prompt: its tokens; for Qwen3-VL each temporal
        patch's time and vision start and end around its tokens; for GLM-4.1V each pair's
        image start and end around its tokens, then its whole second."""
        t, h, w = video["grid"]
        per_t = h * w // self.rule.merge_size**2
        if isinstance(self.rule, Glm4vVideoRule):
            return "".join(f"{GLM_START}{self.token * per_t}{GLM_END}{s}" for s in video["stamps"])
        if not video["stamps"]:
            return self.token * (t * per_t)
        return "".join(
            f"<{s:.1f} seconds>{START}{self.token * per_t}{END}" for s in video["stamps"]
        )


def pack_videos(parts: list[dict]) -> dict:
    """The row's video inputs from its samples' (``videos``: each video's dict): the patches of
    every video in order, ``video_grid_thw``; a frame-tower family's (LLaVA-OneVision:
    :mod:`~trainer_adapter.hf.frame_videos`) frames as ``[videos, frames, C, H, W]``; none
    where the row has no video."""
    videos = [v for p in parts for v in p.get("videos", ())]
    if not videos:
        return {}
    if "frames" in videos[0]:
        counts = sorted({len(v["frames"]) for v in videos})
        if len(counts) > 1:
            raise ValueError(
                f"the row's videos have {counts} frames: the model takes them as one "
                "[videos, frames, C, H, W] tensor; measure every video with one num_frames"
            )
        return {"pixel_values_videos": torch.stack([v["frames"] for v in videos])}
    return {
        "pixel_values_videos": torch.cat([v["patches"] for v in videos]),
        "video_grid_thw": torch.tensor([list(v["grid"]) for v in videos], dtype=torch.long),
    }


def pairs_among_images(processed: dict, videos: list[dict], order: list[bool]) -> dict:
    """``processed`` (a sample's images: ``pixel_values``, ``image_grid_thw``) with each video's
    pairs of frames among them, in the order their tokens stand (``order``: per mark in the
    text, True for a video's; a mark past its kind's items stays text), a pair's grid
    ``(1, h, w)`` as GLM-4.1V's ``get_video_features`` hands its tower a video
    (:class:`~dataprep.families.spec.PackerRules`' ``videos_with_images``)."""
    grids = processed.get("image_grid_thw")
    sizes = [int(g.prod()) for g in grids] if grids is not None else []
    images = iter(zip(torch.split(processed["pixel_values"], sizes), sizes and grids.tolist(),
                      strict=True)) if sizes else iter(())  # fmt: skip
    own = iter(videos)
    pix, grid = [], []
    for is_video in order:
        if is_video and (v := next(own, None)) is not None:
            t, h, w = v["grid"]
            pix.append(v["patches"])
            grid += [[1, h, w]] * t
        elif not is_video and (image := next(images, None)) is not None:
            pix.append(image[0])
            grid.append(image[1])
    return {**processed, "pixel_values": torch.cat(pix), "image_grid_thw": torch.tensor(grid)}
