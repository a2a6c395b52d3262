"""Existing WebDataset tars: one sample per key group (``KEY.json`` plus ``KEY.jpg`` or
``KEY.0.jpg``, ``KEY.1.png``, …), keys split as the ``webdataset`` library splits them.

The scan reads tar headers only and records each member's data offset; workers then read the
``.json`` member and only the header and tail of each image member. Hostile members (``..`` or
absolute names, links, devices, names that are not UTF-8) and duplicate members (the same
suffix in any case, or two images at one place) reject their sample. A tar cut short rejects
the sample being read when it ends (``truncated_archive``) and keeps the ones before it. A
damaged header (or a member whose data runs past its declared size) does not end the tar: the
damaged byte range becomes its own errors row (``tar_framing``, with its byte offsets), reading
resumes at the next valid header, and the samples on both sides of the range are rejected as
possibly incomplete.
"""

from __future__ import annotations

import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from dataprep.errors import SampleRejected
from dataprep.media import check_member
from dataprep.readers import base
from dataprep.readers.base import ImageRef, RawRecord, ReadOptions, WorkUnit
from dataprep.readers.jsonl import load_record
from equishard.contracts.media import AUDIO, IMAGE_SUFFIXES, VIDEO

__all__ = ["IMAGE_SUFFIXES", "read_wds", "scan_wds"]

_INDEXED_IMAGE = re.compile(r"^(?:(\d+)\.)?(" + "|".join(IMAGE_SUFFIXES) + r")$", re.IGNORECASE)
# a video or audio member in a format prep reads: KEY.mp4, KEY.0.mp4, KEY.1.flac, ...
_INDEXED_MEDIA = {
    m.name: re.compile(r"^(?:(\d+)\.)?(" + "|".join(m.suffixes) + r")$", re.IGNORECASE)
    for m in (VIDEO, AUDIO)
}


def _media_index(suffix: str) -> tuple[str, int] | None:
    """A video's or recording's (modality, place among them: -1 unnumbered), None for others."""
    for modality, pattern in _INDEXED_MEDIA.items():
        m = pattern.match(suffix)
        if m is not None:
            return modality, int(m.group(1)) if m.group(1) is not None else -1
    return None


def _split_key(name: str) -> tuple[str | None, str | None]:
    from webdataset.tariterators import base_plus_ext

    return base_plus_ext(name)


def _unsafe(member: tarfile.TarInfo) -> str | None:
    p = PurePosixPath(member.name)
    if p.is_absolute() or ".." in p.parts:
        return f"member name {member.name!r} leaves the archive"
    if member.issym() or member.islnk():
        return f"member {member.name!r} is a link"
    if not member.isfile():
        return f"member {member.name!r} is not a regular file"
    return None


def _name_problem(name: str) -> str | None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return f"member name {name!a} is not valid UTF-8"
    return None


def _image_index(suffix: str) -> int | None:
    """An image member's place among its sample's images (-1 unnumbered), None for others."""
    m = _INDEXED_IMAGE.match(suffix)
    return None if m is None else (int(m.group(1)) if m.group(1) is not None else -1)


def _duplicate(path: Path, name: str, suffix: str, members: list) -> SampleRejected | None:
    """A member of the same sample that this one would shadow or tie with: the same suffix
    (``KEY.JPG`` beside ``KEY.jpg`` too: members are read by lower-case suffix, one would be
    dropped unseen), or an image at the same place (``KEY.0.jpg`` and ``KEY.0.png``, or two
    unnumbered images: no order between them)."""
    index = _image_index(suffix)
    media = _media_index(suffix)
    for other, s, _, _ in members:
        if s.lower() == suffix.lower():
            why = "appears twice" if s == suffix else f"and {other!a} differ only in case"
            return SampleRejected("duplicate_member", f"{path}: {name!a} {why}")
        if index is not None and _image_index(s) == index:
            place = "unnumbered" if index < 0 else f"numbered {index}"
            return SampleRejected(
                "duplicate_member",
                f"{path}: {name!a} and {other!a} are both {place} images of one sample: their "
                "order is not defined; number them KEY.0.jpg, KEY.1.png, ...",
            )
        if media is not None and _media_index(s) == media:
            place = "unnumbered" if media[1] < 0 else f"numbered {media[1]}"
            return SampleRejected(
                "duplicate_member",
                f"{path}: {name!a} and {other!a} are both {place} {media[0]}s of one sample: "
                "their order is not defined; number them KEY.0.mp4, KEY.1.mkv, ...",
            )
    return None


