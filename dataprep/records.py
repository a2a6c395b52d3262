"""Normalize one raw record (LLaVA ``conversations`` or chat ``messages``) into turns and images.

A record becomes a :class:`Sample`: its id, its turns as ``(role, text)`` with roles ``system``,
``user`` or ``assistant``, and its image references in order. Image places in the text are marked
by ``<image>``; a record with images but no placeholder gets them prepended to its first user turn
(LLaVA's and InternVL's convention). Videos and recordings have no such convention: each needs
its ``<video>`` or ``<audio>`` where the model sees it, and a record without is refused
(``media_placeholder_mismatch``), as is a placeholder without its media. Anything malformed
raises :class:`SampleRejected`, and so does a record that carries media prep does not measure
(:mod:`dataprep.media`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dataprep.errors import SampleRejected
from dataprep.media import check_content_part, check_record
from equishard.contracts.media import AUDIO, IMAGE, MEASURED, VIDEO, content_modality

__all__ = [
    "AUDIO_PLACEHOLDER",
    "IMAGE_PLACEHOLDER",
    "PLACEHOLDERS",
    "VIDEO_PLACEHOLDER",
    "Sample",
    "normalize_record",
    "sample_id_of",
]

IMAGE_PLACEHOLDER = IMAGE.placeholders[0]  # "<image>"
VIDEO_PLACEHOLDER = VIDEO.placeholders[0]  # "<video>"
AUDIO_PLACEHOLDER = AUDIO.placeholders[0]  # "<audio>"
PLACEHOLDERS = {"image": IMAGE_PLACEHOLDER, "video": VIDEO_PLACEHOLDER, "audio": AUDIO_PLACEHOLDER}

_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "system": "system",
}


@dataclass(slots=True)
class Sample:
    sample_id: str
    turns: list[tuple[str, str]]
    images: list[Any]  # path strings, bytes, or {"bytes": ..., "path": ...} dicts
    videos: list[Any] = field(default_factory=list)  # the same, for a run that measures video
    audios: list[Any] = field(default_factory=list)  # and audio


def _valid_unicode(text: str) -> bool:
    """False for strings holding lone surrogates (JSON's ``"\\ud800"``): no tokenizer, Arrow
    column or UTF-8 file can take them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def sample_id_of(record: Any, default_id: str) -> str:
    """The record's own id (``id``, ``sample_id`` or ``uid``), else ``default_id``."""
    if not isinstance(record, dict):
        raise SampleRejected("not_an_object", f"record is {type(record).__name__}")
    for key in ("id", "sample_id", "uid"):
        if key in record and record[key] is not None:
            value = record[key]
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise SampleRejected("bad_id", f"{key}={value!r} is {type(value).__name__}")
            value = str(value)
            if not value:
                raise SampleRejected("bad_id", f"{key} is empty")
            if not _valid_unicode(value):
                raise SampleRejected("bad_id", f"{key}={value!a} is not valid Unicode")
            return value
    return default_id


def _content_text(content: Any, where: str, measured: frozenset[str]) -> str:
    """Text of a chat message's content; list content's media parts become placeholders
    (``<image>``; ``<video>``, ``<audio>`` in a run that measures them)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise SampleRejected(
                        "non_string_text", f"{where}: text part is {type(text).__name__}"
                    )
                parts.append(text)
            elif isinstance(part, dict) and part.get("type") in ("image", "image_url"):
                parts.append(IMAGE_PLACEHOLDER)
            else:
                if isinstance(part, dict) and isinstance(part.get("type"), str):
                    check_content_part(part["type"], where, measured)
                    modality = content_modality(part["type"])
                    if modality is not None:  # a video or audio part this run measures
                        parts.append(PLACEHOLDERS[modality.name])
                        continue
                raise SampleRejected(
                    "non_string_text", f"{where}: unknown content part {part!r:.60}"
                )
        return "".join(parts)
    raise SampleRejected("non_string_text", f"{where}: content is {type(content).__name__}")


def _turns(record: dict, measured: frozenset[str]) -> list[tuple[str, str]]:
    if "conversations" in record:
        raw, role_key, text_key = record["conversations"], "from", "value"
    elif "messages" in record:
        raw, role_key, text_key = record["messages"], "role", "content"
    elif "text" in record:
        text = record["text"]
        if not isinstance(text, str):
            raise SampleRejected("non_string_text", f"text is {type(text).__name__}")
        raw, role_key, text_key = [{"role": "assistant", "content": text}], "role", "content"
    else:
        raise SampleRejected("empty_conversation", "no 'conversations', 'messages' or 'text' field")
    if not isinstance(raw, list) or not raw:
        raise SampleRejected("empty_conversation", f"{role_key!r} list is empty or not a list")
    turns: list[tuple[str, str]] = []
    for i, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise SampleRejected(
                "empty_conversation", f"turn {i} is {type(turn).__name__}, not an object"
            )
        role = _ROLES.get(str(turn.get(role_key, "")).lower())
        if role is None:
            raise SampleRejected("bad_role", f"turn {i} has {role_key}={turn.get(role_key)!r}")
        text = _content_text(turn.get(text_key), f"turn {i}", measured)
        if not _valid_unicode(text):
            bad = next(k for k, c in enumerate(text) if "\ud800" <= c <= "\udfff")
            raise SampleRejected(
                "invalid_text", f"turn {i} holds a lone surrogate at character {bad} (not Unicode)"
            )
        turns.append((role, text))
    if not any(text.strip() for _, text in turns):
        raise SampleRejected("empty_conversation", "every turn is empty")
    return turns


def _items(record: dict, fields: tuple[str, ...]) -> list[Any]:
    """The media items under the first of ``fields`` the record has (one item or a list)."""
    for key in fields:
        value = record.get(key)
        if value is None:
            continue
        items = value if isinstance(value, list) else [value]
        return [v for v in items if v is not None]
    return []


def _place(turns: list[tuple[str, str]], modality: str, n: int) -> None:
    """Check that the turns hold one ``modality`` placeholder per item (``n``); images with none
    go in front of the first user turn (LLaVA's and InternVL's convention), videos and
    recordings with none are refused (where the model sees them would be a guess)."""
    mark = PLACEHOLDERS[modality]
    found = sum(text.count(mark) for _, text in turns)
    if n and found == 0 and modality != "image":
        raise SampleRejected(
            "media_placeholder_mismatch",
            f"{n} {modality}(s) but no {mark} placeholder in the text: put {mark} where the "
            f"model sees each {modality}",
        )
    if n and found == 0:
        first_user = next((i for i, (role, _) in enumerate(turns) if role == "user"), 0)
        role, text = turns[first_user]
        turns[first_user] = (role, (mark + "\n") * n + text)
    elif found != n:
        reason = (
            "image_placeholder_mismatch" if modality == "image" else "media_placeholder_mismatch"
        )
        raise SampleRejected(
            reason, f"{found} {mark} placeholder(s) in the text but {n} {modality}(s)"
        )


def normalize_record(
    record: Any,
    default_id: str,
    images: list | None = None,
    measured: frozenset[str] = MEASURED,
    media: dict | None = None,
) -> Sample:
    """Turn one raw record into a :class:`Sample`, or raise :class:`SampleRejected`.

    ``images`` overrides the record's own image field (a tar's image members, for instance),
    ``media`` its video and audio fields (a tar's video and audio members: ``{"video": [...],
    "audio": [...]}``).
    ``measured``: the modalities this run measures (images, and video or audio where it has a
    rule for them); a record carrying another is refused (:func:`dataprep.media.check_record`).
    A LLaVA-Video record marks its video with ``<image>`` (the field says it is a video): with
    videos, no images and as many ``<image>`` as videos, those placeholders are its videos'."""
    sample_id = sample_id_of(record, default_id)
    turns = _turns(record, measured)
    fields_read = images is None
    if fields_read:
        images = _items(record, IMAGE.read_fields)
    if media is not None:  # the reader's own (a tar's members): whether they are measured
        for modality, items in media.items():
            if items and modality not in measured:
                raise SampleRejected(
                    "unsupported_modality",
                    f"the sample carries {modality} (member {items[0].where!a}); this run "
                    f"measures no {modality} (--{modality}-rule measures it): it is refused, "
                    "not counted as text",
                )
        videos, audios = list(media.get("video", ())), list(media.get("audio", ()))
    else:
        videos = _items(record, VIDEO.read_fields) if "video" in measured else []
        audios = _items(record, AUDIO.read_fields) if "audio" in measured else []
    found = {"image": len(images), "video": len(videos), "audio": len(audios)}
    check_record(record, turns, found, fields_read and media is None, measured)
    if videos and not images:
        n_video = sum(text.count(VIDEO_PLACEHOLDER) for _, text in turns)
        n_image = sum(text.count(IMAGE_PLACEHOLDER) for _, text in turns)
        if n_video == 0 and n_image == len(videos):
            turns = [(r, t.replace(IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER)) for r, t in turns]
    _place(turns, "image", len(images))
    if "video" in measured:  # else a <video> in the text was refused above
        _place(turns, "video", len(videos))
    if "audio" in measured:
        _place(turns, "audio", len(audios))
    return Sample(sample_id=sample_id, turns=turns, images=images, videos=videos, audios=audios)
