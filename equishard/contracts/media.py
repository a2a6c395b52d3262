"""The media a sample can carry, one :class:`Modality` each, and which of them prep measures.

A modality is named here once with every way a raw record shows it: the record fields that
hold it (``image``, ``video``, ``audio``, and the aliases datasets use), the placeholders that
stand for it in a turn's text (``<image>``, ``<video>``, ``<|AUDIO|>``...), the ``type`` of a
chat message's content part, and the file suffixes of its WebDataset members. Prep measures
the modalities in :data:`MEASURED`, and video or audio in a run given a rule for it (``prep
--video-rule``, ``--audio-rule``); a sample that carries any other is refused with reason
``unsupported_modality`` (see :mod:`dataprep.media`), never counted as text. The readers, the
refusal and the shard readers take their vocabulary from here.

This module imports nothing, so the loader can use it without loading the prep pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AUDIO",
    "IMAGE",
    "IMAGE_SUFFIXES",
    "MEASURED",
    "MODALITIES",
    "VIDEO",
    "Modality",
    "content_modality",
    "field_modality",
    "suffix_format",
    "suffix_modality",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Modality:
    """One kind of media. ``read_fields`` are the record fields prep reads it from when it
    measures it; ``alias_fields`` other field names datasets give it; ``placeholders`` the
    texts that stand for it in a turn (the first one is prep's own: ``<image>``, ``<video>``,
    ``<audio>``); ``suffixes`` the member suffixes prep reads, ``other_suffixes`` those of
    formats prep cannot read."""

    name: str
    read_fields: tuple[str, ...] = ()
    alias_fields: tuple[str, ...] = ()
    placeholders: tuple[str, ...] = ()
    content_types: tuple[str, ...] = ()
    suffixes: tuple[str, ...] = ()
    other_suffixes: tuple[str, ...] = ()


IMAGE = Modality(
    name="image",
    read_fields=("image", "images"),
    alias_fields=("img", "imgs", "image_path", "image_paths", "image_file", "image_files"),
    placeholders=("<image>",),
    content_types=("image", "image_url"),
    suffixes=("jpg", "jpeg", "png", "webp", "gif", "bmp"),
    other_suffixes=("tif", "tiff", "avif", "heic", "heif", "jp2", "jxl", "ico", "svg"),
)
VIDEO = Modality(
    name="video",
    read_fields=("video", "videos"),
    alias_fields=("video_path", "video_paths", "video_file", "video_url"),
    # LLaVA-Video / LLaVA-OneVision / InternVL, Qwen2-VL's pad token, Qwen2.5-Omni's
    placeholders=("<video>", "<|video_pad|>", "<|VIDEO|>"),
    content_types=("video", "video_url"),
    suffixes=("mp4", "m4v", "mkv", "webm", "avi", "mov", "mpg", "mpeg", "ts", "flv", "3gp"),
    other_suffixes=("wmv",),
)
AUDIO = Modality(
    name="audio",
    read_fields=("audio", "audios"),
    alias_fields=(
        "audio_path",
        "audio_paths",
        "audio_file",
        "audio_url",
        "speech",
        "sound",
        "wav",
    ),
    # LLaVA-style and speech LLMs, Qwen2-Audio / Qwen2.5-Omni, Qwen3-Omni, Gemma 3n
    placeholders=("<audio>", "<speech>", "<|AUDIO|>", "<|audio_pad|>", "<audio_soft_token>"),
    content_types=("audio", "audio_url", "input_audio"),
    suffixes=("wav", "flac", "mp3", "ogg", "opus", "aif", "aiff"),
    other_suffixes=("m4a", "aac", "wma"),
)

MODALITIES: tuple[Modality, ...] = (IMAGE, VIDEO, AUDIO)
# the modalities prep measures by default; a run given a video or audio rule measures those too
MEASURED: frozenset[str] = frozenset({"image"})
IMAGE_SUFFIXES: tuple[str, ...] = IMAGE.suffixes

_FIELDS = {f: m for m in MODALITIES for f in (*m.read_fields, *m.alias_fields)}
_CONTENT = {t: m for m in MODALITIES for t in m.content_types}
_SUFFIXES = {s: m for m in MODALITIES for s in (*m.suffixes, *m.other_suffixes)}


def field_modality(name: str) -> Modality | None:
    """The modality a record field of this name holds (any case), or None."""
    return _FIELDS.get(name.lower())


def content_modality(part_type: str) -> Modality | None:
    """The modality of a chat content part of this ``type``, or None."""
    return _CONTENT.get(part_type)


def suffix_format(suffix: str) -> str:
    """A WebDataset member suffix's file format: its last part, lower case (``0.WAV``: wav)."""
    return suffix.rpartition(".")[2].lower()


def suffix_modality(suffix: str) -> Modality | None:
    """The modality of a WebDataset member with this suffix (``mp4``, ``0.wav``, any case)."""
    return _SUFFIXES.get(suffix_format(suffix))
