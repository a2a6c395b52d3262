"""The audio rule of Audio Flamingo 3: a recording cut into Whisper windows, each padded.

``AudioFlamingo3Processor`` loads a recording at 16 kHz (transformers' ``load_audio``, as
for every Whisper-style rule: :mod:`~dataprep.media_rules.whisper_audio`) and cuts it into
windows of ``chunk_length`` seconds (30), at most ``max_windows`` of them (its
``max_audio_len`` of 600 s over 30: 20), the rest cut away; a recording shorter than a window
is one window. ``WhisperFeatureExtractor`` pads each window to ``chunk_length`` seconds and
masks its ``ceil(samples / hop_length)`` frames. The encoder runs every window whole (1,500
positions after its stride-2 stem, however little of it the recording fills); the LLM sees
``audio_tokens`` of the frames of all the recording's windows together (the processor's
``_get_audio_token_length`` of their sum; the model's per-window counts add up to it, since a
whole window's 3,000 frames halve twice without remainder).
"""

from __future__ import annotations

from dataclasses import dataclass

from dataprep.audio_header import AudioHeader
from dataprep.media_rules.base import MediaCost
from dataprep.media_rules.whisper_audio import WhisperAudioRule, audio_tokens

__all__ = ["MAX_WINDOWS", "WhisperWindowsRule"]

MAX_WINDOWS = 1000  # a bound on windows a recording (8 h 20 min of 30-s windows)


@dataclass(frozen=True, kw_only=True)
class WhisperWindowsRule(WhisperAudioRule):
    """A recording in at most ``max_windows`` windows of ``chunk_length`` seconds, each padded
    to the whole window in the encoder (``n_window`` is 0: padded windows only)."""

    max_windows: int = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_window != 0:
            raise ValueError(
                f"whisper-windows pads every window (n_window=0), got n_window={self.n_window}: "
                "for an unpadded encoder use the whisper rule"
            )
        if not 1 <= self.max_windows <= MAX_WINDOWS:
            raise ValueError(
                f"whisper-windows max_windows must be within 1..{MAX_WINDOWS}, got "
                f"{self.max_windows}"
            )

    @property
    def max_samples(self) -> int:
        """The samples kept at most: ``max_windows`` windows."""
        return self.max_windows * self.chunk_length * self.sampling_rate

    def kept(self, header: AudioHeader) -> int:
        """The recording's samples at the model's rate, cut at ``max_windows`` windows."""
        return min(self.samples(header), self.max_samples)

    def windows(self, samples: int) -> int:
        """The windows of ``samples`` kept samples: one at least (an empty recording's)."""
        return max(1, -(-samples // (self.chunk_length * self.sampling_rate)))

    def frames(self, header: AudioHeader) -> int:
        """The frames every window's mask covers, together."""
        return -(-self.kept(header) // self.hop_length)

    def cost(self, header: AudioHeader) -> MediaCost:
        n = self.windows(self.kept(header))
        return MediaCost((self.window_frames // 2,) * n, audio_tokens(self.frames(header)))

    def spec(self) -> str:
        return (
            f"whisper-windows:sampling_rate={self.sampling_rate},hop_length={self.hop_length},"
            f"chunk_length={self.chunk_length},max_windows={self.max_windows}"
        )
