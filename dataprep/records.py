"""Normalize one raw record (LLaVA ``conversations`` or chat ``messages``) into turns and images.

A record becomes a :class:`Sample`: its id, its turns as ``(role, text)`` with roles ``system``,
``user`` or ``assistant``, and its image references in order. Image places in the text are marked
by ``<image>``; a record with images but no placeholder gets them prepended to its first user turn
(LLaVA's and InternVL's convention). Anything malformed raises :class:`SampleRejected`, and so
does a record that carries media prep does not measure (:mod:`dataprep.media`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dataprep.errors import SampleRejected
from dataprep.media import check_content_part, check_record

__all__ = ["IMAGE_PLACEHOLDER", "Sample", "normalize_record", "sample_id_of"]

IMAGE_PLACEHOLDER = "<image>"

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


def _content_text(content: Any, where: str) -> str:
    """Text of a chat message's content; list content's image parts become placeholders."""
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
                    check_content_part(part["type"], where)
                raise SampleRejected(
                    "non_string_text", f"{where}: unknown content part {part!r:.60}"
                )
        return "".join(parts)
    raise SampleRejected("non_string_text", f"{where}: content is {type(content).__name__}")


def _turns(record: dict) -> list[tuple[str, str]]:
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
        text = _content_text(turn.get(text_key), f"turn {i}")
        if not _valid_unicode(text):
            bad = next(k for k, c in enumerate(text) if "\ud800" <= c <= "\udfff")
            raise SampleRejected(
                "invalid_text", f"turn {i} holds a lone surrogate at character {bad} (not Unicode)"
            )
        turns.append((role, text))
    if not any(text.strip() for _, text in turns):
        raise SampleRejected("empty_conversation", "every turn is empty")
    return turns


def _images(record: dict) -> list[Any]:
    for key in ("image", "images"):
        value = record.get(key)
        if value is None:
            continue
        items = value if isinstance(value, list) else [value]
        return [v for v in items if v is not None]
    return []


def normalize_record(record: Any, default_id: str, images: list | None = None) -> Sample:
    """Turn one raw record into a :class:`Sample`, or raise :class:`SampleRejected`.

    ``images`` overrides the record's own image field (a tar's image members, for instance)."""
    sample_id = sample_id_of(record, default_id)
    turns = _turns(record)
    fields_read = images is None
    if fields_read:
        images = _images(record)
    check_record(record, turns, len(images), fields_read)
    n_placeholders = sum(text.count(IMAGE_PLACEHOLDER) for _, text in turns)
    if images and n_placeholders == 0:
        first_user = next((i for i, (role, _) in enumerate(turns) if role == "user"), 0)
        role, text = turns[first_user]
        turns[first_user] = (role, (IMAGE_PLACEHOLDER + "\n") * len(images) + text)
    elif n_placeholders != len(images):
        raise SampleRejected(
            "image_placeholder_mismatch",
            f"{n_placeholders} <image> placeholder(s) in the text but {len(images)} image(s)",
        )
    return Sample(sample_id=sample_id, turns=turns, images=images)
