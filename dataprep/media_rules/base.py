"""What every video and audio rule shares: :class:`MediaCost` (one item's encoder sequences and
LLM tokens) and the :class:`MediaRule` base class.

A rule turns one item's header (:class:`~dataprep.video_header.VideoHeader`,
:class:`~dataprep.audio_header.AudioHeader`) into what the model's processor makes of it: how
many tokens stand for it in the LLM's sequence, and the sequences its encoder runs (each with
its own attention). Rules are keyword-only frozen dataclasses, their fields type-checked as the
vision policies' are (:func:`~dataprep.policies.base.check_field_types`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from dataprep.errors import SampleRejected
from dataprep.policies.base import check_field_types

__all__ = ["MediaCost", "MediaRule", "default_frames", "frames_asked", "samples_at"]


@dataclass(frozen=True, slots=True)
class MediaCost:
    """What one video or recording costs: ``seq_lens``, the length of each sequence its encoder
    runs (a Qwen video: one per pair of frames; Whisper's encoder: one per window),
    ``llm_tokens``, the media tokens the processor writes for it in the prompt, and ``text``,
    the text it writes around them in place of the item's marker, without them (InternVL's
    ``Frame1: <img></img>`` labels): the tokenizer counts that text where it stands."""

    seq_lens: tuple[int, ...]
    llm_tokens: int
    text: str = ""

    @property
    def tokens(self) -> int:
        """The encoder's tokens: every sequence's length summed."""
        return sum(self.seq_lens)


@dataclass(frozen=True, kw_only=True)
class MediaRule:
    """Base class; subclasses set ``modality`` (``video`` or ``audio``), implement
    :meth:`cost` and :meth:`spec`, and start their ``__post_init__`` with
    ``super().__post_init__()``."""

    modality: ClassVar[str] = ""
    # the encoder that runs the items: ``vision`` where the family's vision tower takes video
    # frames as it takes images (Qwen2-VL), else the modality's own encoder phase
    tower: ClassVar[str] = ""
    # (start, end): the wrapper the template writes around the item's marker that the
    # processor replaces by the item's own text (Qwen3-VL), taken out of the count with it
    collapses: ClassVar[tuple[str, str]] = ()

    def __post_init__(self) -> None:
        check_field_types(self)

    def cost(self, header) -> MediaCost:
        raise NotImplementedError

    def spec(self) -> str:
        raise NotImplementedError

    def describe(self) -> dict:
        return {
            "spec": self.spec(),
            "kind": type(self).__name__,
            "tower": self.tower,
            **asdict(self),
        }


def frames_asked(total: int, n: int) -> int:
    """``n``, the frames a transformers video processor is asked to sample (``num_frames``, or
    as many as ``fps`` gives) from a video of ``total``; its ``sample_frames`` raises when that
    is more than the video has: refused so, the sample named by the caller."""
    if n > total:
        raise SampleRejected(
            "video_too_short",
            f"{total} frame(s): the video processor is asked for {n} (num_frames or fps); "
            "it raises for a video this short",
        )
    return n


def default_frames(total: int, video_fps: float, num_frames: int, fps: float) -> int:
    """The frames transformers' ``default_sample_indices_fn`` keeps (the base video processor's
    ``sample_frames``): ``num_frames``, or with ``num_frames=0`` ``max(1, int(total /
    video_fps * fps))`` at ``fps``; with both 0 every frame (``do_sample_frames=False``). It
    takes them at ``arange(n) * total // n``; more than the video has is refused as the
    sampler raises (:func:`frames_asked`)."""
    n = num_frames
    if not n and fps:
        n = max(1, int(total / video_fps * fps))
    if not n:
        return total
    return frames_asked(total, n)


def samples_at(header, rate: int) -> int:
    """A recording's length in samples once loaded at ``rate``: transformers' ``load_audio``
    resamples with soxr (librosa's length, ``ceil(frames * rate / its rate)``)."""
    n, own = header.frames, header.sample_rate
    return n if own == rate else -(-n * rate // own)
