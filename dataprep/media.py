"""Refuse a sample that carries media prep does not measure, instead of counting it as text.

A LLaVA-Video record (``"video": "clip.mp4"``, ``<video>`` in the prompt) would otherwise be
measured as its text alone: a 64-second clip that Qwen2.5-VL sees as 8,960 LLM tokens would get
a row of 34 text tokens and be balanced as a caption. Every way a record can carry a modality
is looked at (:mod:`equishard.contracts.media` names them): a field, a chat content part, a
WebDataset member, a placeholder in a turn's text. A modality outside
:data:`~equishard.contracts.media.MEASURED` rejects the sample (``unsupported_modality``); an
image under a field prep does not read, with no image where prep reads them, rejects it too
(``unread_media_field``), as does an image member in a format prep cannot read
(``unsupported_format``).
"""

from __future__ import annotations

import re
from typing import Any

from dataprep.errors import SampleRejected
from equishard.contracts.media import (
    AUDIO,
    MEASURED,
    MODALITIES,
    Modality,
    content_modality,
    field_modality,
    suffix_format,
    suffix_modality,
)

__all__ = ["check_content_part", "check_member", "check_record"]

_WHAT_PREP_MEASURES = "prep measures " + ", ".join(sorted(f"{m}s" for m in MEASURED)) + " only"
_UNMEASURED = [m for m in MODALITIES if m.name not in MEASURED]
_PLACEHOLDER = re.compile("|".join(re.escape(p) for m in _UNMEASURED for p in m.placeholders))
_PLACEHOLDER_MODALITY = {p: m for m in _UNMEASURED for p in m.placeholders}


def _refuse(modality: Modality, how: str) -> SampleRejected:
    return SampleRejected(
        "unsupported_modality",
        f"the sample carries {modality.name} ({how}); {_WHAT_PREP_MEASURES}: it is refused, "
        "not counted as text",
    )


def _absent(value: Any) -> bool:
    """True for a field that names no media: null, empty, or a struct of nulls (an Arrow row
    of a media column that is empty in this row)."""
    if value is None or value in ("", b""):
        return True
    if isinstance(value, (list, tuple)):
        return all(_absent(v) for v in value)
    if isinstance(value, dict):
        return all(_absent(v) for v in value.values())
    return False


def check_record(
    record: dict, turns: list[tuple[str, str]], n_images: int, fields_read: bool
) -> None:
    """Raise :class:`SampleRejected` if ``record`` (with its normalized ``turns`` and the
    ``n_images`` images prep found for it) carries media prep does not measure.
    ``fields_read``: whether the images came from the record's own fields (False where the
    reader supplies them: a tar sample's images are its members, not its JSON's fields)."""
    for key, value in record.items():
        if not isinstance(key, str) or _absent(value):
            continue
        modality = field_modality(key)
        if modality is None:
            if isinstance(value, dict) and "sampling_rate" in value:  # a decoded HF Audio
                raise _refuse(AUDIO, f"field {key!r} holds decoded audio")
            continue
        if modality.name not in MEASURED:
            raise _refuse(modality, f"field {key!r}")
        if n_images or (fields_read and key in modality.read_fields):
            continue
        fix = (
            f"name the field {'/'.join(modality.read_fields)} (or pass --image-column {key} "
            "for a table)"
            if fields_read
            else f"a tar sample's {modality.name}s are its members (KEY.0.jpg, ...)"
        )
        raise SampleRejected(
            "unread_media_field",
            f"the record names {modality.name}s under field {key!r}, which prep does not read "
            f"here, and no {modality.name} where it reads them; {fix}",
        )
    for i, (_, text) in enumerate(turns):
        found = _PLACEHOLDER.search(text)
        if found is not None:
            modality = _PLACEHOLDER_MODALITY[found.group()]
            raise _refuse(modality, f"{found.group()!r} in turn {i}")


def check_content_part(part_type: str, where: str) -> None:
    """Raise for a chat content part of a modality prep does not measure (``video``,
    ``input_audio``...); a part of no known modality is left to the caller."""
    modality = content_modality(part_type)
    if modality is not None and modality.name not in MEASURED:
        raise _refuse(modality, f"{where}: a content part of type {part_type!r}")


def check_member(name: str, suffix: str, where: str) -> None:
    """Raise for a WebDataset member ``name`` (suffix ``suffix``) that is media prep does not
    read: a video or audio file, or an image in a format prep cannot read."""
    modality = suffix_modality(suffix)
    if modality is None:
        return
    if modality.name not in MEASURED:
        raise _refuse(modality, f"{where}: member {name!a}")
    if suffix_format(suffix) in modality.other_suffixes:
        raise SampleRejected(
            "unsupported_format",
            f"{where}: member {name!a} is an {modality.name} in a format prep does not read "
            f"(it reads {', '.join(modality.suffixes)})",
        )
