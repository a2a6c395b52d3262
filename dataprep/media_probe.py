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


def probe_media(item: MediaItem) -> tuple[VideoHeader | AudioHeader, os.stat_result | None]:
    """The item's header, and the status of the file it was read from (taken after the probe;
    None for bytes embedded in the record)."""
    ref = item.ref
    if ref.data is not None:
        if item.modality == "video":
            return probe_video_bytes(ref.data, ref.where), None
        return probe_audio_bytes(ref.data, ref.where, ref_suffix(ref)), None
    if ref.size is not None:  # a member of a tar: read in place
        with open(ref.path, "rb") as f:
            window = FileWindow(f, ref.offset, ref.size)
            if item.modality == "video":
                header = probe_video(window, ref.size, ref.where)
            else:
                header = probe_audio(window, ref.size, ref.where, ref_suffix(ref))
            return header, os.fstat(f.fileno())
    with open_image_file(ref.path, ref.root) as f:
        size = os.fstat(f.fileno()).st_size
        if item.modality == "video":
            header = probe_video(f, size, ref.where)
        else:
            header = probe_audio(f, size, ref.where, ref_suffix(ref))
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
