"""Existing WebDataset tars: one sample per key group (``KEY.json`` plus ``KEY.jpg`` or
``KEY.0.jpg``, ``KEY.1.png``, …), keys split as the ``webdataset`` library splits them.

The scan reads tar headers only and records each member's data offset; workers then read the
``.json`` member and only the header and tail of each image member. Hostile members (``..`` or
absolute names, links, devices) and duplicate members reject their sample. A tar cut short
rejects the sample being read when it ends (``truncated_archive``) and keeps the ones before it.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from dataprep.errors import SampleRejected
from dataprep.readers.base import ImageRef, RawRecord, ReadOptions, WorkUnit

__all__ = ["IMAGE_SUFFIXES", "read_wds", "scan_wds"]

IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "gif", "bmp")
_INDEXED_IMAGE = re.compile(r"^(?:(\d+)\.)?(" + "|".join(IMAGE_SUFFIXES) + r")$", re.IGNORECASE)


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


def _groups(
    path: Path,
) -> Iterator[tuple[str, list[tuple[str, str, int, int]], SampleRejected | None]]:
    """Yield (key, [(name, suffix, data offset, size)], error) for each key group in order."""
    size = os.path.getsize(path)
    key: str | None = None
    members: list[tuple[str, str, int, int]] = []
    error: SampleRejected | None = None
    end = 0
    try:
        with tarfile.open(path, "r:") as tf:
            for m in tf:
                if m.isdir() and ".." not in PurePosixPath(m.name).parts:
                    continue  # directory entries carry no sample data
                prefix, suffix = _split_key(m.name)
                if prefix is None:
                    prefix, suffix = m.name, ""
                if prefix != key:
                    if key is not None:
                        yield key, members, error
                    key, members, error = prefix, [], None
                bad = _unsafe(m)
                if bad and error is None:
                    error = SampleRejected("unsafe_member", f"{path}: {bad}")
                if any(s == suffix for _, s, _, _ in members) and error is None:
                    error = SampleRejected("duplicate_member", f"{path}: {m.name!r} appears twice")
                if m.offset_data + m.size > size:
                    raise tarfile.ReadError(
                        f"member {m.name!r} needs bytes past the end of the file"
                    )
                members.append((m.name, suffix, m.offset_data, m.size))
                end = m.offset_data + m.size
    except tarfile.ReadError as exc:
        yield (
            (key or f"@{end}"),
            members,
            SampleRejected("truncated_archive", f"{path}: ends inside sample {key!r} ({exc})"),
        )
        return
    if key is None:
        return
    # A complete tar ends with two zero blocks after the last member's padded data.
    padded_end = (end + 511) // 512 * 512
    if size < padded_end + 1024:
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
                yield RawRecord(index=index, error=error)
                continue
            by_suffix = {suffix.lower(): (name, off, size) for name, suffix, off, size in members}
            if "json" not in by_suffix:
                err = SampleRejected(
                    "missing_text", f"{unit.path}: sample {key!r} has no .json member"
                )
                yield RawRecord(index=index, error=err)
                continue
            _, off, size = by_suffix["json"]
            f.seek(off)
            raw = f.read(size)
            images = []
            for suffix, (name, off, size) in by_suffix.items():
                m = _INDEXED_IMAGE.match(suffix)
                if m:
                    order = int(m.group(1)) if m.group(1) is not None else -1
                    images.append(
                        (
                            order,
                            ImageRef(
                                where=f"{unit.path}:{name}", path=unit.path, offset=off, size=size
                            ),
                        )
                    )
            images.sort(key=lambda t: t[0])
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                err = SampleRejected("malformed_json", f"{unit.path}: {key}.json: {exc}")
                yield RawRecord(index=index, raw=raw, error=err)
                continue
            if isinstance(record, dict) and not any(
                k in record for k in ("id", "sample_id", "uid")
            ):
                record = {"id": key, **record}
            yield RawRecord(index=index, record=record, raw=raw, images=[ref for _, ref in images])
