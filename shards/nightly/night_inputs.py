"""What a night reads and combines before it plans: its key (which inputs it is), the deletion
list, the parent's cost table combined with the new samples' (added, updated, unchanged,
deleted, counted), the combined table's metadata (the image root per input), and the record
that lets a resumed night reuse its prep of the new samples only when it checks out."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from equishard.common.durable import durable_replace
from shards.store.publish import atomic_write_bytes, read_small
from shards.store.storage import sha256_of

__all__ = [
    "combine_tables",
    "measured",
    "night_key",
    "night_meta",
    "read_deletions",
    "record_measured",
]


def night_key(cfg) -> str:
    h = hashlib.sha256(b"equishard-night-v1|")
    for p in cfg.new:
        st = os.stat(p)
        h.update(f"{Path(p).resolve()}|{st.st_size}|{st.st_mtime_ns}|".encode())
    if cfg.delete:
        h.update(b"delete|" + Path(cfg.delete).read_bytes())
    h.update(f"{cfg.image_root}|{cfg.tokenizer}".encode())
    if getattr(cfg, "calibration", None):  # another calibration: another night
        h.update(b"calibration|" + Path(cfg.calibration).read_bytes())
    return h.hexdigest()[:24]


def read_deletions(path: str | None) -> list[str]:
    """Sample ids to delete: one per line (``#`` comments), or a JSON list of strings. A list
    that is neither raises ``ValueError`` naming the file and what is wrong."""
    if not path:
        return []
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: the deletion list is not a regular file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: the deletion list is not UTF-8 text ({exc})") from None
    if text.lstrip().startswith("{"):
        raise ValueError(
            f"{path}: a JSON deletion list must be a list of sample ids, not an object"
        )
    if text.lstrip().startswith("["):
        try:
            ids = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"{path}: not a valid JSON list of sample ids ({exc})") from None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError(f"{path}: a JSON deletion list must hold sample_id strings only")
        return ids
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def combine_tables(
    parent_cost: pa.Table, new: pa.Table, deletions: list[str], meta: dict, out: Path
):
    """(combined table, counts, changed ids); writes ``out`` atomically."""
    old_ids = parent_cost.column("sample_id").to_pylist()
    old_fp = dict(zip(old_ids, parent_cost.column("fingerprint").to_pylist(), strict=True))
    new_ids = new.column("sample_id").to_pylist()
    new_fp = new.column("fingerprint").to_pylist()
    deleted = set(deletions)
    updated = {i for i, f in zip(new_ids, new_fp, strict=True) if i in old_fp and old_fp[i] != f}
    unchanged = {i for i, f in zip(new_ids, new_fp, strict=True) if old_fp.get(i) == f}
    added = [i for i in new_ids if i not in old_fp]
    keep_old = pa.array([i not in deleted and i not in updated for i in old_ids], pa.bool_())
    keep_new = pa.array([i not in deleted and i not in unchanged for i in new_ids], pa.bool_())
    combined = pa.concat_tables(
        [parent_cost.filter(keep_old), new.filter(keep_new)]
    ).combine_chunks()
    applied = deleted & (set(old_ids) | set(new_ids))
    counts = {
        "carried_in": len(old_ids),
        "new": len(added),
        "updated": len(updated - deleted),
        "unchanged_resubmitted": len(unchanged - deleted),
        "deleted": len(applied & (set(old_ids) | set(added))),
        "deletions_not_found": len(deleted - applied),
        "out": combined.num_rows,
    }
    if counts["out"] != counts["carried_in"] + counts["new"] - counts["deleted"]:
        raise AssertionError(f"count mismatch: {counts}")
    meta = {
        **meta,
        "counts": {"in": combined.num_rows, "written": combined.num_rows, "rejected": 0},
    }
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    pq.write_table(
        combined.replace_schema_metadata({b"equishard.cost_table": json.dumps(meta).encode()}),
        tmp,
    )
    durable_replace(tmp, out)
    return combined, counts, deleted | updated


def night_meta(meta: dict, cfg) -> dict:
    """The combined table's metadata: the parent's, plus the image root this night's inputs
    were measured under, per input, so write reads every sample's images from the root its
    cost row was measured under (never the parent's root for a new sample)."""
    ro = dict(meta.get("read_options") or {})
    root = cfg.image_root or ro.get("image_root")
    night = {str(Path(p).resolve()) for p in cfg.new}
    roots = [(p, r) for p, r in ro.get("image_roots") or () if p not in night]
    if root:
        roots += [(p, str(Path(root).resolve())) for p in sorted(night)]
    return {**meta, "read_options": {**ro, "image_roots": roots}}


_MEASURED = ("new.parquet", "new.errors.parquet")  # the night's prep of its new samples


def measured(work: Path) -> bool:
    """Whether the new samples' tables a killed run of this night left in ``work`` may be used
    again: only when both are the bytes whose sha256 was recorded right after prep wrote them
    (a table damaged or edited since is measured again, as a finished shard is written again)."""
    try:
        record = json.loads(read_small(work / "measured.json", 4096))
        return isinstance(record, dict) and all(
            (work / name).is_file() and record.get(name) == sha256_of(work / name)
            for name in _MEASURED
        )
    except (OSError, ValueError, RecursionError):  # absent, damaged, or not a regular file
        return False


def record_measured(work: Path) -> None:
    record = {name: sha256_of(work / name) for name in _MEASURED}
    atomic_write_bytes(work / "measured.json", json.dumps(record).encode())
