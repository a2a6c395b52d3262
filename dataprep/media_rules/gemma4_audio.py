"""The audio rule of Gemma 4: 20-ms mel frames every 10 ms, subsampled four times, one token a
position.

``Gemma4Processor`` loads a recording at ``sampling_rate`` (16 kHz, :func:`~dataprep.
media_rules.base.samples_at`), and ``Gemma4AudioFeatureExtractor`` truncates it to
``max_length`` samples (480,000: 30 s), prepends ``frame_length / 2`` zeros (its semicausal
padding) and cuts ``frame_length + 1``-sample windows (321) every ``hop_length`` (160). A mel
frame is real where its window's last sample is the recording's: ``(samples - 161) // 160 + 1``
of them (none for 10 ms or less). The processor's ``replace_audio_token`` halves that mask
twice as the tower's two stride-2 convolutions do (``mask[::2]``: ``ceil(frames / 2)``, then
again), and writes that many ``<|audio|>`` tokens between ``<|audio>`` and ``<audio|>``: at
most 750 for 30 s, 40 ms a token.

The audio tower's conformer runs those positions as one sequence a recording. The two markers
are counted by the tokenizer as text (``MediaCost.text``). A recording that gives no token (10
ms or less at 16 kHz) is refused: the processor writes an empty audio, which nothing can learn
from.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataprep.audio_header import AudioHeader
from dataprep.errors import SampleRejected
from dataprep.media_rules.base import MediaCost, MediaRule, samples_at

__all__ = ["Gemma4AudioRule"]

BOA, EOA = "<|audio>", "<audio|>"  # the processor's boa_token / eoa_token


@dataclass(frozen=True, kw_only=True)
class Gemma4AudioRule(MediaRule):
    modality = "audio"
    tower = "audio"

    sampling_rate: int = 16000
    frame_length: int = 320  # 20 ms
    hop_length: int = 160  # 10 ms
    max_length: int = 480_000  # samples the feature extractor keeps (30 s)

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.sampling_rate, self.frame_length, self.hop_length, self.max_length) < 1:
            raise ValueError(
                "gemma4 audio needs sampling_rate, frame_length, hop_length and max_length >= "
                f"1, got {self.sampling_rate}, {self.frame_length}, {self.hop_length}, "
                f"{self.max_length}"
            )

    def frames(self, header: AudioHeader) -> int:
        """The mel frames of real audio (the feature mask's ones)."""
        kept = min(samples_at(header, self.sampling_rate), self.max_length)
        return max(
            0, (kept + self.frame_length // 2 - self.frame_length - 1) // self.hop_length + 1
        )

    def cost(self, header: AudioHeader) -> MediaCost:
        frames = self.frames(header)
        tokens = ((frames + 1) // 2 + 1) // 2  # two stride-2 halvings, each rounded up
        if not tokens:
            raise SampleRejected(
                "audio_too_short",
                f"{header.frames} sample(s) at {header.sample_rate} Hz: Gemma 4's feature "
                "extractor finds no whole 20-ms frame in it, so its processor gives it no token",
            )
        return MediaCost((tokens,), tokens, BOA + EOA)

    def spec(self) -> str:
        return (
            f"gemma4:sampling_rate={self.sampling_rate},frame_length={self.frame_length},"
            f"hop_length={self.hop_length},max_length={self.max_length}"
        )
