"""Input readers. Each reader has a ``scan`` (cheap, in the main process: split an input into
work units) and a ``read`` (in a worker: yield the unit's raw records)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

from dataprep.errors import DataprepError
from dataprep.readers.base import ImageRef, RawRecord, ReadOptions, WorkUnit
from dataprep.readers.jsonl import read_json, read_jsonl, scan_json, scan_jsonl
from dataprep.readers.tabular import is_hf_dataset_dir, read_hf, read_parquet, scan_hf, scan_parquet
from dataprep.readers.wds import read_wds, scan_wds

__all__ = [
    "READERS",
    "ImageRef",
    "RawRecord",
    "ReadOptions",
    "WorkUnit",
    "detect_reader",
    "read_unit",
    "scan_inputs",
    "split_units",
]

# name -> (scan, read)
READERS: dict[str, tuple[Callable, Callable]] = {
    "jsonl": (scan_jsonl, read_jsonl),
    "json": (scan_json, read_json),
    "parquet": (scan_parquet, read_parquet),
    "hf": (scan_hf, read_hf),
    "wds": (scan_wds, read_wds),
}

_SUFFIXES = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".tar": "wds"}


def detect_reader(path: Path) -> str:
    if is_hf_dataset_dir(path):
        return "hf"
    if path.is_dir():
        raise DataprepError(
            f"{path}: a directory that is not a saved HF dataset; pass its files "
            "(e.g. dir/*.parquet or dir/*.tar) instead"
        )
    if not path.exists():
        raise DataprepError(f"{path}: no such input file")
    if not path.is_file():  # a FIFO would block the scan forever, a device never end
        raise DataprepError(f"{path}: not a regular file (a FIFO, device or socket), not an input")
    reader = _SUFFIXES.get(path.suffix.lower())
    if reader is None:
        raise DataprepError(
            f"{path}: unknown input format {path.suffix!r}; accepted: .json (LLaVA list), .jsonl, "
            ".parquet, .tar (WebDataset), or a directory saved with datasets' save_to_disk"
        )
    return reader


def scan_inputs(inputs: list[str], chunk: int) -> list[WorkUnit]:
    """Work units of every input, in input order, each knowing its global record offset."""
    units: list[WorkUnit] = []
    total = 0
    for item in inputs:
        path = Path(item).resolve()
        reader = detect_reader(path)
        scan = READERS[reader][0]
        source = path.stem if path.suffix else path.name
        n = 0
        for unit in scan(path, source, chunk):
            units.append(dataclasses.replace(unit, global_first=total + unit.first))
            n = unit.first + unit.count
        total += n
    return units


def split_units(units: list[WorkUnit], shard_index: int, num_shards: int) -> list[WorkUnit]:
    """The units (narrowed at the edges) holding shard ``shard_index`` of ``num_shards``: the
    contiguous global record range [T*k/N, T*(k+1)/N), so shards in order give the whole input."""
    total = sum(u.count for u in units)
    lo = total * shard_index // num_shards
    hi = total * (shard_index + 1) // num_shards
    out = []
    for u in units:
        a, b = u.global_first, u.global_first + u.count
        if b <= lo or a >= hi:
            continue
        out.append(
            dataclasses.replace(
                u, start=u.first + max(0, lo - a), stop=u.first + min(u.count, hi - a)
            )
        )
    return out


def read_unit(unit: WorkUnit, opts: ReadOptions) -> Iterator[RawRecord]:
    return READERS[unit.reader][1](unit, opts)
