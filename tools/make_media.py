"""Real encoded videos and audio files for the exact-count tests: ``make_videos``, ``make_audios``.

Every file is encoded for real (PyAV for video, libsndfile for audio) from a seeded draw, so the
same seed gives the same set: several codecs and containers (H.264, HEVC, MPEG-4, VP8, VP9,
MJPEG, MPEG-2 in MP4, MOV, Matroska, WebM, AVI, MPEG-TS), 0.5 s to 30 min, 1 to 60 fps,
landscape, portrait and extreme frame sizes, rotation metadata, variable frame rates; audio in
WAV, FLAC, MP3 and Ogg (Vorbis, Opus), 8 to 48 kHz, one to six channels, 0.1 s to 2 h. Frames
are flat gray and audio is a quiet tone: the encoders are fast on them, and what is measured
(frame counts, rates, sizes, sample counts) does not depend on the picture or the sound.

    python tools/make_media.py OUT_DIR [--videos 200] [--audios 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import soundfile

# (container suffix, codec, pixel format); each codec in containers that take it
VIDEO_KINDS = (
    ("mp4", "libx264", "yuv420p"),
    ("mkv", "libx264", "yuv420p"),
    ("mov", "libx264", "yuv420p"),
    ("mp4", "libx265", "yuv420p"),
    ("mp4", "mpeg4", "yuv420p"),
    ("avi", "mpeg4", "yuv420p"),
    ("webm", "libvpx", "yuv420p"),
    ("webm", "libvpx-vp9", "yuv420p"),
    ("mkv", "libvpx-vp9", "yuv420p"),
    ("avi", "mjpeg", "yuvj420p"),
    ("ts", "mpeg2video", "yuv420p"),
)
RATES = (1, 2, 5, 8, 10, 12, 15, Fraction(24000, 1001), 24, 25, Fraction(30000, 1001), 30, 50, 60)
MPEG2_RATES = (24, 25, 30, 50, 60, Fraction(30000, 1001))  # the rates its syntax has
MAX_FRAMES = 600  # each file but the 30-minute one encodes at most this many frames (quick)
FAST = {
    "libvpx": {"deadline": "realtime", "cpu-used": "8"},
    "libvpx-vp9": {"deadline": "realtime", "cpu-used": "8"},
    "libx264": {"preset": "ultrafast"},
    "libx265": {"preset": "ultrafast", "x265-params": "log-level=error"},
}


@dataclass(frozen=True)
class VideoSpec:
    name: str
    codec: str
    pix_fmt: str
    width: int
    height: int
    fps: str  # a fraction, "30000/1001"
    frames: int
    rotation: int = 0
    vfr: bool = False


@dataclass(frozen=True)
class AudioSpec:
    name: str
    subtype: str
    rate: int
    channels: int
    frames: int


def _even(n: int) -> int:
    return max(2, n - n % 2)


def draw_videos(n: int, seed: int = 0) -> list[VideoSpec]:
    """``n`` video specs: every kind in turn, the rest drawn."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        suffix, codec, pix = VIDEO_KINDS[i % len(VIDEO_KINDS)]
        rate = Fraction(rng.choice(MPEG2_RATES if codec == "mpeg2video" else RATES))
        seconds = math.exp(rng.uniform(math.log(0.5), math.log(1800)))
        if i == 1:
            seconds, rate = 1800.0, Fraction(1)  # 30 minutes
        if i == 2:
            seconds, rate = 0.5, Fraction(60)
        frames = max(1, min(MAX_FRAMES if i != 1 else 1800, round(seconds * rate)))
        shape = rng.random()
        if frames <= 6 and shape < 0.3:  # a few large frames: 4K and beyond, still quick
            w, h = rng.choice([(3840, 2160), (2160, 3840), (4096, 2304), (7680, 432)])
        elif shape < 0.4:  # portrait
            w, h = rng.randint(16, 240), rng.randint(240, 640)
        elif shape < 0.5:  # extreme aspect
            w, h = rng.choice([(640, 16), (16, 640), (1280, 24), (600, 8)])
        else:
            w, h = rng.randint(16, 480), rng.randint(16, 360)
        if codec == "libx265":
            w, h = max(w, 64), max(h, 64)  # its smallest frame
        rotation = rng.choice([0, 0, 90, 180, 270]) if suffix in ("mp4", "mov") else 0
        vfr = suffix in ("mp4", "mkv") and codec == "libx264" and rng.random() < 0.5
        out.append(
            VideoSpec(
                name=f"v{i:03d}.{suffix}",
                codec=codec,
                pix_fmt=pix,
                width=_even(w),
                height=_even(h),
                fps=f"{rate.numerator}/{rate.denominator}",
                frames=frames,
                rotation=rotation,
                vfr=vfr,
            )
        )
    return out


