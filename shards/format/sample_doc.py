"""A sample's ``.json`` member, both ways: the document the writer puts next to its images, and
the checks a reader applies to it before anything downstream uses a field of it.

The document is read from a shard, which is outside data for every reader that does not verify
the shard's sha256 (and for a night that reuses a parent it did not write): every field a
consumer reads is checked for its type here, where it enters, so that a damaged or hand-made
document is that sample's error naming the shard and the sample, never an ``AttributeError``
deep in a collator. A reader that knows where the sample lies (:func:`check_place`) also checks
that the document and the member's key say the same place: a sample spliced in from another
group, step or position is refused.

Fields (all written by :func:`sample_doc`): ``sample_id``, ``source``, ``images`` (member names
``0.jpg``, ``1.png``, ...), ``turns`` (``[role, text]`` pairs), ``cost`` (the cost table's
fields in :data:`COST_FIELDS`), and where the plan put it: ``step``, ``group_id``, ``rank``.
"""

from __future__ import annotations

import json
import re

from equishard.common.errors import EquishardError
from equishard.common.values import is_count
from equishard.contracts.columns import (
    IMAGE_HEIGHTS,
    IMAGE_WIDTHS,
    LLM_TOKENS,
    NUM_IMAGES,
    TEXT_TOKENS,
    VIT_SEQ_LENS,
    VIT_TOKENS,
)
from equishard.contracts.media import IMAGE_SUFFIXES
from equishard.contracts.phases import ENCODER_PHASES

__all__ = [
    "COST_FIELDS",
    "MEDIA_COST_FIELDS",
    "SampleDocError",
    "check_place",
    "media_names",
    "parse_sample_doc",
    "sample_doc",
]

# cost-table fields copied into each sample's document (``cost``)
COST_FIELDS = (
    NUM_IMAGES,
    VIT_TOKENS,
    VIT_SEQ_LENS,
    LLM_TOKENS,
    TEXT_TOKENS,
    "modality",
    IMAGE_WIDTHS,
    IMAGE_HEIGHTS,
)
# a video or audio phase's cost columns, copied where the cost table has them
MEDIA_COST_FIELDS = tuple(c for p in ENCODER_PHASES[1:] for c in p.columns)
_COUNTS = (NUM_IMAGES, VIT_TOKENS, LLM_TOKENS, TEXT_TOKENS)
_MEDIA_COUNTS = tuple(c for p in ENCODER_PHASES[1:] for c in (p.items, p.tokens))
_MEDIA_LISTS = tuple(p.seq_lens for p in ENCODER_PHASES[1:])
# a video's or recording's member: its modality, its place among them, its file suffix
_MEDIA_NAME = re.compile(r"^(video|audio)(\d+)\.([a-z0-9]{1,8})$")
_LISTS = (VIT_SEQ_LENS, IMAGE_WIDTHS, IMAGE_HEIGHTS)
# a cost table may lack its optional columns (equishard.contracts.cost_table.OPTIONAL_COLUMNS): null here
_MAY_BE_NULL = frozenset({TEXT_TOKENS, IMAGE_WIDTHS, IMAGE_HEIGHTS, "modality"})
_IMAGE_NAME = re.compile(r"^(\d+)\.(" + "|".join(IMAGE_SUFFIXES) + r")$")
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_ROLES = frozenset({"system", "user", "assistant"})  # the roles prep normalizes turns to


class SampleDocError(EquishardError, ValueError):
    """A sample's document is not what the writer writes (the message names the field)."""


def sample_key(step: int, pos: int, sample_id: str) -> str:
    """A WebDataset key: no dots (they start the extension), unique within a shard."""
    return f"{step:07d}_{pos:03d}_{_KEY_UNSAFE.sub('_', sample_id)[:60]}"


def sample_doc(meta: dict, step: int, group_id: int, rank: int) -> bytes:
    """A sample's ``.json`` member: its metadata plus where the plan put it."""
    return json.dumps(
        {**meta, "step": step, "group_id": group_id, "rank": rank},
        sort_keys=True,
        ensure_ascii=False,
    ).encode()


