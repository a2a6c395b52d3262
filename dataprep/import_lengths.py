"""Convert per-sample length files from other tools into a cost table, so they can be balanced.

The OmniBal / InternVL-Chat format is a JSON list (or JSON lines) with one object per sample:

* ``vit_num`` — tiles the vision encoder runs (a text-only sample may carry one dummy tile),
* ``token_num`` — the full LLM sequence length (text plus image tokens),
* ``image_flags`` — how many of those tiles are real (their embeddings reach the LLM).

One tile is ``patches_per_tile`` encoder patches (one encoder sequence) and ``tokens_per_tile``
LLM tokens. The format does not say how many images the tiles came from, so ``num_images`` is 1
for a sample with real tiles and 0 for a text-only one. Sample ids are ``SOURCE:INDEX`` (the
0-based position in the file), the same fallback ids ``prep`` gives records without an id.
An entry that cannot be a sample goes to the errors table with its reason; nothing is dropped
silently.
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from equishard.common.durable import durable_replace
from equishard.common.options import option
from equishard.common.values import check_count
from equishard.contracts.columns import (
    LLM_TOKENS,
    NUM_IMAGES,
    TEXT_TOKENS,
    VIT_SEQ_LENS,
    VIT_TOKENS,
)
from equishard.contracts.cost_table import (
    COST_SCHEMA,
    ERRORS_SCHEMA,
    FORMAT_VERSION,
    METADATA_KEY,
    conform_cost_table,
    errors_path,
    remove_stale_temps,
)

__all__ = ["ImportLengthsConfig", "ImportResult", "import_lengths"]

KEYS = ("vit_num", "token_num", "image_flags")


@dataclass(frozen=True, kw_only=True)
class ImportLengthsConfig:
    inputs: tuple[str, ...] = field(
        metadata=option(
            "length files (.json / .jsonl)", flag="", nargs="+", metavar="LENGTHS", parse=tuple
        )
    )
    output: str = field(
        metadata=option(
            "cost table to write", short="-o", flag="--output", required=True, metavar="COST_TABLE"
        )
    )
    patches_per_tile: int = field(
        default=1024,  # 448 px tiles, patch 14
        metadata=option(
            "encoder patches per tile (default 1024: InternVL's 448 px tiles at patch 14)"
        ),
    )
    tokens_per_tile: int = field(
        default=256,  # after InternVL's 0.5 pixel shuffle
        metadata=option(
            "LLM tokens per real tile (default 256: 1024 patches after 0.5 pixel shuffle)"
        ),
    )

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError("no inputs: give one or more length files (.json or .jsonl)")
        for p in self.inputs:
            if not Path(p).is_file():
                raise ValueError(f"{p}: no such length file")
        if not self.output.endswith(".parquet"):
            raise ValueError(
                f"output {self.output!r} must end in .parquet (e.g. -o build/cost.parquet)"
            )
        # InternVL: 1024 and 256; both multiply a row's tile count into its int32 lengths
        check_count("--patches-per-tile (InternVL: 1024)", self.patches_per_tile, 1, 1 << 20)
        check_count("--tokens-per-tile (InternVL: 256)", self.tokens_per_tile, 0, 1 << 20)
        sources = [Path(p).stem for p in self.inputs]
        if len(set(sources)) != len(sources):
            raise ValueError(
                f"two inputs share a file name ({sources}): sample ids are NAME:INDEX, so "
                "rename one of them"
            )


@dataclass(slots=True)
class ImportResult:
    output: str
    errors_output: str
    n_in: int = 0
    n_written: int = 0
    n_rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


# plausible per-sample bounds: far above any real sample (InternVL's dynamic tiling gives at
# most tens of tiles an image), far below what would overflow a cost-table column
MAX_TILES = 1 << 16
MAX_TOKENS = 1 << 26
_OFFSETS = 1 << 31  # a list column's 32-bit offsets: tiles per chunk stay below
_STREAM_BYTES = 64 << 20  # files this large are parsed as they are read (small ones whole)
_WINDOW = 1 << 20  # characters of a streamed JSON list decoded at a time
_BATCH = 1 << 18  # entries per written row group: memory stays flat with the input's length


class _BadLine:
    """A line of a JSON-lines file that is not JSON: that entry's errors row."""

    def __init__(self, line: int, why: str) -> None:
        self.line, self.why = line, why


