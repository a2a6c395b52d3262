"""The checks :class:`~trainer_adapter.hf.inputs.HFPacker` makes of each sample: media it
cannot build are refused rather than packed as text (:func:`refuse_media`), and the built row's
length is compared with what prep counted (:func:`check_cost`).
"""

from __future__ import annotations

from dataprep.families.registry import FAMILIES
from equishard.contracts.columns import LLM_TOKENS

__all__ = ["audio_families", "check_cost", "refuse_media", "video_families"]


def audio_families() -> str:
    """The families whose rows take recordings, for messages (the registry's, as it is now)."""
    return ", ".join(n for n, f in FAMILIES.items() if f.packer.audio)


def video_families() -> str:
    """The families whose videos the packer builds, for messages."""
    return ", ".join(n for n, f in FAMILIES.items() if f.packer.videos)


def refuse_media(packer, sample) -> None:
    """A sample with videos, or with recordings this packer has no audio rule for: their
    marks would be packed as text and the media dropped (a sample built as something else
    than prep measured); refused, naming what to use."""
    videos = getattr(sample, "videos", ()) if packer._video is None else ()
    audios = getattr(sample, "audios", ()) if packer._audio is None else ()
    images = sample.images if not packer._takes_images else ()
    media = [
        f"{len(v)} {w}"
        for w, v in (("image(s)", images), ("video(s)", videos), ("recording(s)", audios))
        if v
    ]
    if media:
        fix = (
            f"the {packer.family} family's models take no images"
            if images
            else (
                "give the packer the generation's video rule (from_generation does)"
                if packer._rules.videos
                else f"HFPacker builds no videos of the {packer.family} family: prep without them"
            )
            + f"; families whose videos it builds: {video_families()}"
            if videos
            else "give the packer the generation's audio rule (from_generation does); "
            f"families that take recordings: {audio_families()}"
        )
        raise ValueError(
            f"sample {sample.meta.get('sample_id', '?')!r} has {' and '.join(media)}, "
            f"which this {packer.family} packer would pack as text: {fix}"
        )


def check_cost(packer, meta: dict, built: int) -> None:
    cost = meta.get("cost")
    sid = meta.get("sample_id", "?")
    if not isinstance(cost, dict) or LLM_TOKENS not in cost:
        if packer.check_costs is None:
            return
        raise ValueError(
            f"sample {sid!r} has no prep costs (meta['cost']): check_costs needs samples "
            "read from an equishard generation"
        )
    if int(cost[LLM_TOKENS]) != built:
        raise ValueError(
            f"sample {sid!r}: the {packer.family} processor makes {built} LLM tokens of it, "
            f"prep counted {cost['llm_tokens']}: prep's --vision-policy, --template or "
            "--tokenizer differ from this processor (with this packer's images_kwargs "
            f"{packer.images_kwargs}), so the plan balanced other lengths than the model "
            "sees; prep again with the model's own settings (check_costs=False turns this "
            "check off)"
        )
