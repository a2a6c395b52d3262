"""Combine the partial cost tables of a split prep run (``--shard-index K --num-shards N``).

The parts must come from the same inputs, vision policy, tokenizer (compared by its bytes: a
copy at another path on another machine is the same) and template, with the same image check,
and together cover every shard exactly once (each part's position and counts are checked as
they are read); they are concatenated in shard order, so the result equals the
table one unsplit run writes. A ``sample_id`` in more than one part follows a single run's rule:
the first one is kept, later ones go to the errors table as ``duplicate_id``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dataprep.errors import DataprepError
from dataprep.prep_cache import counts_identity
from equishard.common.durable import durable_replace
from equishard.common.errors import describe
from equishard.common.local_files import regular_file
from equishard.common.values import is_count
from equishard.contracts.cost_table import (
    ERRORS_SCHEMA,
    METADATA_KEY,
    errors_path,
    read_cost_table,
    table_metadata,
)

__all__ = ["merge_cost_tables"]

_MUST_MATCH = (
    "format_version",
    "phases",
    "inputs",
    "read_options",
    "image_sizes",
    "check_images",
)
_COUNTS = ("in", "written", "rejected")
# a part from before prep recorded its image check, or its phases
_DEFAULTS = {"check_images": "header", "phases": ["vision", "llm"]}


def _checked(path: str, m: dict) -> dict:
    """A part's metadata with its shard position and counts checked (they come from a file:
    a malformed one is an error naming it, not a KeyError or a wrong total)."""

    shard, counts = m.get("shard"), m.get("counts")
    if not (
        isinstance(shard, dict)
        and is_count(shard.get("index"))
        and is_count(shard.get("num_shards"))
    ):
        raise DataprepError(f"{path}: metadata 'shard' must hold whole numbers index, num_shards")
    if not shard["index"] < shard["num_shards"]:
        raise DataprepError(f"{path}: shard index {shard['index']} of {shard['num_shards']}")
    if not (isinstance(counts, dict) and all(is_count(counts.get(k)) for k in _COUNTS)):
        raise DataprepError(f"{path}: metadata 'counts' must hold whole numbers {_COUNTS}")
    for k in ("damaged_ranges", "cached"):
        if k in counts and not is_count(counts[k]):
            raise DataprepError(f"{path}: metadata count {k!r} must be a whole number >= 0")
    return m


def _first_of_each_id(table: pa.Table) -> tuple[pa.Table, list[dict]]:
    """The rows whose ``sample_id`` was not seen in an earlier row (a single prep run's rule:
    the first one wins), and errors rows for the others."""
    counts = pc.value_counts(table.column("sample_id"))
    if not len(counts.filter(pc.greater(counts.field("counts"), 1))):
        return table, []
    ids = table.column("sample_id").to_pylist()
    seen: set[str] = set()
    keep = []
    for sid in ids:
        keep.append(sid not in seen)
        seen.add(sid)
    dropped = table.filter(pc.invert(pa.array(keep, pa.bool_())))
    rows = [
        {
            "source": r["source"],
            "location": r["location"],
            "line": None,
            "sample_id": r["sample_id"],
            "reason": "duplicate_id",
            "detail": f"sample_id {r['sample_id']!r} is used by an earlier sample",
        }
        for r in dropped.select(["source", "location", "sample_id"]).to_pylist()
    ]
    return table.filter(pa.array(keep, pa.bool_())), rows


def merge_cost_tables(parts: list[str], output: str) -> dict:
    """Merge ``parts`` into ``output`` (and their errors tables next to it); returns the counts."""
    if not parts:
        raise DataprepError("merge needs at least one partial cost table")
    metas = []
    for p in parts:
        try:
            metas.append(_checked(p, table_metadata(p)))
        except (OSError, ValueError, pa.ArrowInvalid) as exc:
            msg = describe(exc)
            raise DataprepError(msg if msg.startswith(str(p)) else f"{p}: {msg}") from None
    ref = metas[0]
    for p, m in zip(parts, metas, strict=False):
        # the settings by what decides the counts (a tokenizer at another path on another
        # machine is the same tokenizer), the rest as recorded
        differ = [
            k for k in _MUST_MATCH if m.get(k, _DEFAULTS.get(k)) != ref.get(k, _DEFAULTS.get(k))
        ]
        if counts_identity(m) != counts_identity(ref):
            differ.insert(0, "tokenizer, template or vision policy")
        if differ:
            raise DataprepError(
                f"{p}: its {differ[0]} differs from {parts[0]}'s; merge only parts of one prep run"
            )
    num = {m["shard"]["num_shards"] for m in metas}
    if len(num) != 1:
        raise DataprepError(f"parts disagree on --num-shards: {sorted(num)}")
    n = num.pop()
    by_index: dict[int, str] = {}
    for p, m in zip(parts, metas, strict=False):
        k = m["shard"]["index"]
        if k in by_index:
            raise DataprepError(f"shard {k} given twice: {by_index[k]} and {p}")
        by_index[k] = p
    missing = sorted(set(range(n)) - set(by_index))
    if missing:
        raise DataprepError(
            f"missing shard(s) {missing} of {n}; run prep with those --shard-index values"
        )
    ordered = [by_index[k] for k in range(n)]
    tables = [read_cost_table(p) for p in ordered]
    table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables])
    table, dup_rows = _first_of_each_id(table)
    err_tables = []
    for p in ordered:
        ep = errors_path(p)
        if not ep.exists():
            raise DataprepError(f"{p}: its errors table {ep} is missing; copy it next to the part")
        try:
            err_tables.append(pq.read_table(regular_file(ep, "table"), schema=ERRORS_SCHEMA))
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise DataprepError(f"{ep}: {describe(exc)}") from None
    errors = pa.concat_tables([*err_tables, pa.Table.from_pylist(dup_rows, schema=ERRORS_SCHEMA)])
    total = {k: sum(m["counts"][k] for m in metas) for k in ("in", "written", "rejected")}
    total["written"] -= len(dup_rows)
    total["rejected"] += len(dup_rows)
    total["damaged_ranges"] = sum(m["counts"].get("damaged_ranges", 0) for m in metas)
    total["cached"] = sum(m["counts"].get("cached", 0) for m in metas)
    meta = {**ref, "shard": {"index": 0, "num_shards": 1}, "counts": total}
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(meta)})
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    for t, dest in ((errors, errors_path(out)), (table, out)):
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        pq.write_table(t, tmp)
        durable_replace(tmp, dest)
    return {k: total[k] for k in ("in", "written", "rejected")}
