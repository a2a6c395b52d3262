"""Probe a sample's videos and recordings where its record names them, under the image rules.

A video or audio item is found as an image is (:func:`dataprep.image_refs.image_ref`: a path
under ``--image-root``, embedded bytes, an HF struct) and opened as an image file is
(:func:`dataprep.image_header.open_image_file`: a regular file, non-blocking, inside the root
as opened), then its header is read (:mod:`dataprep.video_header`,
:mod:`dataprep.audio_header`). :func:`media_modality` names a row's modality from what it
holds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import BinaryIO

from dataprep.audio_header import AudioHeader, probe_audio, probe_audio_bytes
from dataprep.file_window import FileWindow
from dataprep.image_header import open_image_file
from dataprep.readers.base import ImageRef
from dataprep.video_header import VideoHeader, probe_video, probe_video_bytes

__all__ = [
    "MediaItem",
    "media_ext",
    "media_modality",
    "media_record",
    "media_signature",
    "open_media",
    "probe_media",
    "ref_suffix",
]

# a container FFmpeg names by its demuxer, as a file suffix (the first suffix of the name)
_CONTAINER_EXT = {
    "mov,mp4,m4a,3gp,3g2,mj2": "mp4",
    "matroska,webm": "mkv",
    "avi": "avi",
    "mpegts": "ts",
    "mpeg": "mpg",
    "flv": "flv",
    "yuv4mpegpipe": "y4m",
}
_AUDIO_EXT = {
    "WAV": "wav",
    "WAVEX": "wav",
    "FLAC": "flac",
    "OGG": "ogg",
    "MP3": "mp3",
    "AIFF": "aiff",
}


@dataclass(frozen=True, slots=True)
class MediaItem:
    """One video (``modality="video"``) or recording (``"audio"``) of a sample, and where it is."""

    modality: str
    ref: ImageRef


def ref_suffix(ref: ImageRef) -> str:
    """The lower-case suffix of the file an item names ('' for none)."""
    name = os.path.basename(ref.path or ref.where)
    return name.rpartition(".")[2].lower() if "." in name else ""


def _probe(item: MediaItem, source, size: int) -> VideoHeader | AudioHeader:
    ref = item.ref
    if item.modality == "video":
        return probe_video(source, size, ref.where)
    return probe_audio(source, size, ref.where, ref_suffix(ref))


def open_media(
    item: MediaItem,
) -> tuple[VideoHeader | AudioHeader, BinaryIO | None, int, os.stat_result | None]:
    """The item's header, probed from the file opened as prep opens it (a file of its own,
    confined to the root as opened, or a member of a tar read in place), with that file
    positioned where the item's bytes begin, their size, and the file's status taken when it
    was opened: the bytes a writer then streams are the bytes probed. The caller closes the
    file; an item of bytes embedded in the record has none (None, its length, None)."""
    ref = item.ref
    if ref.data is not None:
        if item.modality == "video":
            return probe_video_bytes(ref.data, ref.where), None, len(ref.data), None
        return probe_audio_bytes(ref.data, ref.where, ref_suffix(ref)), None, len(ref.data), None
    f = open_image_file(ref.path, ref.root) if ref.size is None else open(ref.path, "rb")  # noqa: SIM115
    try:
        st = os.fstat(f.fileno())
        size = st.st_size if ref.size is None else ref.size
        header = _probe(item, f if ref.size is None else FileWindow(f, ref.offset, ref.size), size)
        f.seek(ref.offset if ref.size is not None else 0)
    except BaseException:
        f.close()
        raise
    return header, f, size, st


def probe_media(item: MediaItem) -> tuple[VideoHeader | AudioHeader, os.stat_result | None]:
    """The item's header, and the status of the file it was read from (taken after the probe;
    None for bytes embedded in the record)."""
    header, f, _, _ = open_media(item)
    if f is None:
        return header, None
    with f:
        return header, os.fstat(f.fileno())


def media_modality(n_images: int, media: dict[str, list]) -> str:
    """A row's ``modality``: ``text``, ``image`` or ``multi-image`` as before, then ``video``
    and ``audio`` where the row has them, joined by ``+`` (``image+audio``)."""
    parts = [] if n_images == 0 else ["image" if n_images == 1 else "multi-image"]
    parts += [m for m in ("video", "audio") if media.get(m)]
    return "+".join(parts) or "text"


def media_signature(header: VideoHeader | AudioHeader) -> str:
    """What a sample's fingerprint takes of one video or recording: its bytes and everything
    its cost follows from (write compares it with what it copies)."""
    if isinstance(header, VideoHeader):
        return f"|v{header.nbytes}:{header.frames}:{header.fps!r}:{header.width}x{header.height}"
    return f"|a{header.nbytes}:{header.sample_rate}:{header.frames}:{header.channels}"


def media_ext(header: VideoHeader | AudioHeader, ref: ImageRef) -> str:
    """The suffix its member gets in a shard: the file's own where it names a known format,
    else the format its header says (``mp4``, ``mkv``, ``flac``...)."""
    from equishard.contracts.media import AUDIO, VIDEO

    own = ref_suffix(ref)
    modality = VIDEO if isinstance(header, VideoHeader) else AUDIO
    if own in modality.suffixes:
        return own
    if isinstance(header, VideoHeader):
        return _CONTAINER_EXT.get(header.container, "bin")
    return _AUDIO_EXT.get(header.format, "bin")


def media_record(header: VideoHeader | AudioHeader) -> dict:
    """A video's or recording's header, as a sample's document carries it beside the member."""
    if isinstance(header, VideoHeader):
        return {
            "frames": header.frames,
            "fps": header.fps,
            "width": header.width,
            "height": header.height,
            "duration": header.duration,
            "codec": header.codec,
        }
    return {
        "sample_rate": header.sample_rate,
        "frames": header.frames,
        "channels": header.channels,
        "duration": header.duration,
    }
