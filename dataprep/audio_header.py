"""An audio file's sample rate, length and channels from its header, decoding no sample.

What a recording costs a Whisper-style encoder depends on its length at the model's sample
rate only: the processor resamples every input to 16 kHz (``ceil(frames * 16000 / rate)``
samples), averages its channels, cuts it into 10 ms hops. libsndfile (``soundfile``) reads
those from the header of WAV, FLAC, Ogg (Vorbis, Opus), MP3, AIFF and the other formats it
knows; ``frames`` is then the count a full decode yields, the count transformers' own loader
(``load_audio``: soundfile, then soxr) starts from.

Refused, each with a reason naming the file: a file libsndfile cannot parse
(``unreadable_audio``; AAC/M4A and other formats it does not read are ``unsupported_format``,
with the fix: convert to FLAC), a stream of no samples (``empty_audio``), a rate, channel count
or length past the bounds below (``audio_out_of_range``).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import BinaryIO

from dataprep.errors import SampleRejected
from equishard.common.errors import describe

__all__ = [
    "MAX_CHANNELS",
    "MAX_HOURS",
    "RATES",
    "AudioHeader",
    "probe_audio",
    "probe_audio_bytes",
    "probe_audio_path",
]

RATES = (1_000, 768_000)  # sample rates accepted (Hz), both ends included
MAX_CHANNELS = 64
MAX_HOURS = 48  # a longer claimed recording is a damaged or hostile header
# formats libsndfile does not read: the processors decode them through torchcodec/FFmpeg only
_NOT_READ = ("m4a", "mp4", "aac", "wma", "webm", "amr")


@dataclass(frozen=True, slots=True)
class AudioHeader:
    """One recording: ``frames`` samples per channel at ``sample_rate`` Hz."""

    nbytes: int
    sample_rate: int
    frames: int
    channels: int
    format: str

    @property
    def duration(self) -> float:
        return self.frames / self.sample_rate


def probe_audio(f: BinaryIO, nbytes: int, where: str, suffix: str = "") -> AudioHeader:
    """Probe an open audio file (or a window of a tar: ``read``/``seek``/``tell``) of
    ``nbytes`` bytes; ``suffix``: its file suffix, for the message of a format not read."""
    if nbytes == 0:
        raise SampleRejected("empty_audio", f"{where}: the file has zero bytes")
    if suffix.lower() in _NOT_READ:
        raise SampleRejected(
            "unsupported_format",
            f"{where}: .{suffix.lower()} audio is not read from its header here (libsndfile "
            "does not read it); convert it to FLAC or WAV (ffmpeg -i IN -c:a flac OUT.flac)",
        )
    import soundfile  # here: an image-only prep never loads libsndfile

    try:
        info = soundfile.info(f)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError, OSError) as exc:
        raise SampleRejected("unreadable_audio", f"{where}: {describe(exc)}") from None
    rate, frames, channels = int(info.samplerate), int(info.frames), int(info.channels)
    if not RATES[0] <= rate <= RATES[1]:
        raise SampleRejected(
            "audio_out_of_range",
            f"{where}: a sample rate of {rate} Hz (accepted: {RATES[0]} to {RATES[1]})",
        )
    if not 1 <= channels <= MAX_CHANNELS:
        raise SampleRejected(
            "audio_out_of_range", f"{where}: {channels} channels (accepted: 1 to {MAX_CHANNELS})"
        )
    if frames <= 0:
        raise SampleRejected("empty_audio", f"{where}: the stream has no samples")
    if frames > MAX_HOURS * 3600 * rate:
        raise SampleRejected(
            "audio_out_of_range",
            f"{where}: the header claims {frames / rate / 3600:.1f} hours (at most {MAX_HOURS})",
        )
    return AudioHeader(
        nbytes=nbytes, sample_rate=rate, frames=frames, channels=channels, format=info.format
    )


def probe_audio_bytes(data: bytes, where: str, suffix: str = "") -> AudioHeader:
    """Probe a recording held in memory (bytes embedded in a record)."""
    return probe_audio(io.BytesIO(data), len(data), where, suffix)


def probe_audio_path(path: str | os.PathLike, where: str | None = None) -> AudioHeader:
    """Probe an audio file on disk (tests and tools; prep opens files through its checks)."""
    suffix = os.fspath(path).rpartition(".")[2] if "." in os.path.basename(path) else ""
    with open(path, "rb") as f:
        return probe_audio(f, os.fstat(f.fileno()).st_size, where or os.fspath(path), suffix)
