"""The audio rule of Whisper-style encoders: Qwen2-Audio (padded) and Qwen2.5-Omni (unpadded).

The processor loads a recording at 16 kHz (``ceil(frames * 16000 / rate)`` samples, its
channels averaged: transformers' ``load_audio``), and its ``WhisperFeatureExtractor`` cuts it
into 10 ms hops (``hop_length`` 160 samples), truncated to ``chunk_length`` seconds and padded
to them (``padding="max_length"``). The feature mask covers ``ceil(samples / 160)`` frames;
the encoder's convolution stem halves them and its pooling halves them again, so the LLM
sees ``((frames - 1) // 2 + 1 - 2) // 2 + 1`` tokens (the processors' formula, Qwen2.5-Omni's
``_get_feat_extract_output_lengths``).

What the encoder runs differs (``n_window``):

* ``n_window=0``, padded (Qwen2-Audio, ``chunk_length=30``): the whole padded window, every
  recording ``chunk_length * 50`` positions after the stem (1,500), however short it is;
  a recording past 30 s is cut there, as the processor cuts it.
* ``n_window=N``, unpadded (Qwen2.5-Omni, ``N=100``, ``chunk_length=300``): the mask's frames
  in chunks of ``2N`` (the last one shorter), each chunk its own attention sequence of
  ``(chunk - 1) // 2 + 1`` positions (``chunk_and_pad_features``, ``get_audio_cu_seqlens``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dataprep.audio_header import AudioHeader
from dataprep.media_rules.base import MediaCost, MediaRule, samples_at

__all__ = ["WhisperAudioRule", "audio_tokens", "chunk_positions"]


def audio_tokens(frames: int) -> int:
    """LLM tokens of ``frames`` feature frames: the stem's stride-2 convolution, then the
    stride-2 pooling (Qwen2-Audio's and Qwen2.5-Omni's processors)."""
    return (((frames - 1) // 2 + 1) - 2) // 2 + 1


def chunk_positions(frames: int, n_window: int) -> tuple[int, ...]:
    """The attention sequences an unpadded Whisper-style encoder runs for ``frames`` feature
    frames (Qwen2.5-Omni's): chunks of ``2 * n_window`` frames, the last one shorter, each
    ``(chunk - 1) // 2 + 1`` positions after the stem's stride-2 convolution."""
    size = 2 * n_window
    chunks = [size] * (frames // size) + ([frames % size] if frames % size else [])
    return tuple((c - 1) // 2 + 1 for c in chunks)


@dataclass(frozen=True, kw_only=True)
class WhisperAudioRule(MediaRule):
    modality = "audio"
    tower = "audio"

    sampling_rate: int = 16000
    hop_length: int = 160
    chunk_length: int = 30  # seconds the feature extractor pads and truncates to
    n_window: int = 0  # 0: the padded window (Qwen2-Audio); N: chunks of 2N frames (Omni)

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.sampling_rate, self.hop_length, self.chunk_length) < 1:
            raise ValueError(
                "whisper audio needs sampling_rate, hop_length and chunk_length >= 1, got "
                f"{self.sampling_rate}, {self.hop_length}, {self.chunk_length}"
            )

    @property
    def max_samples(self) -> int:
        """The samples kept at most: one window of ``chunk_length`` seconds."""
        return self.chunk_length * self.sampling_rate

    @property
    def window_frames(self) -> int:
        """The frames of the padded window (``chunk_length`` seconds in hops)."""
        return self.chunk_length * self.sampling_rate // self.hop_length

    def samples(self, header: AudioHeader) -> int:
        """The recording's length at the model's rate (:func:`~dataprep.media_rules.base.
        samples_at`)."""
        return samples_at(header, self.sampling_rate)

    def frames(self, header: AudioHeader) -> int:
        """The feature mask's frames: the samples kept (at most ``chunk_length`` seconds), in
        hops."""
        kept = min(self.samples(header), self.chunk_length * self.sampling_rate)
        return -(-kept // self.hop_length)

    def cost(self, header: AudioHeader) -> MediaCost:
        return self.frame_cost(self.frames(header))

    def frame_cost(self, frames: int) -> MediaCost:
        """The cost of a recording of ``frames`` feature frames (the mask's)."""
        if self.n_window == 0:
            return MediaCost((self.window_frames // 2,), audio_tokens(frames))
        return MediaCost(chunk_positions(frames, self.n_window), audio_tokens(frames))

    def spec(self) -> str:
        return (
            f"whisper:sampling_rate={self.sampling_rate},hop_length={self.hop_length},"
            f"chunk_length={self.chunk_length},n_window={self.n_window}"
        )
