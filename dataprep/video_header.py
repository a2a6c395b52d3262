"""A video's frame count, frame rate and frame size from its container, decoding no frame.

What a video costs a model depends on how many frames its processor samples (from the frame
count and the frame rate) and the size each frame is resized to (from the coded frame size).
PyAV reads those from the container's header: the stream's frame count (an MP4's sample
table, what decord's ``len(reader)`` and torchcodec's ``num_frames`` report), its average rate
and the codec's frame size. A container whose header has no frame count (Matroska/WebM, some
AVI and MPEG-TS files) has its packets counted instead: a packet scan demuxes, it never
decodes. The scan is bounded (:data:`MAX_SCAN_PACKETS`, :data:`MAX_SCAN_SECONDS`), so a hostile
file cannot hold a worker.

Refused, each with a reason naming the file: a file FFmpeg cannot open (``unreadable_video``:
truncated before its header, not a video), a container without a video stream
(``no_video_stream``: an audio-only MP4), a stream of no frames (``empty_video``), a claimed
frame size past :data:`MAX_SIDE` or a frame count past :data:`MAX_FRAMES` (``video_too_large``),
a scan past its bounds (``probe_limit``).

The rotation a container may record (a display matrix) is not read: FFmpeg gives it with a
decoded frame only, and the readers the processors use (decord, PyAV's ``to_ndarray``) hand the
model the coded frame, unrotated. A rule whose count is not symmetric in height and width
would need it; the Qwen rule's is (:mod:`dataprep.media_rules.qwen_video`).
"""

from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import BinaryIO

from dataprep.errors import SampleRejected
from equishard.common.errors import describe

__all__ = [
    "MAX_FRAMES",
    "MAX_SIDE",
    "VideoHeader",
    "probe_video",
    "probe_video_bytes",
    "probe_video_path",
]

MAX_SIDE = 16384  # a claimed frame side above this is a damaged or hostile header
MAX_FRAMES = 10_000_000  # 46 hours at 60 fps
MAX_SCAN_PACKETS = 4_000_000  # a header without a frame count: packets counted at most
MAX_SCAN_SECONDS = 20.0  # and for at most this long
_CHECK_EVERY = 4096  # packets between two checks of those bounds


@dataclass(frozen=True, slots=True)
class VideoHeader:
    """One video stream as its container describes it. ``width``/``height``: the coded frame
    size; ``frames``: the stream's frame count; ``fps``: its average frame rate; ``duration``:
    seconds (``frames / fps`` where the header has none); ``counted``: True where the frames
    were counted from packets, the header having no count."""

    nbytes: int
    width: int
    height: int
    frames: int
    fps: float
    duration: float
    codec: str
    container: str
    counted: bool = False


def _count_packets(container, stream, where: str) -> tuple[int, float]:
    """(frames, seconds) of ``stream`` from its packets: demuxed, never decoded."""
    deadline = time.monotonic() + MAX_SCAN_SECONDS
    n = 0
    first = last = None
    for packet in container.demux(stream):
        if packet.size == 0:  # the demuxer's end-of-stream flush packet
            continue
        n += 1
        if packet.pts is not None:
            end = packet.pts + (packet.duration or 0)
            first = packet.pts if first is None else min(first, packet.pts)
            last = end if last is None else max(last, end)
        if n % _CHECK_EVERY == 0 and (n >= MAX_SCAN_PACKETS or time.monotonic() > deadline):
            raise SampleRejected(
                "probe_limit",
                f"{where}: the header has no frame count and counting its packets went past "
                f"{MAX_SCAN_PACKETS} packets or {MAX_SCAN_SECONDS:g} s; remux it (ffmpeg -c copy "
                "out.mp4) so that its header counts its frames",
            )
    seconds = 0.0
    if first is not None and stream.time_base is not None:
        seconds = float((last - first) * stream.time_base)
    return n, seconds


def _probe(source, nbytes: int, where: str) -> VideoHeader:
    import av  # here: an image-only prep never loads FFmpeg

    try:
        container = av.open(source, mode="r", metadata_errors="ignore")
    except (av.FFmpegError, OSError, ValueError, EOFError) as exc:
        raise SampleRejected("unreadable_video", f"{where}: {describe(exc)}") from None
    try:
        if not container.streams.video:
            kinds = sorted({s.type for s in container.streams}) or ["none"]
            raise SampleRejected(
                "no_video_stream",
                f"{where}: the container has no video stream (its streams: {', '.join(kinds)})",
            )
        stream = container.streams.video[0]
        ctx = stream.codec_context
        width, height = int(ctx.width or 0), int(ctx.height or 0)
        if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
            reason = "video_too_large" if max(width, height) > MAX_SIDE else "unreadable_video"
            raise SampleRejected(
                reason,
                f"{where}: the stream claims a {width}x{height} frame (each side must be 1 to "
                f"{MAX_SIDE} px)",
            )
        frames = int(stream.frames or 0)
        rate = stream.average_rate
        duration = None
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / av.time_base
        counted = False
        if frames <= 0 or not rate:
            counted = True
            frames, scanned = _count_packets(container, stream, where)
            if not duration or duration <= 0:
                duration = scanned
        if frames <= 0:
            raise SampleRejected("empty_video", f"{where}: the video stream has no frames")
        if frames > MAX_FRAMES:
            raise SampleRejected(
                "video_too_large",
                f"{where}: the stream claims {frames} frames (at most {MAX_FRAMES})",
            )
        if rate and Fraction(rate) > 0:
            fps = float(rate)
        elif duration and duration > 0:
            fps = frames / duration
        else:
            raise SampleRejected(
                "unreadable_video", f"{where}: the stream has neither a frame rate nor a duration"
            )
        if not duration or duration <= 0:
            duration = frames / fps
        return VideoHeader(
            nbytes=nbytes,
            width=width,
            height=height,
            frames=frames,
            fps=fps,
            duration=duration,
            codec=ctx.name,
            container=container.format.name,
            counted=counted,
        )
    except (av.FFmpegError, EOFError) as exc:  # a scan that meets damaged packets
        raise SampleRejected("unreadable_video", f"{where}: {describe(exc)}") from None
    finally:
        container.close()


def probe_video(f: BinaryIO, nbytes: int, where: str) -> VideoHeader:
    """Probe an open video file (or a window of a tar: ``read``/``seek``/``tell``) of
    ``nbytes`` bytes."""
    if nbytes == 0:
        raise SampleRejected("empty_video", f"{where}: the file has zero bytes")
    return _probe(f, nbytes, where)


def probe_video_bytes(data: bytes, where: str) -> VideoHeader:
    """Probe a video held in memory (bytes embedded in a record)."""
    return probe_video(io.BytesIO(data), len(data), where)


def probe_video_path(path: str | os.PathLike, where: str | None = None) -> VideoHeader:
    """Probe a video file on disk (tests and tools; prep opens files through its checks)."""
    with open(path, "rb") as f:
        return probe_video(f, os.fstat(f.fileno()).st_size, where or os.fspath(path))
