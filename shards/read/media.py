"""Decode a sample's video and audio members, for a loop that wants pixels and waveforms.

The loader yields a video's and a recording's bytes as the shard holds them
(``sample.videos``, ``sample.audios``); most training code hands those to its model's own
processor or loader (qwen-vl-utils, transformers' ``load_video``/``load_audio``), which decide
the frames and the rate the model was measured with. These helpers decode them with the same
maintained decoders prep reads headers with: PyAV (FFmpeg) for video, libsndfile for audio.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

__all__ = ["decode_audio", "decode_video"]


def decode_video(data: bytes, indices: Sequence[int] | None = None) -> np.ndarray:
    """The video's frames as a ``[frames, height, width, 3]`` uint8 RGB array (the coded frame,
    as the processors' readers give it); ``indices``: only those frames, in that order (the
    ones a processor samples), decoding stops after the last one asked for."""
    import av

    want = None if indices is None else sorted(set(int(i) for i in indices))
    frames: dict[int, np.ndarray] = {}
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        for k, frame in enumerate(container.decode(stream)):
            if want is None or k in want:
                frames[k] = frame.to_ndarray(format="rgb24")
            if want is not None and k >= want[-1]:
                break
    if indices is None:
        order = sorted(frames)
    else:
        missing = [i for i in indices if i not in frames]
        if missing:
            raise IndexError(
                f"the video has {len(frames) and max(frames) + 1} frames, no {missing[:3]}"
            )
        order = list(indices)
    if not order:
        return np.zeros((0, 0, 0, 3), np.uint8)
    return np.stack([frames[k] for k in order])


def decode_audio(data: bytes) -> tuple[np.ndarray, int]:
    """The recording as a ``[frames, channels]`` float32 array and its sample rate (resample
    and average the channels as your model's feature extractor does)."""
    import soundfile

    wave, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return wave, int(rate)
