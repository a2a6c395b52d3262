"""Random access to raw samples by their cost-table ``location`` (``input#record-index``).

The shard writer needs each sample's conversation and original image bytes in plan order, which
is random with respect to the inputs. ``RecordStore`` reads through the same readers as prep
(same parsing, same normalization) and keeps, per input, only an index from record number to
where the record lives: byte offsets for JSONL, member offsets for tars, the parsed list for
JSON, row numbers for Parquet/HF. Image bytes are read when asked for, never cached.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from dataprep.errors import DataprepError, SampleRejected
from dataprep.image_header import read_image_file
from dataprep.image_refs import image_ref
from dataprep.measure import record_bytes
from dataprep.media_probe import MediaItem
from dataprep.readers import ImageRef, RawRecord, ReadOptions, detect_reader, read_unit
from dataprep.readers.base import WorkUnit
from dataprep.readers.jsonl import load_record, scan_json, scan_jsonl
from dataprep.readers.tabular import scan_hf, scan_parquet
from dataprep.readers.wds import scan_wds
from dataprep.records import normalize_record, sample_id_of
from equishard.contracts.media import MEASURED

__all__ = ["RawSample", "RecordStore", "read_image"]

_SCANS = {
    "jsonl": scan_jsonl,
    "json": scan_json,
    "parquet": scan_parquet,
    "hf": scan_hf,
    "wds": scan_wds,
}


@dataclass(slots=True)
class RawSample:
    sample_id: str
    turns: list[tuple[str, str]]
    images: list[ImageRef]
    raw: bytes = b""  # the record's bytes, as prep fingerprinted them
    media: list[MediaItem] = field(default_factory=list)  # its videos, then its recordings


def read_image(ref: ImageRef) -> tuple[bytes, os.stat_result | None]:
    """The original encoded bytes of one image, and the status of the file they were read from
    (taken after the read; None for bytes embedded in the record)."""
    if ref.data is not None:
        return ref.data, None
    if ref.size is None:  # a file of its own: must still be a regular file
        return read_image_file(ref.path, ref.root)
    with open(ref.path, "rb") as f:
        f.seek(ref.offset)
        data = f.read(ref.size)
        return data, os.fstat(f.fileno())


class RecordStore:
    """Look up raw samples by location; one index per input, built on first use."""

    def __init__(
        self,
        opts: ReadOptions | None = None,
        chunk: int = 1024,
        cached_units: int = 8,
        measured: frozenset[str] = MEASURED,
    ) -> None:
        self.opts = opts or ReadOptions()
        self.measured = measured  # the modalities prep measured: read as prep read them
        self.chunk = chunk
        self.cached_units = cached_units
        self._units: dict[str, list[WorkUnit]] = {}
        self._lines: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._cache: OrderedDict[int, dict[int, RawRecord]] = OrderedDict()
        # open JSONL inputs, most recent last: a record is a seek and a line read, not an open
        self._handles: OrderedDict[str, BinaryIO] = OrderedDict()
        self._sources: dict[str, tuple[str, bool]] = {}

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Closes the inputs kept open; the store opens them again if used afterwards."""
        while self._handles:
            self._handles.popitem()[1].close()

    def _handle(self, path: str) -> BinaryIO:
        f = self._handles.get(path)
        if f is None:
            f = open(path, "rb")  # noqa: SIM115 - kept open, closed by close()
            self._handles[path] = f
            if len(self._handles) > self.cached_units:
                self._handles.popitem(last=False)[1].close()
        else:
            self._handles.move_to_end(path)
        return f

    def _jsonl_index(self, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Byte offset, end (past its newline) and line number of every record (non-blank
        line) of a JSONL file."""
        idx = self._lines.get(path)
        if idx is None:
            detect_reader(Path(path))  # a regular file still (a FIFO now would block forever)
            offsets, ends, lines = [], [], []
            pos = 0
            with open(path, "rb") as f:
                for no, line in enumerate(f, start=1):
                    if line.strip():
                        offsets.append(pos)
                        ends.append(pos + len(line))
                        lines.append(no)
                    pos += len(line)
            idx = tuple(np.array(v, dtype=np.int64) for v in (offsets, ends, lines))
            self._lines[path] = idx
        return idx

    def _unit_for(self, path: str, index: int) -> WorkUnit:
        units = self._units.get(path)
        if units is None:
            p = Path(path)
            reader = detect_reader(p)
            source = p.stem if p.suffix else p.name
            units = list(_SCANS[reader](p, source, self.chunk))
            self._units[path] = units
        lo, hi = 0, len(units)
        while lo < hi:  # units are in record order
            mid = (lo + hi) // 2
            if units[mid].first + units[mid].count <= index:
                lo = mid + 1
            else:
                hi = mid
        if lo == len(units) or not units[lo].first <= index < units[lo].first + units[lo].count:
            raise DataprepError(f"{path}: no record {index}; the input changed since prep ran")
        return units[lo]

    def _record(self, path: str, index: int) -> RawRecord:
        if path.endswith(".jsonl"):
            offsets, ends, lines = self._jsonl_index(path)
            if not 0 <= index < offsets.size:
                raise DataprepError(f"{path}: no record {index}; the input changed since prep ran")
            start = int(offsets[index])  # one positioned read of the line, newline included
            raw = os.pread(self._handle(path).fileno(), int(ends[index]) - start, start)
            raw = raw[:-1] if raw.endswith(b"\n") else raw  # as prep's reader split it
            line = int(lines[index])
            try:
                record = load_record(raw, f"{path}: line {line}")
            except SampleRejected as err:
                return RawRecord(index=index, line=line, raw=raw, error=err)
            return RawRecord(index=index, line=line, record=record, raw=raw)
        unit = self._unit_for(path, index)
        key = id(unit)
        records = self._cache.get(key)
        if records is None:
            records = {r.index: r for r in read_unit(unit, self.opts)}
            self._cache[key] = records
            if len(self._cache) > self.cached_units:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return records[index]

    def _source(self, path: str) -> tuple[str, bool]:
        """An input's sample-id source (its name without the suffix) and whether it is a
        directory (an HF dataset on disk), looked up once per input."""
        p = Path(path)
        self._sources[path] = (p.stem if p.suffix else p.name, p.is_dir())
        return self._sources[path]

    def get(self, location: str) -> RawSample:
        """The sample at ``input#index``; :class:`SampleRejected` if it no longer reads cleanly.
        Images are resolved by the same rule as prep's (:func:`dataprep.image_refs.image_ref`)."""
        path, sep, idx = location.rpartition("#")
        if not sep or not idx.isdigit():
            raise DataprepError(f"bad location {location!r}: expected 'input#record-index'")
        rec = self._record(path, int(idx))
        if rec.error is not None:
            raise rec.error
        source, is_dir = self._sources.get(path) or self._source(path)
        if is_dir:  # HF splits carry their split in the source
            source = self._unit_for(path, int(idx)).source
        sid = sample_id_of(rec.record, f"{source}:{rec.index}")
        sample = normalize_record(
            rec.record, sid, images=rec.images, measured=self.measured, media=rec.media
        )
        refs = [
            image_ref(img, path, self.opts, f"{location}/image{k}")
            for k, img in enumerate(sample.images)
        ]
        media = [
            MediaItem(m, image_ref(item, path, self.opts, f"{location}/{m}{k}", m))
            for m, items in (("video", sample.videos), ("audio", sample.audios))
            for k, item in enumerate(items)
        ]
        return RawSample(
            sample_id=sid, turns=sample.turns, images=refs, raw=record_bytes(rec), media=media
        )
