"""LLaVA-style JSON (one list of records) and JSONL (one record per line) inputs.

JSONL is streamed: the scan finds byte ranges of ``chunk`` records and each worker reads only its
range, so a malformed line is reported with its line number and nothing else is lost. A JSON list
must be parsed whole (that is the format); its records travel to workers in slices.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from dataprep.errors import DataprepError, SampleRejected
from dataprep.readers import base
from dataprep.readers.base import RawRecord, ReadOptions, WorkUnit

__all__ = ["load_record", "read_json", "read_jsonl", "scan_json", "scan_jsonl"]


def load_record(raw: bytes | str, where: str):
    """One JSON record, or raise :class:`SampleRejected` saying why not (``where`` names the
    input and line or member)."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SampleRejected("malformed_json", f"{where}: {exc}") from None
    except RecursionError:
        raise SampleRejected(
            "too_deep", f"{where}: nested deeper than the JSON parser allows"
        ) from None


class _Unparsed:
    """A JSON list element that could not be parsed (too deep); read as its errors row."""

    def __init__(self, error: SampleRejected) -> None:
        self.error = error


# what matters for finding where a JSON value ends: strings (skipped whole) and brackets
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _value_end(text: str, pos: int) -> int:
    """Where the JSON value starting at ``pos`` ends (by bracket depth; strings skipped)."""
    depth = 0
    for m in _JSON_TOKEN.finditer(text, pos):
        tok = m.group()
        if tok in "[{":
            depth += 1
        elif tok in "]}":
            depth -= 1
        if depth <= 0:
            return m.end()
    raise ValueError("unterminated value")


def _list_elements(text: str, path: Path) -> list:
    """The elements of a JSON list one by one, so that an element too deep for the parser
    becomes its own errors row instead of failing the whole file."""
    dec = json.JSONDecoder()
    ws = re.compile(r"\s*")
    pos = ws.match(text, 0).end() + 1  # after '['
    out: list = []
    while True:
        pos = ws.match(text, pos).end()
        if text.startswith("]", pos):
            return out
        try:
            value, end = dec.raw_decode(text, pos)
        except RecursionError:
            end = _value_end(text, pos)
            value = _Unparsed(
                SampleRejected(
                    "too_deep",
                    f"{path}: record {len(out)} is nested deeper than the JSON parser allows",
                )
            )
        out.append(value)
        pos = ws.match(text, end).end()
        if text.startswith(",", pos):
            pos += 1


def _lines(f) -> Iterator[tuple[bytes | None, int]]:
    """``(line, its length)`` of each line of ``f`` (its newline included); ``(None, length)``
    for a line longer than a record may be, read in bounded pieces and never held whole."""
    limit = base.MAX_RECORD_BYTES
    while line := f.readline(limit + 1):
        if len(line) <= limit or line.endswith(b"\n"):
            yield line, len(line)
            continue
        n = len(line)
        while not line.endswith(b"\n") and (line := f.readline(1 << 20)):
            n += len(line)
        yield None, n


def _newline(f, offset: int, length: int) -> int:
    """1 when the line at ``offset`` of ``length`` bytes ends with a newline, else 0."""
    here = f.tell()
    f.seek(offset + length - 1)
    last = f.read(1)
    f.seek(here)
    return int(last == b"\n")


def scan_jsonl(path: Path, source: str, chunk: int) -> Iterator[WorkUnit]:
    def unit(first: int, count: int, payload: tuple) -> WorkUnit:
        return WorkUnit(
            reader="jsonl", path=str(path), source=source, first=first, count=count, payload=payload
        )

    index = 0
    unit_start, unit_line, unit_first = 0, 1, 0
    offset = 0
    line_no = 0
    with open(path, "rb") as f:
        for line, length in _lines(f):
            line_no += 1
            if line is None:  # too long: a unit of its own that only reports it
                if index > unit_first:
                    yield unit(unit_first, index - unit_first, (unit_start, offset, unit_line))
                # (the line's bytes without its newline, for the message)
                size = length - _newline(f, offset, length)
                yield unit(index, 1, (offset, offset + length, line_no, size))
                index += 1
                offset += length
                unit_start, unit_line, unit_first = offset, line_no + 1, index
                continue
            if line.strip():
                if index - unit_first == chunk:
                    yield unit(unit_first, chunk, (unit_start, offset, unit_line))
                    unit_start, unit_line, unit_first = offset, line_no, index
                index += 1
            offset += length
    if index > unit_first:
        yield unit(unit_first, index - unit_first, (unit_start, offset, unit_line))


def read_jsonl(unit: WorkUnit, opts: ReadOptions) -> Iterator[RawRecord]:
    if len(unit.payload) == 4:  # one line longer than a record may be: reported, not read
        begin, end, line_no, size = unit.payload
        if unit.keeps(unit.first):
            err = base.too_large(f"{unit.path}: line {line_no}", size)
            yield RawRecord(index=unit.first, line=line_no, error=err)
        return
    begin, end, line_no = unit.payload
    with open(unit.path, "rb") as f:
        f.seek(begin)
        data = f.read(end - begin)
    index = unit.first
    for line in data.split(b"\n"):
        if line.strip():
            if unit.keeps(index):
                try:
                    record = load_record(line, f"{unit.path}: line {line_no}")
                    yield RawRecord(index=index, line=line_no, record=record, raw=line)
                except SampleRejected as err:
                    yield RawRecord(index=index, line=line_no, raw=line, error=err)
            index += 1
        line_no += 1


def scan_json(path: Path, source: str, chunk: int) -> Iterator[WorkUnit]:
    try:
        with open(path, "rb") as f:
            data = f.read()
        try:
            records = json.loads(data)
        except RecursionError:  # one record too deep: parse the list element by element
            text = data.decode("utf-8")
            if not text.lstrip().startswith("["):
                raise
            records = _list_elements(text, path)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as exc:
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
            if isinstance(record, _Unparsed):
                yield RawRecord(index=index, error=record.error)
            else:
                yield RawRecord(index=index, record=record)