def _first_nonzero(f, start: int, stop: int) -> int | None:
    """The 512-byte block in [start, stop) of ``f`` where non-zero bytes begin, or None when the
    range is all zeros (end-of-archive blocks, padding between concatenated tars)."""
    f.seek(start)
    pos = start
    while pos < stop:
        block = f.read(min(stop - pos, 1 << 20))
        if not block:
            return None
        stripped = block.lstrip(b"\0")
        if stripped:
            at = pos + len(block) - len(stripped)
            return start + (at - start) // 512 * 512
        pos += len(block)
    return None


def _entries(path: Path) -> Iterator[tuple]:
    """The tar's members in order, as ``("member", TarInfo)``, with ``("gap", start, stop)`` for
    every byte range that holds no valid header where one was due (a damaged header, or a member
    whose data runs past its declared size). tarfile resynchronizes on the next checksum-valid
    header on a 512-byte boundary (``ignore_zeros``, as ``tar --ignore-zeros`` does); a gap is
    found by comparing where each header starts with where the previous member ended.
    A gap's last field says whether it starts right where the previous member ended (so that
    member, rather than a clean end-of-archive marker, is next to the damage).
    ``("cut", offset, why)`` ends the list when the file ends inside a member."""
    size = os.path.getsize(path)
    expected = 0
    with open(path, "rb") as f:
        try:
            with tarfile.open(fileobj=f, mode="r:", ignore_zeros=True) as tf:
                for m in tf:
                    bad = _first_nonzero(f, expected, m.offset) if m.offset > expected else None
                    if bad is not None:
                        yield ("gap", bad, m.offset, bad == expected)
                    if m.offset_data + m.size > size:
                        yield ("cut", m.offset, f"member {m.name!a} needs bytes past the end")
                        return
                    yield ("member", m)
                    expected = m.offset_data + (m.size + 511) // 512 * 512
                    f.seek(tf.offset)
        except tarfile.ReadError as exc:
            yield ("cut", expected, str(exc))
            return
        bad = _first_nonzero(f, expected, size) if expected < size else None
        if bad is not None:
            yield ("gap", bad, size, bad == expected)


def _groups(
    path: Path,
) -> Iterator[tuple[str, list[tuple[str, str, int, int]], SampleRejected | None]]:
    """Yield (key, [(name, suffix, data offset, size)], error) for each key group in order, and
    one error group (key ``@OFFSET``) for each damaged byte range. The samples on both sides of
    a damaged range are rejected too: a member of theirs may be the one whose header was lost."""
    key: str | None = None
    members: list[tuple[str, str, int, int]] = []
    error: SampleRejected | None = None
    end = 0
    damaged_at: int | None = None  # the next group starts right after a damaged range

    def near_damage(at: int) -> SampleRejected:
        return SampleRejected(
            "tar_framing",
            f"{path}: sample {key!r} borders the damaged range at byte {at}; a member of it may "
            "have been lost",
        )

    for entry in _entries(path):
        kind = entry[0]
        if kind == "gap":
            _, a, b, adjoins = entry
            if key is not None:
                if adjoins:
                    error = error or near_damage(a)
                yield key, members, error
                key, members, error = None, [], None
            rest = (
                "the rest of the tar was not read"
                if b >= os.path.getsize(path)
                else (f"reading resumed at the next valid header at byte {b}")
            )
            yield (
                f"@{a}",
                [],
                SampleRejected(
                    "tar_framing",
                    f"{path}: bytes {a}..{b} hold no valid tar header (a damaged header or a "
                    f"member longer than its header says); {rest}",
                ),
            )
            damaged_at = a
            continue
        if kind == "cut":
            _, at, why = entry
            yield (
                (key or f"@{at}"),
                members,
                SampleRejected(
                    "truncated_archive", f"{path}: ends inside sample {key!r} at byte {at} ({why})"
                ),
            )
            return
        m = entry[1]
        if m.isdir() and ".." not in PurePosixPath(m.name).parts:
            continue  # directory entries carry no sample data
        prefix, suffix = _split_key(m.name)
        if prefix is None:
            prefix, suffix = m.name, ""
        if prefix != key:
            if key is not None:
                yield key, members, error
            key, members, error = prefix, [], None
            if damaged_at is not None:
                error, damaged_at = near_damage(damaged_at), None
        bad = _name_problem(m.name) or _unsafe(m)
        if bad and error is None:
            error = SampleRejected("unsafe_member", f"{path}: {bad}")
        if error is None:
            error = _duplicate(path, m.name, suffix, members)
        members.append((m.name, suffix, m.offset_data, m.size))
        end = m.offset_data + m.size
    if key is None:
        return
    # A complete tar ends with two zero blocks after the last member's padded data.
    padded_end = (end + 511) // 512 * 512
    if os.path.getsize(path) < padded_end + 1024 and error is None:
        error = SampleRejected(
            "truncated_archive", f"{path}: no end-of-archive marker after {key!r}"
        )
    yield key, members, error