def _cost(cost) -> str | None:
    """Why ``cost`` is not a cost table row as the writer copies it (None: it is). Types only:
    what the numbers say is the cost table's business (a table another tool made may count
    otherwise), checked where the table is read."""
    if not isinstance(cost, dict):
        return f"'cost' is {type(cost).__name__}, not an object"
    missing = [f for f in COST_FIELDS if f not in cost]
    if missing:
        return f"'cost' lacks {missing}"
    present = {f: cost[f] for f in COST_FIELDS if not (cost[f] is None and f in _MAY_BE_NULL)}
    bad = [f for f in _COUNTS if f in present and not is_count(present[f])]
    bad += [
        f
        for f in _LISTS
        if f in present and not (isinstance(present[f], list) and all(map(is_count, present[f])))
    ]
    if "modality" in present and not isinstance(present["modality"], str):
        bad.append("modality")
    bad += [f for f in _MEDIA_COUNTS if f in cost and not is_count(cost[f])]
    bad += [
        f
        for f in _MEDIA_LISTS
        if f in cost and not (isinstance(cost[f], list) and all(map(is_count, cost[f])))
    ]
    if bad:
        return f"'cost' fields {bad} are not counts (whole numbers >= 0, or lists of them)"
    return None


def media_names(doc: dict) -> list[str]:
    """The member names of a checked document's videos, then its recordings."""
    return [*doc.get("videos", ()), *doc.get("audios", ())]


def _media(doc: dict) -> str | None:
    """Why the document's ``videos``, ``audios`` and ``media`` are not what the writer writes
    (None: they are, or the sample has none)."""
    for modality in ("video", "audio"):
        names = doc.get(f"{modality}s", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return f"'{modality}s' is not a list of member names"
        for i, n in enumerate(names):
            found = _MEDIA_NAME.match(n)
            if not found or found.group(1) != modality or int(found.group(2)) != i:
                return f"{modality} {i} is named {n!r}, not {modality}{i}.<suffix>"
    info = doc.get("media", {})
    if not isinstance(info, dict) or set(info) != set(media_names(doc)):
        return "'media' does not hold one header per video and recording"
    for name, h in info.items():
        if not isinstance(h, dict) or not all(
            isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in h.values()
        ):
            return f"'media' of {name!r} is not an object of numbers and words"
    return None


def _problem(doc) -> str | None:
    if not isinstance(doc, dict):
        return f"the document is a JSON {type(doc).__name__}, not an object"
    sid = doc.get("sample_id")
    if not isinstance(sid, str) or not sid:
        return "'sample_id' is not a non-empty string"
    if doc.get("source") is not None and not isinstance(doc["source"], str):
        return "'source' is not a string"  # null: a cost table another tool made left it out
    names = doc.get("images")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return "'images' is not a list of member names"
    for i, n in enumerate(names):
        found = _IMAGE_NAME.match(n)
        if not found or int(found.group(1)) != i:
            return f"image {i} is named {n!r}, not {i}.<jpg|png|webp|gif|bmp>"
    why = _media(doc)
    if why:
        return why
    turns = doc.get("turns")
    if not isinstance(turns, list) or not all(
        isinstance(t, list) and len(t) == 2 and all(isinstance(x, str) for x in t) for t in turns
    ):
        return "'turns' is not a list of [role, text] string pairs"
    roles = {role for role, _ in turns} - _ROLES
    if roles:
        return f"'turns' has role(s) {sorted(roles)}, not system, user or assistant"
    why = _cost(doc.get("cost"))
    if why:
        return why
    if not all(is_count(doc.get(f)) for f in ("step", "group_id", "rank")):
        return "'step', 'group_id' and 'rank' are not all whole numbers >= 0"
    return None


def parse_sample_doc(raw: bytes | str | dict, where: str) -> dict:
    """The checked document of one sample (``raw``: the ``.json`` member's bytes, or the object
    a peer reader decoded); :class:`SampleDocError` naming ``where`` and the field otherwise."""
    doc = raw
    if isinstance(raw, bytes | str):
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise SampleDocError(f"{where}: its .json is not JSON ({exc})") from None
    why = _problem(doc)
    if why:
        raise SampleDocError(f"{where}: its .json is not a sample document: {why}")
    return doc


def check_place(doc: dict, key: str, step: int, pos: int, where: str) -> None:
    """The document at position ``pos`` of the group of ``step``, under member key ``key``:
    both must say that place (a sample from another group, step or position is refused)."""
    want = sample_key(step, pos, doc["sample_id"])
    if doc["step"] != step or key != want:
        raise SampleDocError(
            f"{where}: sample {doc['sample_id']!r} (key {key!r}, step {doc['step']}) is not the "
            f"group's sample {pos} of step {step} (key {want!r}): it belongs elsewhere"
        )
