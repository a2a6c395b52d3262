"""What a re-run of ``write`` keeps of a stream an earlier run left in the staging directory.

The staging directory is the earlier run's output, read back: nothing in it is trusted for
being there. A finished shard is kept only when its sidecar parses, names the file it sits
beside, lists exactly the next groups the plan gives this stream (steps and sample counts, byte
ranges that follow one another inside the file), and the file has the sidecar's size and
sha256. The first shard that fails any of these, and every shard after it, is written again,
so a damaged or foreign leftover can neither skip a planned group nor enter the manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from equishard.contracts.generation_names import check_digest
from shards.store.publish import read_small
from shards.store.storage import sha256_of

__all__ = ["finished_prefix", "plan_groups", "shard_stem"]


def shard_stem(job: dict, k: int) -> str:
    """The name (without ``.tar``) of shard ``k`` of a write job's stream (node 0, local rank
    1: ``shard-n000-r001-000000``). Unique across the generation, not only inside its folder:
    readers that keep shards in one flat cache by base name (wids with a ``cache_dir``) would
    otherwise read every stream's first shard as one file."""
    return f"shard-n{job['node']:03d}-r{job['local_rank']:03d}-{k:06d}"


SIDECAR_LIMIT = 256 << 20  # one shard's groups: far below


def plan_groups(rows) -> list[tuple[int, int]]:
    """``(step, samples)`` of each of a stream's groups, in plan order (``rows``: the stream's
    plan rows with ``step`` and ``group_id``, a group's rows consecutive)."""
    if rows.num_rows == 0:
        return []
    gid = rows.column("group_id").to_numpy(zero_copy_only=False)
    step = rows.column("step").to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])
    sizes = np.diff(np.r_[starts, len(gid)])
    return [(int(step[s]), int(n)) for s, n in zip(starts, sizes, strict=True)]


def _sidecar(path: Path) -> dict | None:
    try:  # a regular file of bounded size: a FIFO left there never blocks the resume
        meta = json.loads(read_small(path, SIDECAR_LIMIT))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deep
        return None
    if not isinstance(meta, dict):
        return None
    types = {"file": str, "bytes": int, "sha256": str, "samples": int, "groups": list}
    for key, typ in types.items():
        if not isinstance(meta.get(key), typ) or isinstance(meta.get(key), bool):
            return None
    try:
        check_digest(meta["sha256"], str(path))
    except ValueError:
        return None
    return meta


def _groups_follow(meta: dict, want: list[tuple[int, int]], start: int) -> bool:
    """The sidecar's groups are ``want[start:start + n]``, back to back from byte 0."""
    at = 0
    for k, g in enumerate(meta["groups"]):
        ok = (
            isinstance(g, list)
            and len(g) == 4
            and all(isinstance(v, int) and not isinstance(v, bool) for v in g)
        )
        if not ok or start + k >= len(want) or (g[0], g[1]) != want[start + k] or g[2] != at:
            return False
        if g[3] <= 0:
            return False
        at = g[2] + g[3]
    n = sum(g[1] for g in meta["groups"])
    return bool(meta["groups"]) and at <= meta["bytes"] and meta["samples"] == n


def finished_prefix(job: dict, sdir: Path, parts: Path) -> tuple[list[dict], int]:
    """(sidecars of the shards an earlier run finished and that check out, index of the first
    planned group still to write)."""
    want = plan_groups(job["rows"])
    done: list[dict] = []
    next_group = 0
    while True:
        name = shard_stem(job, len(done))
        side, tar = parts / f"{name}.json", sdir / f"{name}.tar"
        meta = _sidecar(side) if side.exists() and tar.is_file() else None
        if meta is None or meta["file"] != f"{job['dir']}/{name}.tar":
            break
        if tar.stat().st_size != meta["bytes"] or not _groups_follow(meta, want, next_group):
            break
        if sha256_of(tar) != meta["sha256"]:
            break
        done.append(meta)
        next_group += len(meta["groups"])
    return done, next_group
