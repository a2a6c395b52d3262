"""The cost table contract (docs/concepts.md, Cost table): schema, metadata, and where its
errors table lives."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from equishard.common.errors import describe
from equishard.common.local_files import regular_file
from equishard.common.repeated_ids import repeated_mask
from equishard.common.values import check_count
from equishard.contracts.columns import (
    IMAGE_HEIGHTS,
    IMAGE_WIDTHS,
    LLM_TOKENS,
    NUM_IMAGES,
    TEXT_TOKENS,
    VIT_SEQ_LENS,
    VIT_TOKENS,
)
from equishard.contracts.phases import ENCODER_PHASES, VISION, Phase, encoder_phases

__all__ = [
    "COST_SCHEMA",
    "ERRORS_SCHEMA",
    "FORMAT_VERSION",
    "METADATA_KEY",
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "check_repeated_ids",
    "conform_cost_table",
    "cost_schema",
    "errors_path",
    "read_cost_table",
    "remove_stale_temps",
    "table_metadata",
    "table_phases",
    "validate_cost_table",
]

FORMAT_VERSION = 1
METADATA_KEY = b"equishard.cost_table"

COST_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("source", pa.string()),
        (NUM_IMAGES, pa.int32()),
        (VIT_TOKENS, pa.int64()),
        (VIT_SEQ_LENS, pa.list_(pa.int32())),
        (LLM_TOKENS, pa.int64()),
        (TEXT_TOKENS, pa.int64()),
        ("modality", pa.string()),
        (IMAGE_WIDTHS, pa.list_(pa.int32())),
        (IMAGE_HEIGHTS, pa.list_(pa.int32())),
        ("location", pa.string()),
        ("fingerprint", pa.string()),
        # sample_id's cheap change detector (record bytes + image file sizes/mtimes), sealed
        # with the row's counts and settings (``<input key>.<seal>``): a later prep with
        # ``cache=`` reuses the row without reading the images when both still match
        ("cache_key", pa.string()),
    ]
)
# plausible per-sample bounds, far above any real sample (a long video is millions of tokens):
# a table's sums over billions of such samples stay inside 64-bit integers (the lengths in
# vit_seq_lens are 32-bit: bounded by their type)
MAX_SAMPLE_TOKENS = 1 << 32
MAX_SAMPLE_IMAGES = 1 << 20

REQUIRED_COLUMNS = (
    "sample_id",
    "source",
    NUM_IMAGES,
    VIT_TOKENS,
    VIT_SEQ_LENS,
    LLM_TOKENS,
    TEXT_TOKENS,
)
# the contract's optional columns (docs/concepts.md): a table from another tool may leave them
# out. Missing ones are filled where read: ``modality`` from ``num_images``, the rest as nulls
# (``write`` needs ``location``; a missing ``fingerprint`` or ``cache_key`` only skips a check
# or a reuse).
OPTIONAL_COLUMNS = tuple(f.name for f in COST_SCHEMA if f.name not in REQUIRED_COLUMNS)

# the types of an encoder phase's columns (equishard.contracts.phases): as the vision phase's
_PHASE_TYPES = {"items": pa.int32(), "tokens": pa.int64(), "seq_lens": pa.list_(pa.int32())}


def _phase_fields(phase: Phase) -> list[pa.Field]:
    return [pa.field(getattr(phase, k), t) for k, t in _PHASE_TYPES.items()]


def cost_schema(phases: tuple[Phase, ...] = (VISION,)) -> pa.Schema:
    """The schema of a cost table of these encoder phases: :data:`COST_SCHEMA` (the vision
    phase's columns among them), then each other phase's columns in :data:`ENCODER_PHASES`'
    order."""
    extra = [f for p in ENCODER_PHASES[1:] if p in phases for f in _phase_fields(p)]
    return pa.schema([*COST_SCHEMA, *extra])


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


@contextlib.contextmanager
def _parquet_errors(path):
    """pyarrow's own errors for a truncated or garbage file name no file ("Parquet magic bytes
    not found in footer"): ``ValueError`` naming ``path`` and what to do instead."""
    try:
        yield
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(
            f"{path}: not a readable Parquet cost table ({describe(exc)}); it is truncated or "
            "not Parquet: write it again with 'equishard prep'"
        ) from None


def table_metadata(path: str | Path, *, required: bool = True) -> dict:
    """The equishard metadata of a cost table (vision policy, tokenizer, template, counts);
    ``required=False`` gives ``{}`` for a table another tool wrote."""
    with _parquet_errors(path):
        meta = pq.read_metadata(regular_file(path, "table")).metadata or {}
    if METADATA_KEY not in meta:
        if not required:
            return {}
        raise ValueError(
            f"{path}: not an equishard cost table (no {METADATA_KEY.decode()} metadata)"
        )
    try:
        out = json.loads(meta[METADATA_KEY])
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep
        raise ValueError(f"{path}: its equishard metadata is not JSON ({exc})") from None
    if not isinstance(out, dict):
        raise ValueError(f"{path}: its equishard metadata is not a JSON object")
    return out


def table_phases(table: pa.Table, path: str | Path = "") -> tuple[Phase, ...]:
    """The encoder phases a cost table describes (:func:`~equishard.contracts.phases.encoder_phases`),
    checked against the ``phases`` its metadata lists, where it lists them."""
    recorded = None
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    if raw is not None:
        try:
            meta = json.loads(raw)
        except (ValueError, RecursionError):
            meta = None  # table_metadata names a broken one where it is read
        if isinstance(meta, dict):
            recorded = meta.get("phases")
    return encoder_phases(table.column_names, recorded, str(path))


def _bad_rows(
    table: pa.Table, repeated_ids: bool = True, path: str | Path = ""
) -> list[tuple[str, pa.Array]]:
    """(what is wrong, row mask) for each rule a row of the table breaks."""
    ids = table.column("sample_id")
    rules = [("sample_id is missing or empty", pc.or_kleene(pc.is_null(ids), pc.equal(ids, "")))]
    if repeated_ids:
        rules += _repeated_rule(ids)
    phases = table_phases(table, path)
    counts = [name for p in phases for name in (p.items, p.tokens)] + [LLM_TOKENS, TEXT_TOKENS]
    for name in counts:
        col = table.column(name)
        rules.append(
            (f"{name} is missing or negative", pc.or_kleene(pc.is_null(col), pc.less(col, 0)))
        )
        top = MAX_SAMPLE_IMAGES if name in {p.items for p in phases} else MAX_SAMPLE_TOKENS
        rules.append(  # sums of such counts overflow 64-bit integers: the plan would be wrong
            (f"{name} is above the plausible {top} a sample", pc.greater(col, top))
        )
    flats = {}
    for phase in phases:
        seq = table.column(phase.seq_lens)
        rules.append((f"{phase.seq_lens} is missing", pc.is_null(seq)))
        flat = flats[phase.name] = pc.list_flatten(seq)
        smallest = pc.min(flat).as_py() if table.num_rows else None
        if smallest is not None and smallest < 0:
            rules.append(
                (
                    f"{phase.seq_lens} holds a negative length",
                    _rows_where(seq, pc.less(flat, 0)),
                )
            )
    lists = [(p.seq_lens, flats[p.name]) for p in phases]
    for name in (IMAGE_WIDTHS, IMAGE_HEIGHTS):  # a null inside a list: a sample document no
        if name in table.column_names:  # reader takes (shards/format/sample_doc.py)
            lists.append((name, pc.list_flatten(table.column(name))))
    for name, values in lists:
        if values.null_count:
            rules.append(
                (
                    f"{name} holds a missing value",
                    _rows_where(table.column(name), pc.is_null(values)),
                )
            )
    rules.append(
        (
            "llm_tokens is less than text_tokens",
            pc.fill_null(pc.less(table.column(LLM_TOKENS), table.column(TEXT_TOKENS)), False),
        )
    )
    for phase in phases:  # a null inside the list is its own rule above
        if not flats[phase.name].null_count:
            rules += _consistency_rules(table, phase)
    return rules


SUM_ROWS = 1 << 20  # rows whose sequence lengths are summed at a time


def _list_sums(chunk: pa.ListArray) -> np.ndarray:
    """Each row's sum of an integer list array (a slice of one: its offsets are absolute
    positions in the whole child array, of which only the slice's values are read)."""
    offsets = np.asarray(chunk.offsets, dtype=np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    values = chunk.values.slice(lo, hi - lo).to_numpy(zero_copy_only=False)
    running = np.concatenate(([0], np.cumsum(np.asarray(values, dtype=np.int64))))
    return (running[offsets[1:] - lo] - running[offsets[:-1] - lo]).astype(np.float64)


def _sums_differ(seq: pa.ChunkedArray, tokens: pa.ChunkedArray) -> np.ndarray:
    """Rows whose count in ``tokens`` is not the sum of their list in ``seq`` (a missing count
    is its own rule), ``SUM_ROWS`` rows at a time: at 10M rows the whole column's values, running
    sums and differences at once were 0.9 GB, the balance command's peak memory."""
    out = np.ones(len(seq), dtype=bool)  # a row never compared is refused, never let through
    for start in range(0, len(seq), SUM_ROWS):
        part = seq.slice(start, SUM_ROWS)
        sums = np.concatenate([np.zeros(0), *(_list_sums(c) for c in part.chunks)])
        tok = tokens.slice(start, SUM_ROWS).to_numpy(zero_copy_only=False)
        out[start : start + sums.size] = (tok != sums) & ~np.isnan(tok.astype(np.float64))
    return out


def _consistency_rules(table: pa.Table, phase: Phase) -> list[tuple[str, pa.Array]]:
    """The columns of a row agree (docs/concepts.md): a phase's tokens are the sum of its
    sequence lengths (balancing reads the one, the cost model and the encoder the other) and
    image sizes, where given, are one per image (a text-only sample may still run the encoder
    on a dummy tile, as InternVL's do: its sequences are not refused). A table made by hand or
    another tool that breaks them would be balanced by other numbers than the model runs."""
    if not table.num_rows:
        return []
    differ = _sums_differ(table.column(phase.seq_lens), table.column(phase.tokens))
    rules = [(f"{phase.tokens} is not the sum of {phase.seq_lens}", pa.array(differ))]
    if phase is not VISION:
        return rules
    for name in (IMAGE_WIDTHS, IMAGE_HEIGHTS):
        if name in table.column_names:
            given = pc.list_value_length(table.column(name))  # null where not given
            rules.append(
                (
                    f"{name} does not hold one size per image (num_images)",
                    pc.fill_null(pc.not_equal(given, table.column(NUM_IMAGES)), False),
                )
            )
    return rules


def _rows_where(seq, flat_mask) -> pa.Array:
    """Rows of the list column ``seq`` with an element where ``flat_mask`` (over its flattened
    values) is true."""
    parents = pc.list_parent_indices(seq)
    bad = np.zeros(len(seq), dtype=bool)
    hit = np.asarray(flat_mask.to_numpy(zero_copy_only=False), dtype=bool)
    bad[np.asarray(parents)[hit]] = True
    return pa.array(bad)


def _repeated_rule(ids: pa.ChunkedArray) -> list[tuple[str, pa.Array]]:
    repeated = repeated_mask(ids)
    return [("sample_id appears more than once", pa.array(repeated))] if repeated.any() else []


def validate_cost_table(table: pa.Table, path: str | Path, *, repeated_ids: bool = True) -> None:
    """Refuse a table with a row that cannot be balanced or written (a missing or repeated id,
    a missing or negative count), naming the file, the rows' ids and the rule.
    ``repeated_ids=False``: every rule but the repeated ids (most of the time at 10M rows), which
    :func:`check_repeated_ids` then checks, e.g. in a thread beside balancing: a repeated id
    changes no count the balancer reads, only which rows the output may hold."""
    _refuse(table, path, _bad_rows(table, repeated_ids, path))


def check_repeated_ids(table: pa.Table, path: str | Path) -> None:
    """:func:`validate_cost_table`'s repeated-``sample_id`` rule alone (its kernel releases the
    GIL, so a thread runs it beside other work)."""
    _refuse(table, path, _repeated_rule(table.column("sample_id")))


def _refuse(table: pa.Table, path: str | Path, rules: list[tuple[str, pa.Array]]) -> None:
    for why, mask in rules:
        mask = pc.fill_null(mask, False)
        if pc.any(mask).as_py():
            bad = table.filter(mask)
            ids = bad.column("sample_id").to_pylist()[:5]
            rows = np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool))[:5]
            raise ValueError(
                f"{path}: {len(bad)} row(s) where {why}, e.g. rows {rows.tolist()} "
                f"(sample_id {ids}); fix or drop them (prep writes valid tables)"
            )