def _entries(path: Path) -> Iterator[tuple[list[int] | None, list]]:
    """The file's entries in batches ``(line numbers or None, values)``: a JSON list, or one
    JSON value per line (a line that is not JSON is kept as a :class:`_BadLine`, not the whole
    file's failure). A file of ``_STREAM_BYTES`` or more is read as it is parsed (a list value by
    value, JSON lines line by line), so memory does not grow with its length."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4096).lstrip()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the length file ({exc.strerror or exc})") from None
    if size >= _STREAM_BYTES and head[:1] == b"[":
        return _list_entries(path)
    if size >= _STREAM_BYTES and head[:1] == b"{":
        return _batched(_line_entries(path))
    return _batched(iter(_whole_entries(path)))


def _batched(entries: Iterator[tuple[int | None, object]]) -> Iterator[tuple[list | None, list]]:
    """``(line, value)`` pairs as batches of at most ``_BATCH`` values with their lines."""
    while batch := list(itertools.islice(entries, _BATCH)):
        lines = [line for line, _ in batch]
        yield (None if lines[0] is None else lines), [value for _, value in batch]


def _whole_entries(path: Path) -> list[tuple[int | None, object]]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the length file ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as first:
        out = list(_line_entries(path, raw.splitlines()))
        if out and all(isinstance(v, _BadLine) for _, v in out):
            raise ValueError(
                f"{path}: neither a JSON list nor JSON lines ({_short(first)}); the length "
                'format is [{"vit_num": 1, "token_num": 358, "image_flags": 1}, ...]'
            ) from None
        return out
    if isinstance(data, dict):  # one JSON object per line, but only one line
        return [(1, data)]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of samples, got {type(data).__name__}")
    return [(None, v) for v in data]


def _line_entries(path: Path, lines=None) -> Iterator[tuple[int | None, object]]:
    """One JSON value per line, a line that is not JSON its own :class:`_BadLine`; a file none
    of whose lines is JSON is refused whole (streamed: when its end is reached)."""
    good = bad = 0
    with contextlib.ExitStack() as stack:
        if lines is None:
            lines = stack.enter_context(open(path, "rb"))
        for no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
                good += 1
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
                value = _BadLine(no, f"line {no} is not JSON ({_short(exc)})")
                bad += 1
            yield no, value
    if bad and not good and lines is None:
        raise ValueError(
            f"{path}: no line of it is JSON; the length format is JSON lines or a list"
        )


def _list_entries(path: Path) -> Iterator[tuple[None, list]]:
    """The values of a JSON list, decoded from a window of the file at a time: each window's
    whole values in one call where the window ends between two of them, else one value at a
    time; as batches ``(None, values)``."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        buf, pos, eof, done = "", 0, False, 0

        def more(need: int = _WINDOW) -> None:
            nonlocal buf, pos, eof, done
            while not eof and len(buf) - pos < need:
                chunk = f.read(_WINDOW)
                eof = not chunk
                try:
                    text = utf8.decode(chunk, final=eof)
                except UnicodeDecodeError as exc:
                    raise ValueError(
                        f"{path}: not UTF-8 near byte {f.tell()} ({exc.reason})"
                    ) from None
                done += pos
                buf, pos = buf[pos:] + text, 0

        def skip() -> str:
            nonlocal pos
            while True:
                more(1)
                while pos < len(buf) and buf[pos] in " \t\r\n":
                    pos += 1
                if pos < len(buf) or eof:
                    return buf[pos : pos + 1]

        def broken(why: str) -> ValueError:
            return ValueError(f"{path}: not a JSON list at character {done + pos} ({why})")

        if skip() != "[":
            raise broken("it does not start with '['")
        pos += 1
        if skip() == "]":
            pos += 1
        else:
            while True:
                skip()
                # fast path: every value up to the window's last "}," decoded in one call (the
                # prefix parses as whole values only when the cut is between two of them)
                cut = buf.rfind("},", pos)
                if cut > pos:
                    values = _window_values(buf[pos : cut + 1])
                    if values is not None:
                        yield None, values
                        pos = cut + 2
                        continue
                need = _WINDOW
                while True:  # a value and the character after it in the window
                    more(need)
                    try:
                        value, end = decoder.raw_decode(buf, pos)
                    except (json.JSONDecodeError, RecursionError) as exc:
                        if eof:
                            raise broken(_short(exc)) from None
                        need *= 2  # a value longer than the window
                        continue
                    if end < len(buf) or eof:
                        break
                    need *= 2
                pos = end
                yield None, [value]
                sep = skip()
                pos += 1
                if sep == "]":
                    break
                if sep != ",":
                    raise broken(f"expected ',' or ']', found {sep or 'the end'!r}")
        if skip():
            raise broken("there is more after the list's end")


