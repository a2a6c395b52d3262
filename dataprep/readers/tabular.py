"""Parquet files and Hugging Face ``datasets`` saved with ``save_to_disk``.

Both are Arrow tables with an image column (bytes, a path, an HF ``Image`` struct of bytes and
path, or a list of those) and a text column (``conversations``, ``messages`` or plain ``text``).
Rows are read in small batches without decoding images: HF ``Image`` features are read as their
stored structs through the Arrow format, never as PIL images.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dataprep.errors import DataprepError
from dataprep.readers.base import RawRecord, ReadOptions, WorkUnit
from equishard.common.errors import describe

__all__ = ["is_hf_dataset_dir", "read_hf", "read_parquet", "scan_hf", "scan_parquet"]

_IMAGE_COLUMNS = ("image", "images", "jpg", "png", "image_bytes")
_TEXT_COLUMNS = ("conversations", "messages", "text", "caption")
_BATCH = 256


def _columns(schema: pa.Schema, opts: ReadOptions, where: str) -> tuple[str | None, str]:
    names = set(schema.names)
    if opts.text_column:
        if opts.text_column not in names:
            raise DataprepError(
                f"{where}: no column {opts.text_column!r} (columns: {sorted(names)})"
            )
        text = opts.text_column
    else:
        text = next((c for c in _TEXT_COLUMNS if c in names), None)
        if text is None:
            raise DataprepError(
                f"{where}: no text column; expected one of {list(_TEXT_COLUMNS)} "
                f"(columns: {sorted(names)}); name yours with --text-column"
            )
    if opts.image_column:
        if opts.image_column not in names:
            raise DataprepError(
                f"{where}: no column {opts.image_column!r} (columns: {sorted(names)})"
            )
        image = opts.image_column
    else:
        image = next((c for c in _IMAGE_COLUMNS if c in names), None)
    return image, text


def _to_records(table: pa.Table | pa.RecordBatch, image: str | None, text: str) -> list[dict]:
    rows = table.to_pylist()
    out = []
    for row in rows:
        rec = dict(row)
        if image is not None and image not in ("image", "images"):
            rec["image"] = rec.pop(image)
        if text not in ("conversations", "messages", "text"):
            rec["text"] = rec.pop(text)
        out.append(rec)
    return out


def scan_parquet(path: Path, source: str, chunk: int) -> Iterator[WorkUnit]:
    try:
        meta = pq.ParquetFile(path).metadata
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataprepError(f"{path}: not a readable Parquet file ({describe(exc)})") from None
    first = 0
    for rg in range(meta.num_row_groups):
        n = meta.row_group(rg).num_rows
        if n:
            yield WorkUnit(
                reader="parquet", path=str(path), source=source, first=first, count=n, payload=rg
            )
        first += n


def read_parquet(unit: WorkUnit, opts: ReadOptions) -> Iterator[RawRecord]:
    pf = pq.ParquetFile(unit.path)
    image, text = _columns(pf.schema_arrow, opts, unit.path)
    index = unit.first
    for batch in pf.iter_batches(batch_size=_BATCH, row_groups=[unit.payload]):
        for rec in _to_records(batch, image, text):
            if unit.keeps(index):
                yield RawRecord(index=index, record=rec)
            index += 1


def is_hf_dataset_dir(path: Path) -> bool:
    return path.is_dir() and any(
        (path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json")
    )


_HF_CACHE: dict[tuple, object] = {}


def _stamp(path: str) -> tuple:
    """Every file of a saved dataset with its size and mtime: a dataset saved again at the same
    path (``save_to_disk`` over it) is another dataset, not the one this process loaded."""
    return tuple(
        sorted(
            (os.path.join(d, f), st.st_size, st.st_mtime_ns)
            for d, _, files in os.walk(path)
            for f in files
            for st in (os.stat(os.path.join(d, f)),)
        )
    )


def _load_hf(path: str):
    key = (path, _stamp(path))
    ds = _HF_CACHE.get(key)
    if ds is None:
        import datasets

        try:
            ds = datasets.load_from_disk(path)
        except (FileNotFoundError, ValueError) as exc:
            raise DataprepError(
                f"{path}: not a dataset saved with save_to_disk ({describe(exc)})"
            ) from None
        _HF_CACHE.clear()  # one dataset at a time per process
        _HF_CACHE[key] = ds
    return ds


def scan_hf(path: Path, source: str, chunk: int) -> Iterator[WorkUnit]:
    ds = _load_hf(str(path))
    splits = [(name, ds[name]) for name in sorted(ds)] if isinstance(ds, dict) else [(None, ds)]
    for split, part in splits:
        src = f"{source}/{split}" if split else source
        n = len(part)
        for first in range(0, n, chunk):
            yield WorkUnit(
                reader="hf",
                path=str(path),
                source=src,
                first=first,
                count=min(chunk, n - first),
                payload=split,
            )


def read_hf(unit: WorkUnit, opts: ReadOptions) -> Iterator[RawRecord]:
    ds = _load_hf(unit.path)
    if unit.payload is not None:
        ds = ds[unit.payload]
    arrow = ds.with_format("arrow")
    image, text = _columns(arrow.data.schema, opts, unit.path)
    lo = max(unit.first, unit.start)
    hi = min(unit.first + unit.count, unit.stop)
    for b in range(lo, hi, _BATCH):
        table = arrow[b : min(hi, b + _BATCH)]
        for i, rec in enumerate(_to_records(table, image, text)):
            yield RawRecord(index=b + i, record=rec)