def encode_video(spec: VideoSpec, path: Path) -> None:
    """Encode ``spec`` to ``path`` (flat gray frames; VFR: irregular gaps between frames)."""
    rate = Fraction(spec.fps)
    with av.open(str(path), "w") as c:
        if spec.vfr:
            s = c.add_stream(spec.codec, rate=rate)
            s.codec_context.time_base = Fraction(1, 1000)
        else:
            s = c.add_stream(spec.codec, rate=rate)
        s.width, s.height, s.pix_fmt = spec.width, spec.height, spec.pix_fmt
        s.options = FAST.get(spec.codec, {})
        if spec.rotation:
            s.set_display_rotation(spec.rotation)
        gray = av.VideoFrame.from_ndarray(
            np.full((spec.height, spec.width, 3), 128, np.uint8), format="rgb24"
        ).reformat(format=spec.pix_fmt)
        t = 0
        for k in range(spec.frames):
            frame = gray
            if spec.vfr:
                frame.pts = t
                t += int(1000 / rate * (0.5 if k % 3 else 2))  # gaps of 1/2 and 2 frames
                frame.time_base = Fraction(1, 1000)
            else:
                frame.pts = k
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


# (suffix, libsndfile subtype)
AUDIO_KINDS = (
    ("wav", "PCM_16"),
    ("flac", "PCM_16"),
    ("mp3", "MPEG_LAYER_III"),
    ("ogg", "VORBIS"),
    ("ogg", "OPUS"),
    ("wav", "FLOAT"),
    ("flac", "PCM_24"),
)
AUDIO_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


def draw_audios(n: int, seed: int = 0) -> list[AudioSpec]:
    rng = random.Random(seed + 1)
    out = []
    for i in range(n):
        suffix, subtype = AUDIO_KINDS[i % len(AUDIO_KINDS)]
        rate = rng.choice(AUDIO_RATES)
        if subtype == "OPUS":
            rate = rng.choice((8000, 12000, 16000, 24000, 48000))  # the rates Opus takes
        seconds = math.exp(rng.uniform(math.log(0.1), math.log(120)))
        if i == 1:
            seconds, rate, subtype, suffix = 7200.0, 8000, "PCM_16", "flac"  # two hours
        channels = rng.choice((1, 1, 1, 2, 2, 6))
        out.append(
            AudioSpec(
                name=f"a{i:03d}.{suffix}",
                subtype=subtype,
                rate=rate,
                channels=channels if suffix != "mp3" else min(channels, 2),
                frames=max(1, round(seconds * rate)),
            )
        )
    return out


def encode_audio(spec: AudioSpec, path: Path) -> None:
    """Write ``spec`` to ``path`` in blocks (a two-hour file never sits in memory whole)."""
    block = 1 << 20
    tone = 0.1 * np.sin(2 * np.pi * 440 * np.arange(block) / spec.rate).astype(np.float32)
    data = np.repeat(tone[:, None], spec.channels, axis=1)
    with soundfile.SoundFile(
        str(path), "w", samplerate=spec.rate, channels=spec.channels, subtype=spec.subtype
    ) as f:
        left = spec.frames
        while left:
            k = min(block, left)
            f.write(data[:k])
            left -= k


def make_videos(out: Path, n: int, seed: int = 0) -> list[VideoSpec]:
    out.mkdir(parents=True, exist_ok=True)
    specs = draw_videos(n, seed)
    av.logging.set_level(av.logging.ERROR)
    for spec in specs:
        encode_video(spec, out / spec.name)
    return specs


def make_audios(out: Path, n: int, seed: int = 0) -> list[AudioSpec]:
    out.mkdir(parents=True, exist_ok=True)
    specs = draw_audios(n, seed)
    for spec in specs:
        encode_audio(spec, out / spec.name)
    return specs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--videos", type=int, default=200)
    ap.add_argument("--audios", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    videos = make_videos(args.out, args.videos, args.seed)
    audios = make_audios(args.out, args.audios, args.seed)
    (args.out / "media.json").write_text(
        json.dumps({"videos": [asdict(v) for v in videos], "audios": [asdict(a) for a in audios]})
    )
    print(f"{len(videos)} videos, {len(audios)} audio files in {args.out}")


if __name__ == "__main__":
    main()
