"""LLaVA-style JSON (one list of records) and JSONL (one record per line) inputs.

JSONL is streamed: the scan finds byte ranges of ``chunk`` records and each worker reads only its
range, so a malformed line is reported with its line number and nothing else is lost. A JSON list
must be parsed whole (that is the format); its records travel to workers in slices.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from dataprep.errors import DataprepError, SampleRejected
from dataprep.readers.base import RawRecord, ReadOptions, WorkUnit

__all__ = ["read_json", "read_jsonl", "scan_json", "scan_jsonl"]


def scan_jsonl(path: Path, source: str, chunk: int) -> Iterator[WorkUnit]:
    index = 0
    unit_start, unit_line, unit_first = 0, 1, 0
    offset = 0
    line_no = 0
    with open(path, "rb") as f:
        for line in f:
            line_no += 1
            if line.strip():
                if index - unit_first == chunk:
                    yield WorkUnit(
                        reader="jsonl",
                        path=str(path),
                        source=source,
                        first=unit_first,
                        count=chunk,
                        payload=(unit_start, offset, unit_line),
                    )
                    unit_start, unit_line, unit_first = offset, line_no, index
                index += 1
            offset += len(line)
    if index > unit_first:
        yield WorkUnit(
            reader="jsonl",
            path=str(path),
            source=source,
            first=unit_first,
            count=index - unit_first,
            payload=(unit_start, offset, unit_line),
        )


def read_jsonl(unit: WorkUnit, opts: ReadOptions) -> Iterator[RawRecord]:
    begin, end, line_no = unit.payload
    with open(unit.path, "rb") as f:
        f.seek(begin)
        data = f.read(end - begin)
    index = unit.first
    for line in data.split(b"\n"):
        if line.strip():
            if unit.keeps(index):
                try:
                    yield RawRecord(index=index, line=line_no, record=json.loads(line), raw=line)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    err = SampleRejected("malformed_json", f"{unit.path}: line {line_no}: {exc}")
                    yield RawRecord(index=index, line=line_no, raw=line, error=err)
            index += 1
        line_no += 1


def scan_json(path: Path, source: str, chunk: int) -> Iterator[WorkUnit]:
    try:
        with open(path, "rb") as f:
            records = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataprepError(
            f"{path}: not valid JSON ({exc}); a .json input must hold one list of records "
            "(use .jsonl for one record per line)"
        ) from None
    if not isinstance(records, list):
        raise DataprepError(
            f"{path}: a .json input must hold a list of records, found {type(records).__name__}"
        )
    for first in range(0, len(records), chunk):
        part = records[first : first + chunk]
        yield WorkUnit(
            reader="json", path=str(path), source=source, first=first, count=len(part), payload=part
        )


def read_json(unit: WorkUnit, opts: ReadOptions) -> Iterator[RawRecord]:
    for i, record in enumerate(unit.payload):
        index = unit.first + i
        if unit.keeps(index):
            yield RawRecord(index=index, record=record)
