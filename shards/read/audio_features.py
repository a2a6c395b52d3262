"""A recording's log-mel features as a Whisper-style processor makes them, for the collator of
``equishard train``: the frames prep counted, no more, no fewer.

The generation records the audio rule prep measured with (``whisper:sampling_rate=...,
hop_length=...,chunk_length=...,n_window=...``, or ``qwen2audio`` and ``qwen2_5_omni`` by
name). Its recording is loaded as transformers' ``load_audio`` loads it (libsndfile, its
channels averaged, resampled by soxr to ``ceil(frames * rate / its rate)`` samples: the length prep
counted), cut at ``chunk_length`` seconds, and turned into log-mel frames by transformers'
``WhisperFeatureExtractor``, the feature extractor of Qwen2-Audio's and Qwen2.5-Omni's
processors: the processors' own steps.

The processor pads to the whole window. The frames inside the recording's mask are the same
with a shorter padding (a frame's window reaches ``n_fft / 2`` samples past its centre, and
zeros follow in both), so only ``n_fft`` samples of zeros are added, up to the window: a 3-s
clip under a 300-s rule costs 3 s of spectrogram, not 300. The frames kept are the mask's,
``ceil(samples / hop_length)``, as the unpadded encoder takes them (the padded one pads them
to its window itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataprep.media_rules.whisper_audio import WhisperAudioRule
from equishard.common.values import check_count

__all__ = ["MAX_MEL", "N_FFT", "AudioFeatures"]

N_FFT = 400  # Whisper's window: 25 ms at 16 kHz, every Whisper-style processor's
MAX_MEL = 1024  # log-mel bins of an audio encoder (Whisper's 80, Qwen2-Audio's 128)


def _extractor(rule: WhisperAudioRule, mel: int):
    try:
        from transformers import WhisperFeatureExtractor
    except ImportError:
        raise ImportError(
            "a generation with recordings needs transformers' WhisperFeatureExtractor (the "
            "processors' own log-mel features) to train: pip install 'equishard[hf]'"
        ) from None
    return WhisperFeatureExtractor(
        feature_size=mel,
        sampling_rate=rule.sampling_rate,
        hop_length=rule.hop_length,
        chunk_length=rule.chunk_length,
        n_fft=N_FFT,
    )


@dataclass(frozen=True, kw_only=True)
class AudioFeatures:
    """``rule``'s features of one recording with ``mel`` bins: ``[frames, mel]`` float32."""

    rule: WhisperAudioRule
    mel: int = 128

    def __post_init__(self) -> None:
        if not isinstance(self.rule, WhisperAudioRule):
            raise ValueError(
                f"audio rule {self.rule.spec()!r} is not a Whisper-style encoder's: equishard "
                "train builds Whisper log-mel features only (rules whisper, qwen2audio, "
                "qwen2_5_omni); train this generation with its model's own processor"
            )
        check_count("audio mel bins", self.mel, 1, MAX_MEL)
        object.__setattr__(self, "_fe", _extractor(self.rule, self.mel))

    def wave(self, data: bytes) -> np.ndarray:
        """The recording at the rule's rate, channels averaged, cut at ``chunk_length`` s (a
        windows rule's: at ``max_windows`` windows):
        the steps of transformers' ``load_audio`` (libsndfile; soxr's high-quality resampler,
        padded or cut to ``ceil(frames * rate / its rate)``), the processors' own loader."""
        from shards.read.media import decode_audio

        wave, rate = decode_audio(data)
        mono = wave.mean(axis=1)  # one channel's mean is the channel itself, exactly
        want = self.rule.sampling_rate
        if rate != want:
            try:
                import soxr
            except ImportError:
                raise ImportError(
                    "recordings are resampled as the processors resample them, with soxr: "
                    "pip install 'equishard[hf]'"
                ) from None
            n = -(-len(mono) * want // rate)
            mono = soxr.resample(mono, rate, want, quality="soxr_hq")
            mono = np.pad(mono, (0, max(0, n - len(mono))))[:n]
        return np.ascontiguousarray(mono[: self.rule.max_samples], dtype=np.float32)

    def frames(self, samples: int) -> int:
        """The mask's frames of ``samples`` samples (prep's count)."""
        return -(-samples // self.rule.hop_length)

    def _features(self, wave: np.ndarray, samples: int) -> np.ndarray:
        """The extractor's ``[mel, frames]`` of ``wave`` padded with zeros to ``samples``."""
        (out,) = self._fe(
            wave,
            sampling_rate=self.rule.sampling_rate,
            padding="max_length",
            max_length=samples,
            truncation=True,
            return_tensors="np",
        )["input_features"]
        return out

    def __call__(self, data: bytes) -> np.ndarray:
        wave = self.wave(data)
        n = self.frames(len(wave))  # none for an empty recording: its padding's are cut away
        # the whole window where the recording fills it (the processor's own array, its end
        # reflected as the processor reflects it), else n_fft zeros past its last frame
        window = self.rule.chunk_length * self.rule.sampling_rate
        out = self._features(wave, min(n * self.rule.hop_length + N_FFT, window))
        return np.ascontiguousarray(out[:, :n].T, dtype=np.float32)

    def window(self, data: bytes) -> tuple[np.ndarray, int]:
        """The recording's whole window as the processor pads it (``[window frames, mel]``:
        the frames past the recording are the extractor's of its zeros, which a padded
        encoder's convolutions read beside the last frames) and the mask's frames."""
        wave = self.wave(data)
        out = self._features(wave, self._fe.n_samples)  # chunk_length s at the rule's rate
        return np.ascontiguousarray(out.T, dtype=np.float32), self.frames(len(wave))

    def windows(self, data: bytes) -> list[tuple[np.ndarray, int]]:
        """The recording cut into windows of ``chunk_length`` seconds (an empty one is one
        window), each as the processor pads it (``[window frames, mel]``: a window's own
        extractor call, as Audio Flamingo 3's processor makes one a window) with its mask's
        frames."""
        wave = self.wave(data)
        size = self.rule.chunk_length * self.rule.sampling_rate
        cuts = [wave[i : i + size] for i in range(0, len(wave), size)] or [wave]
        out = []
        for cut in cuts:
            feats = self._features(cut, self._fe.n_samples)
            out.append((np.ascontiguousarray(feats.T, dtype=np.float32), self.frames(len(cut))))
        return out
