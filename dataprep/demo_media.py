"""The demo's videos and recordings (``equishard demo --media``): small real files that some
demo samples reference instead of images, so ``make shards`` runs every phase (the vision
tower on images and video frames, the audio encoder, the LLM) on files prep really probes.

Videos are H.264 in MP4 (PyAV), 160x96 to 320x240, 8 to 30 fps, 1.5 to 8 seconds: a moving
gradient, so the encoder has real work. Recordings are 16-bit FLAC or WAV (libsndfile) at 8 to
48 kHz, mono or stereo, 1 to 35 seconds (LibriSpeech-like): a few tones with noise. The same
seed gives the same files, small enough (tens of kB each) that the demo stays fast.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

__all__ = ["MEDIA_DIR", "write_audios", "write_videos"]

MEDIA_DIR = "media"
SIZES = ((160, 96), (240, 136), (320, 240), (128, 224))  # the last portrait
RATES = (8, 12, 24, 30)
AUDIO_RATES = (8000, 16000, 22050, 44100, 48000)


def _video(path: Path, width: int, height: int, fps: int, frames: int, phase: float) -> None:
    import av

    y, x = np.mgrid[0:height, 0:width]
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "35"}
        for k in range(frames):
            shade = (x + y + 4 * k + phase) % 256
            rgb = np.stack([shade, 255 - shade, (shade * 2) % 256], axis=2).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = k
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def write_videos(out: Path, rng: np.random.Generator, count: int) -> list[str]:
    """Write ``count`` clips under ``out/media``; their names relative to ``out``."""
    (out / MEDIA_DIR).mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(count):
        width, height = SIZES[int(rng.integers(0, len(SIZES)))]
        fps = int(RATES[int(rng.integers(0, len(RATES)))])
        seconds = float(rng.uniform(1.5, 8.0))
        name = f"{MEDIA_DIR}/clip-{i:03d}.mp4"
        _video(out / name, width, height, fps, max(2, round(seconds * fps)), float(i * 37))
        names.append(name)
    return names


def write_audios(out: Path, rng: np.random.Generator, count: int) -> list[str]:
    """Write ``count`` recordings under ``out/media``; their names relative to ``out``."""
    import soundfile

    (out / MEDIA_DIR).mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(count):
        rate = int(AUDIO_RATES[int(rng.integers(0, len(AUDIO_RATES)))])
        seconds = float(np.clip(rng.gamma(9.0, 1.4), 1.0, 35.0))
        channels = 2 if rng.random() < 0.2 else 1
        t = np.arange(round(seconds * rate)) / rate
        tone = sum(np.sin(2 * np.pi * f * t) for f in rng.uniform(110, 880, 3)) / 4
        wave = tone + rng.normal(0, 0.02, t.size)
        data = np.repeat(wave[:, None], channels, axis=1).astype(np.float32)
        suffix = "flac" if i % 3 else "wav"
        name = f"{MEDIA_DIR}/speech-{i:03d}.{suffix}"
        soundfile.write(out / name, data, rate, subtype="PCM_16")
        names.append(name)
    return names