class _Fast(list):
    """A window's values as orjson decoded them, with the window's text: orjson turns an
    integer past 64 bits into a float where ``json`` keeps it exact, so a batch that is not
    all plain integers is decoded again by ``json`` (:meth:`exact`) before its entries are
    explained."""

    def __init__(self, values: list, text: str) -> None:
        super().__init__(values)
        self.text = text

    def exact(self) -> list:
        try:
            return json.loads(f"[{self.text}]")
        except RecursionError:  # deeper than json goes (orjson takes 1024 levels)
            return list(self)


def _window_values(text: str) -> list | None:
    """The values of ``text`` (a run of a JSON list's values, commas between them), or None
    where it is not that: orjson first (about 1.6x json's speed), ``json`` where orjson refuses
    (NaN, a lone surrogate: JSON that Python's json takes)."""
    try:
        return _Fast(orjson.loads(f"[{text}]"), text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(f"[{text}]")
    except (json.JSONDecodeError, RecursionError):
        return None


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200] if str(exc) else type(exc).__name__


def _why_not(entry, cfg: ImportLengthsConfig) -> str | None:
    if isinstance(entry, _BadLine):
        return entry.why
    if not isinstance(entry, dict):
        return f"entry is a {type(entry).__name__}, not an object with {list(KEYS)}"
    missing = [k for k in KEYS if k not in entry]
    if missing:
        return f"entry lacks {missing}"
    for k in KEYS:
        v = entry[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return f"{k} must be an integer >= 0, got {v!r:.80}"
    if entry["vit_num"] > MAX_TILES:
        return f"vit_num {entry['vit_num']} is above the plausible {MAX_TILES} tiles a sample"
    if entry["token_num"] > MAX_TOKENS:
        return f"token_num {entry['token_num']} is above the plausible {MAX_TOKENS} a sample"
    if entry["image_flags"] > entry["vit_num"]:
        return f"image_flags {entry['image_flags']} exceeds vit_num {entry['vit_num']}"
    if entry["token_num"] < entry["image_flags"] * cfg.tokens_per_tile:
        return (
            f"token_num {entry['token_num']} is less than the image tokens of "
            f"{entry['image_flags']} tile(s) x {cfg.tokens_per_tile}: check --tokens-per-tile"
        )
    return None


def _int_columns(values: list) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``vit_num``, ``token_num`` and ``image_flags`` of every value as int64 columns, or None
    where a value is not an object with all three as JSON integers (a bool, a float, a string,
    a missing key, an integer past int64): such a batch is checked entry by entry."""
    try:
        cols = [[v[k] for v in values] for k in KEYS]
    except (KeyError, TypeError, IndexError):  # not an object, or a key missing
        return None
    if any(set(map(type, c)) != {int} for c in cols):  # bool is not int here: its own type
        return None
    try:
        vit, tok, flags = (np.array(c, dtype=np.int64) for c in cols)
    except OverflowError:
        return None
    return vit, tok, flags


def _plausible(vit, tok, flags, cfg: ImportLengthsConfig) -> np.ndarray:
    """Where :func:`_why_not` finds nothing wrong, for whole columns at once (its
    plain-Python twin: the tests hold them equal)."""
    # token_num >= 0 follows from the last two (tokens_per_tile >= 0)
    return (
        (vit >= 0) & (flags >= 0)
        & (vit <= MAX_TILES) & (tok <= MAX_TOKENS) & (flags <= vit)
        & (tok >= flags * cfg.tokens_per_tile)
    )  # fmt: skip


def _table(
    tiles: np.ndarray, llm: np.ndarray, real: np.ndarray, index: np.ndarray, source: str,
    cfg: ImportLengthsConfig,
) -> pa.Table:  # fmt: skip
    # vit_seq_lens is a list column with 32-bit offsets: one chunk per < 2^31 tiles
    ends = np.cumsum(tiles)
    cuts = [0]
    while cuts[-1] < len(tiles):
        base = ends[cuts[-1] - 1] if cuts[-1] else 0
        cuts.append(max(cuts[-1] + 1, int(np.searchsorted(ends, base + _OFFSETS - 1, "right"))))
    chunks = []
    for lo, hi in itertools.pairwise(cuts):
        offsets = np.concatenate([[0], np.cumsum(tiles[lo:hi])])
        assert offsets[-1] < _OFFSETS, "a chunk of tiles overflows 32-bit list offsets"
        chunks.append(
            pa.ListArray.from_arrays(
                pa.array(offsets.astype(np.int32)),
                pa.array(np.full(int(offsets[-1]), cfg.patches_per_tile, np.int32)),
            )
        )
    seq = pa.chunked_array(chunks, pa.list_(pa.int32()))
    n = len(index)
    # SOURCE:INDEX, joined in arrow (a Python string a row took a fifth of the import's time)
    ids = pc.binary_join_element_wise(
        pa.repeat(f"{source}:", n), pc.cast(pa.array(index), pa.string()), ""
    )
    return pa.table(
        {
            "sample_id": ids,
            "source": pa.repeat(source, n),
            NUM_IMAGES: pa.array((real > 0).astype(np.int32)),
            VIT_TOKENS: pa.array(tiles * cfg.patches_per_tile),
            VIT_SEQ_LENS: seq,
            LLM_TOKENS: pa.array(llm),
            TEXT_TOKENS: pa.array(llm - real * cfg.tokens_per_tile),
        }
    )


class _Sink:
    """The two tables being written, a batch at a time: rows of good entries, errors rows."""

    def __init__(self, writer, err_writer, cfg: ImportLengthsConfig, result: ImportResult):
        self.writer, self.err_writer, self.cfg, self.result = writer, err_writer, cfg, result
        self.schema = writer.schema.remove_metadata()
        self.reasons: Counter = Counter()
        self.good: list[tuple[np.ndarray, ...]] = []  # (vit, tok, flags, index) column parts
        self.held = 0
        self.errors: list[dict] = []

    def flush(self, source: str) -> None:
        """Write what is held."""
        if self.good:
            vit, tok, flags, index = (np.concatenate(c) for c in zip(*self.good, strict=True))
            table = conform_cost_table(
                _table(vit, tok, flags, index, source, self.cfg), self.cfg.output
            )
            self.writer.write_table(table.select(self.schema.names).cast(self.schema))
            self.result.n_written += len(index)
            self.good = []
        if self.errors:
            self.err_writer.write_table(pa.Table.from_pylist(self.errors, schema=ERRORS_SCHEMA))
            self.result.n_rejected += len(self.errors)
            self.reasons.update(e["reason"] for e in self.errors)
            self.errors = []
        self.held = 0

    def _error(self, path: Path, source: str, i: int, line: int | None, why: str) -> None:
        where = f"{path} entry {i}{f' (line {line})' if line else ''}"
        self.errors.append(
            {
                "source": source,
                "location": f"{path}#{i}",
                "line": line,
                "sample_id": f"{source}:{i}",
                "reason": "invalid_lengths",
                "detail": f"{where}: {why}",
            }
        )

    def read(self, path: Path) -> None:
        source = path.stem
        start = 0
        for lines, values in _entries(path):
            n = len(values)
            self.result.n_in += n
            index = np.arange(start, start + n, dtype=np.int64)
            cols = _int_columns(values)
            if cols is None and isinstance(values, _Fast):
                values = values.exact()
            if cols is not None:  # the batch's columns checked at once, the bad rows explained
                ok = _plausible(*cols, self.cfg)
                why = {int(k): _why_not(values[k], self.cfg) for k in np.flatnonzero(~ok)}
            else:  # a value of another type in the batch: entry by entry
                why = {k: w for k, v in enumerate(values) if (w := _why_not(v, self.cfg))}
                ok = np.ones(n, dtype=bool)
                ok[list(why)] = False
                cols = tuple(
                    np.array([v[key] if ok[k] else 0 for k, v in enumerate(values)], np.int64)
                    for key in KEYS
                )
            for k, w in why.items():
                assert w is not None, f"{path} entry {start + k}: checks disagree"
                self._error(path, source, start + k, lines[k] if lines else None, w)
            self.good.append((*(c[ok] for c in cols), index[ok]))
            self.held += n
            start += n
            if self.held >= _BATCH:
                self.flush(source)
        self.flush(source)


def import_lengths(cfg: ImportLengthsConfig) -> ImportResult:
    """Write ``cfg.output`` (cost table) and its errors table from the length files, a batch of
    entries at a time (memory does not grow with the inputs' length)."""
    out = Path(cfg.output)
    err_out = errors_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for p in (out, err_out):
        remove_stale_temps(p)
    result = ImportResult(output=str(out), errors_output=str(err_out))
    tmp, tmp_err = (p.with_name(f".{p.name}.tmp-{os.getpid()}") for p in (out, err_out))
    try:
        with (
            pq.ParquetWriter(tmp, COST_SCHEMA.remove_metadata()) as writer,
            pq.ParquetWriter(tmp_err, ERRORS_SCHEMA) as err_writer,
        ):
            sink = _Sink(writer, err_writer, cfg, result)
            for path in cfg.inputs:
                sink.read(Path(path))
            assert result.n_in == result.n_written + result.n_rejected, "an entry went missing"
            meta = {
                "format_version": FORMAT_VERSION,
                "phases": ["vision", "llm"],  # InternVL's tiles and its LLM tokens
                "imported_from": {
                    "format": "omnibal-lengths",
                    "inputs": [str(Path(p).resolve()) for p in cfg.inputs],
                    "patches_per_tile": cfg.patches_per_tile,
                    "tokens_per_tile": cfg.tokens_per_tile,
                },
                "counts": {
                    "in": result.n_in,
                    "written": result.n_written,
                    "rejected": result.n_rejected,
                },
            }
            # in the file's key-value metadata, where table_metadata() reads it
            writer.add_key_value_metadata({METADATA_KEY: json.dumps(meta)})
    except BaseException:
        for p in (tmp, tmp_err):
            p.unlink(missing_ok=True)
        raise
    durable_replace(tmp_err, err_out)
    durable_replace(tmp, out)
    result.reasons = dict(sink.reasons)
    return result