@functools.cache
def _modalities() -> pa.Array:
    # built on first use: pyarrow imports pandas to build any array (0.13 s of `import balancing`)
    return pa.array(["text", "image", "multi-image"])


def _modality(num_images: pa.ChunkedArray) -> pa.Array:
    n = np.asarray(num_images.to_numpy(zero_copy_only=False))
    # taken by index in arrow: a numpy array of strings cost a tenth of import-lengths' time
    return _modalities().take(pa.array(np.where(n == 0, 0, np.where(n == 1, 1, 2))))


def conform_cost_table(
    table: pa.Table, path: str | Path, *, required_only: bool = False
) -> pa.Table:
    """The table in :data:`COST_SCHEMA`'s columns and types: required columns checked, missing
    optional ones filled (``modality`` from ``num_images``, the rest null), other integer widths
    cast; extra columns (``audio_tokens``, your own) are kept after them. ``required_only``:
    :data:`REQUIRED_COLUMNS` alone, in their types."""
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(
            f"{path}: cost table lacks required column(s) {missing}; a cost table needs "
            f"{list(REQUIRED_COLUMNS)} (optional: {list(OPTIONAL_COLUMNS)}). "
            "Lengths in the OmniBal/InternVL JSON format: convert them with "
            "'equishard import-lengths'"
        )
    phases = encoder_phases(table.column_names, where=str(path))  # checked: all or none
    phase_fields = [f for p in phases[1:] for f in _phase_fields(p)]
    columns = {}
    for f in [*COST_SCHEMA, *phase_fields]:
        if f.name not in table.column_names and f in phase_fields:
            continue
        if required_only and f.name not in REQUIRED_COLUMNS and f not in phase_fields:
            continue
        if f.name in table.column_names:
            col = table.column(f.name)
            if col.type != f.type:
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ValueError(
                        f"{path}: column {f.name!r} is {col.type}, expected {f.type} ({exc})"
                    ) from None
        elif f.name == "modality":
            col = _modality(columns[NUM_IMAGES]) if table.num_rows else pa.array([], pa.string())
        else:
            col = pa.nulls(table.num_rows, f.type)
        columns[f.name] = col
    extra = (
        {}
        if required_only
        else {c: table.column(c) for c in table.column_names if c not in columns}
    )
    known = [f for f in [*COST_SCHEMA, *phase_fields] if f.name in columns]
    fields = [*known, *(pa.field(c, col.type) for c, col in extra.items())]
    schema = pa.schema(fields, metadata=table.schema.metadata)
    return pa.table({**columns, **extra}, schema=schema)


