"""Refuse a sample that carries media prep does not measure, instead of counting it as text.

A LLaVA-Video record (``"video": "clip.mp4"``, ``<video>`` in the prompt) would otherwise be
measured as its text alone: a 64-second clip that Qwen2.5-VL sees as 8,960 LLM tokens would get
a row of 34 text tokens and be balanced as a caption. Every way a record can carry a modality
is looked at (:mod:`equishard.contracts.media` names them): a field, a chat content part, a
WebDataset member, a placeholder in a turn's text. A modality outside
:data:`~equishard.contracts.media.MEASURED` rejects the sample (``unsupported_modality``); an
image under a field prep does not read, with no image where prep reads them, rejects it too
(``unread_media_field``), as does an image member in a format prep cannot read
(``unsupported_format``). What is measured is the run's: images always, video and audio where
the run has a rule for them (``measured``).
"""

from __future__ import annotations

import re
from functools import lru_cache
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


@lru_cache(maxsize=8)
def _placeholders(measured: frozenset[str]) -> tuple[re.Pattern, dict[str, Modality], str]:
    """The placeholders of the modalities outside ``measured`` (a pattern, and each one's
    modality), and the sentence that says what is measured."""
    unmeasured = [m for m in MODALITIES if m.name not in measured]
    pattern = re.compile(
        "|".join(re.escape(p) for m in unmeasured for p in m.placeholders) or "(?!)"
    )
    what = "prep measures " + ", ".join(sorted(f"{m}s" for m in measured)) + " only"
    if "video" not in measured or "audio" not in measured:
        what += " in this run (--video-rule, --audio-rule measure video and audio)"
    return pattern, {p: m for m in unmeasured for p in m.placeholders}, what


def _refuse(modality: Modality, how: str, measured: frozenset[str]) -> SampleRejected:
    return SampleRejected(
        "unsupported_modality",
        f"the sample carries {modality.name} ({how}); {_placeholders(measured)[2]}: it is "
        "refused, not counted as text",
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
    record: dict,
    turns: list[tuple[str, str]],
    found: dict[str, int],
    fields_read: bool,
    measured: frozenset[str] = MEASURED,
) -> None:
    """Raise :class:`SampleRejected` if ``record`` (with its normalized ``turns`` and the
    number of items of each modality prep ``found`` for it) carries media prep does not
    measure in this run (``measured``). ``fields_read``: whether the items came from the
    record's own fields (False where the reader supplies them: a tar sample's images are its
    members, not its JSON's fields)."""
    for key, value in record.items():
        if not isinstance(key, str) or _absent(value):
            continue
        modality = field_modality(key)
        if modality is None:
            if isinstance(value, dict) and "sampling_rate" in value:  # a decoded HF Audio
                if "audio" not in measured:
                    raise _refuse(AUDIO, f"field {key!r} holds decoded audio", measured)
                raise SampleRejected(
                    "unsupported_format",
                    f"field {key!r} holds decoded audio samples; prep measures audio from its "
                    "file (a path or the file's bytes): keep the dataset's audio undecoded "
                    "(datasets: cast_column(col, Audio(decode=False)))",
                )
            continue
        if modality.name not in measured:
            raise _refuse(modality, f"field {key!r}", measured)
        if found.get(modality.name) or (fields_read and key in modality.read_fields):
            continue
        column = f" (or pass --image-column {key} for a table)" if modality.name == "image" else ""
        fix = (
            f"name the field {'/'.join(modality.read_fields)}{column}"
            if fields_read
            else f"a tar sample's {modality.name}s are its members (KEY.0.{modality.suffixes[0]}, ...)"
        )
        raise SampleRejected(
            "unread_media_field",
            f"the record names {modality.name}s under field {key!r}, which prep does not read "
            f"here, and no {modality.name} where it reads them; {fix}",
        )
    pattern, of, _ = _placeholders(measured)
    for i, (_, text) in enumerate(turns):
        hit = pattern.search(text)
        if hit is not None:
            raise _refuse(of[hit.group()], f"{hit.group()!r} in turn {i}", measured)


def check_content_part(part_type: str, where: str, measured: frozenset[str] = MEASURED) -> None:
    """Raise for a chat content part of a modality prep does not measure (``video``,
    ``input_audio``...); a part of no known modality is left to the caller."""
    modality = content_modality(part_type)
    if modality is not None and modality.name not in measured:
        raise _refuse(modality, f"{where}: a content part of type {part_type!r}", measured)


def check_member(name: str, suffix: str, where: str, measured: frozenset[str] = MEASURED) -> None:
    """Raise for a WebDataset member ``name`` (suffix ``suffix``) that is media prep does not
    read: a video or audio file, or an image in a format prep cannot read."""
    modality = suffix_modality(suffix)
    if modality is None:
        return
    if suffix_format(suffix) in modality.other_suffixes:
        raise SampleRejected(
            "unsupported_format",
            f"{where}: member {name!a} is {'an' if modality.name[0] in 'aeiou' else 'a'} "
            f"{modality.name} in a format prep does not read (it reads "
            f"{', '.join(modality.suffixes)})",
        )
    if modality.name not in measured:
        raise _refuse(modality, f"{where}: member {name!a}", measured)