def scan_wds(path: Path, source: str, chunk: int) -> Iterator[WorkUnit]:
    batch: list = []
    first = 0
    for group in _groups(path):
        batch.append(group)
        if len(batch) == chunk:
            yield WorkUnit(
                reader="wds", path=str(path), source=source, first=first, count=chunk, payload=batch
            )
            first += chunk
            batch = []
    if batch:
        yield WorkUnit(
            reader="wds",
            path=str(path),
            source=source,
            first=first,
            count=len(batch),
            payload=batch,
        )


def read_wds(unit: WorkUnit, opts: ReadOptions) -> Iterator[RawRecord]:
    with open(unit.path, "rb") as f:
        for i, (key, members, error) in enumerate(unit.payload):
            index = unit.first + i
            if not unit.keeps(index):
                continue
            if error is not None:
                if key.startswith("@"):  # a damaged range: reported, never a sample
                    yield RawRecord(index=index, error=error, sample=False)
                else:
                    yield RawRecord(index=index, error=error, key=key)
                continue
            by_suffix = {suffix.lower(): (name, off, size) for name, suffix, off, size in members}
            if "json" not in by_suffix:
                err = SampleRejected(
                    "missing_text", f"{unit.path}: sample {key!r} has no .json member"
                )
                yield RawRecord(index=index, error=err, key=key)
                continue
            _, off, size = by_suffix["json"]
            if size > base.MAX_RECORD_BYTES:  # never read whole
                err = base.too_large(f"{unit.path}: {key!a}.json", size)
                yield RawRecord(index=index, error=err, key=key)
                continue
            f.seek(off)
            raw = f.read(size)
            images = []
            media: dict[str, list] = {"video": [], "audio": []}
            try:
                for suffix, (name, _, _) in by_suffix.items():
                    if suffix == "json" or _image_index(suffix) is not None:
                        continue
                    if _media_index(suffix) is None:  # whether it is measured: the record's
                        check_member(name, suffix, f"{unit.path}: sample {key!a}")
            except SampleRejected as err:
                yield RawRecord(index=index, raw=raw, error=err, key=key)
                continue
            for suffix, (name, off, size) in by_suffix.items():
                order = _image_index(suffix)
                if order is not None:
                    images.append(
                        (
                            order,
                            ImageRef(
                                where=f"{unit.path}:{name}", path=unit.path, offset=off, size=size
                            ),
                        )
                    )
                found = _media_index(suffix)
                if found is not None:
                    ref = ImageRef(
                        where=f"{unit.path}:{name}", path=unit.path, offset=off, size=size
                    )
                    media[found[0]].append((found[1], ref))
            images.sort(key=lambda t: t[0])
            try:
                record = load_record(raw, f"{unit.path}: {key!a}.json")
            except SampleRejected as err:
                yield RawRecord(index=index, raw=raw, error=err, key=key)
                continue
            if isinstance(record, dict) and not any(
                k in record for k in ("id", "sample_id", "uid")
            ):
                record = {"id": key, **record}
            yield RawRecord(
                index=index,
                record=record,
                raw=raw,
                images=[ref for _, ref in images],
                media={
                    m: [ref for _, ref in sorted(refs, key=lambda t: t[0])]
                    for m, refs in media.items()
                },
            )