def read_cost_table(
    path: str | Path, *, validate: bool = True, required_only: bool = False
) -> pa.Table:
    """Read a cost table: the required columns must be there, optional ones are filled
    (:func:`conform_cost_table`), and (``validate``) every row must be usable
    (:func:`validate_cost_table`). ``required_only``: only :data:`REQUIRED_COLUMNS` are read
    (what balancing needs: at 10M rows the other columns are half the reading)."""
    with _parquet_errors(path):
        file = pq.ParquetFile(regular_file(path, "table"))
        names = None
        if required_only:  # and every encoder phase's: a plan leaves none out unseen
            wanted = {*REQUIRED_COLUMNS, *(c for p in ENCODER_PHASES for c in p.columns)}
            names = [c for c in file.schema_arrow.names if c in wanted]
        raw = file.read(columns=names)
    table = conform_cost_table(raw, path, required_only=required_only)
    if validate:
        validate_cost_table(table, path)
    return table


def cost_table_rows(path: str | Path) -> int:
    """The number of rows of a cost table, from its footer (nothing else read)."""
    with _parquet_errors(path):
        return pq.read_metadata(regular_file(path, "table")).num_rows


def read_cost_rows(
    path: str | Path, start: int, stop: int, *, batch_rows: int = 1 << 16
) -> pa.Table:
    """Rows ``start`` to ``stop`` of a cost table, balancing's columns only (as
    ``read_cost_table(required_only=True, validate=False)`` reads them): see
    :func:`iter_cost_rows`."""
    chunks = list(iter_cost_rows(path, start, stop, batch_rows=batch_rows))
    return pa.concat_tables(chunks) if len(chunks) > 1 else chunks[0]


