"""The cost table contract (DESIGN.md): schema, metadata, and where its errors table lives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "COST_SCHEMA",
    "ERRORS_SCHEMA",
    "FORMAT_VERSION",
    "METADATA_KEY",
    "errors_path",
    "read_cost_table",
    "remove_stale_temps",
    "table_metadata",
]

FORMAT_VERSION = 1
METADATA_KEY = b"equishard.cost_table"

COST_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("source", pa.string()),
        ("num_images", pa.int32()),
        ("vit_tokens", pa.int64()),
        ("vit_seq_lens", pa.list_(pa.int32())),
        ("llm_tokens", pa.int64()),
        ("text_tokens", pa.int64()),
        ("modality", pa.string()),
        ("image_widths", pa.list_(pa.int32())),
        ("image_heights", pa.list_(pa.int32())),
        ("location", pa.string()),
        ("fingerprint", pa.string()),
        # sample_id's cheap change detector (record bytes + image file sizes/mtimes): a later
        # prep with ``cache=`` reuses the row without reading the images when it matches
        ("cache_key", pa.string()),
    ]
)
OPTIONAL_COLUMNS = ("cache_key",)

ERRORS_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("location", pa.string()),
        ("line", pa.int64()),
        ("sample_id", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)


def errors_path(cost_table: str | Path) -> Path:
    """``cost.parquet`` -> ``cost.errors.parquet`` (next to it)."""
    p = Path(cost_table)
    stem = p.name[: -len(".parquet")] if p.name.endswith(".parquet") else p.name
    return p.with_name(stem + ".errors.parquet")


def remove_stale_temps(path: str | Path) -> list[Path]:
    """Remove ``.NAME.tmp-PID`` files next to ``path`` that a killed run left (their process is
    gone); a live run's temp file is left alone. Returns what was removed."""
    p = Path(path)
    removed = []
    for tmp in p.parent.glob(f".{p.name}.tmp-*"):
        pid = tmp.name.rpartition("-")[2]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # alive, another user's
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def table_metadata(path: str | Path) -> dict:
    """The equishard metadata of a cost table (vision policy, tokenizer, template, counts)."""
    meta = pq.read_metadata(path).metadata or {}
    if METADATA_KEY not in meta:
        raise ValueError(
            f"{path}: not an equishard cost table (no {METADATA_KEY.decode()} metadata)"
        )
    return json.loads(meta[METADATA_KEY])


def read_cost_table(path: str | Path) -> pa.Table:
    """Read a cost table, checking the required columns are present."""
    table = pq.ParquetFile(path).read()
    missing = [
        f.name
        for f in COST_SCHEMA
        if f.name not in table.column_names and f.name not in OPTIONAL_COLUMNS
    ]
    if missing:
        raise ValueError(f"{path}: cost table lacks column(s) {missing}")
    for name in OPTIONAL_COLUMNS:  # tables from before the column existed
        if name not in table.column_names:
            table = table.append_column(
                COST_SCHEMA.field(name), pa.nulls(table.num_rows, COST_SCHEMA.field(name).type)
            )
    return table
