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
from dataprep.image_header import open_image_file
from dataprep.readers.base import ImageRef
from dataprep.video_header import VideoHeader, probe_video, probe_video_bytes

__all__ = ["MediaItem", "media_modality", "probe_media"]


@dataclass(frozen=True, slots=True)
class MediaItem:
    """One video (``modality="video"``) or recording (``"audio"``) of a sample, and where it is."""

    modality: str
    ref: ImageRef


def _suffix(ref: ImageRef) -> str:
    name = os.path.basename(ref.path or ref.where)
    return name.rpartition(".")[2].lower() if "." in name else ""


def probe_media(item: MediaItem) -> tuple[VideoHeader | AudioHeader, os.stat_result | None]:
    """The item's header, and the status of the file it was read from (taken after the probe;
    None for bytes embedded in the record)."""
    ref = item.ref
    if ref.data is not None:
        if item.modality == "video":
            return probe_video_bytes(ref.data, ref.where), None
        return probe_audio_bytes(ref.data, ref.where, _suffix(ref)), None
    with open_image_file(ref.path, ref.root) as f:
        size = os.fstat(f.fileno()).st_size
        if item.modality == "video":
            header = probe_video(f, size, ref.where)
        else:
            header = probe_audio(f, size, ref.where, _suffix(ref))
        return header, os.fstat(f.fileno())


def media_modality(n_images: int, media: dict[str, list]) -> str:
    """A row's ``modality``: ``text``, ``image`` or ``multi-image`` as before, then ``video``
    and ``audio`` where the row has them, joined by ``+`` (``image+audio``)."""
    parts = [] if n_images == 0 else ["image" if n_images == 1 else "multi-image"]
    parts += [m for m in ("video", "audio") if media.get(m)]
    return "+".join(parts) or "text"