def iter_cost_rows(
    path: str | Path,
    start: int,
    stop: int,
    *,
    chunk_rows: int | None = None,
    batch_rows: int = 1 << 16,
):
    """Rows ``start`` to ``stop`` of a cost table in tables of ``chunk_rows`` (the last may be
    shorter; None: one table; no rows: one empty table), balancing's columns only, each
    conformed (:func:`conform_cost_table`). Only the row groups the rows overlap are decoded, a
    batch of ``batch_rows`` at a time, so a reader holds one chunk and one batch beyond what it
    keeps (a worker of a plan over partitions reads its share of one file this way)."""
    check_count("batch_rows", batch_rows, 1)
    check_count("chunk_rows", chunk_rows, 1, none=True)
    with _parquet_errors(path):
        # buffered column reads: a worker reading 1,000 rows peaked 12 MB higher without
        file = pq.ParquetFile(regular_file(path, "table"), buffer_size=1 << 20)
        n = file.metadata.num_rows
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop <= n):
            raise ValueError(f"{path}: rows {start!r}..{stop!r} are not within its {n} rows")
        wanted = {*REQUIRED_COLUMNS, *(c for p in ENCODER_PHASES for c in p.columns)}
        names = [c for c in file.schema_arrow.names if c in wanted]
        schema = file.schema_arrow
        schema = pa.schema([schema.field(c) for c in names], metadata=schema.metadata)
        ends = np.cumsum([file.metadata.row_group(i).num_rows for i in range(file.num_row_groups)])
        first = int(np.searchsorted(ends, start, side="right"))
        last = int(np.searchsorted(ends, stop, side="left"))
        groups = list(range(first, min(last + 1, file.num_row_groups)))
        batches = file.iter_batches(batch_rows, row_groups=groups, columns=names)
    pos = int(ends[first - 1]) if first else 0
    want = chunk_rows or max(stop - start, 1)
    kept: list[pa.RecordBatch] = []
    held = 0
    at = start  # the first row of the chunk being gathered
    while start < stop and pos < stop:
        with _parquet_errors(path):
            batch = next(batches, None)
        if batch is None:
            break
        a, b = max(start, pos), min(stop, pos + batch.num_rows)
        pos += batch.num_rows
        while a < b:  # a batch may close a chunk and open the next
            take = min(b - a, want - held)
            kept.append(batch.slice(a - (pos - batch.num_rows), take))
            held, a = held + take, a + take
            if held == want:
                yield _chunk(path, kept, schema, at, at + held)
                kept, at, held = [], at + held, 0
    if held or start == stop:
        yield _chunk(path, kept, schema, at, at + held)
        at += held
    if at != stop:
        raise ValueError(f"{path}: rows {at}..{stop - 1} could not be read: truncated?")


def _chunk(path, kept, schema, a: int, b: int) -> pa.Table:
    raw = pa.Table.from_batches(kept, schema=schema)
    if raw.num_rows != b - a:
        raise ValueError(f"{path}: rows {a}..{b} read as {raw.num_rows} rows: truncated?")
    return conform_cost_table(raw, path, required_only=True)
