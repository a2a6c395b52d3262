"""The write's work, one job per plan rank: the rank's plan rows joined with the cost table's
columns the stream writer needs, how prep read the raw data (checked: each worker builds its
reader from it), and the parent generation's groups the stream reuses (kept groups, and the
parent groups of unchanged samples), each verified against its shard's sha256 first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataprep.image_header import CHECKS
from dataprep.image_orientation import IMAGE_SIZES
from dataprep.readers import ReadOptions
from shards.errors import WriteError
from shards.format.sample_doc import MEDIA_COST_FIELDS
from shards.write.parent import reuse_index, verify_parent_shards
from shards.write.stream_writer import COST_FIELDS

__all__ = ["group_pairs", "prep_options", "stream_jobs"]


def stream_jobs(
    plan, cost, where, stage: Path, cfg, prep_meta: dict, nodes: int, per: int
) -> list[dict]:
    """One job per plan rank (``cfg``: the WriteConfig): its plan rows joined with their
    cost-table columns (``where``: each plan row's index in ``cost``), in plan order, as an
    Arrow table (columnar: cheap to build and to send to a worker process; the worker turns rows
    into groups a batch at a time), plus the parent-generation sources it reuses."""
    parent_col = (
        plan.column("parent_step")
        if "parent_step" in plan.column_names
        else pa.array(np.full(plan.num_rows, -1, dtype=np.int64))
    )
    media_cost = [c for c in MEDIA_COST_FIELDS if c in cost.column_names]  # video, audio
    picked = cost.select(
        [*COST_FIELDS, *media_cost, "location", "source", "fingerprint", "cache_key"]
    ).take(where)
    loc = picked.column("location")
    nowhere = pc.fill_null(pc.equal(loc, ""), True)
    if pc.any(nowhere).as_py():
        ids = plan.column("sample_id").filter(nowhere).to_pylist()
        raise WriteError(
            f"{cfg.cost_table}: {len(ids)} planned sample(s) have no location, e.g. {ids[:3]}: "
            "write reads each sample's record and images from there. A table of lengths alone "
            "(e.g. from 'equishard import-lengths') can be balanced but not written; run "
            "'equishard prep' over the raw data to get locations"
        )
    rows = pa.table(
        {
            "sample_id": plan.column("sample_id"),
            "group_id": plan.column("group_id"),
            "step": plan.column("step"),
            "parent_step": parent_col,
            **{c: picked.column(c) for c in picked.column_names},
        }
    )
    read_options, check_images = prep_options(prep_meta, cfg.cost_table)
    # prep counted images as stored (an equishard from before EXIF orientation was applied):
    # every image is probed again, so a photo stored sideways stops with a clear error
    stored_sizes = bool(prep_meta) and prep_meta.get("image_sizes") != IMAGE_SIZES
    rank = plan.column("rank").to_numpy()
    groups, unchanged = reuse_index(cfg.reuse_from, parent_col, cost)
    # an unchanged sample of a rebuilt step is copied from its parent group: (rank, step) there
    at = pc.index_in(rows.column("sample_id"), value_set=unchanged.column("sample_id"))
    rows = rows.append_column("from_rank", unchanged.column("rank").take(at))
    rows = rows.append_column("from_step", unchanged.column("step").take(at))
    pstep = np.asarray(parent_col.to_numpy(zero_copy_only=False), dtype=np.int64)
    kept = {(int(r), int(s)) for r, s in zip(rank[pstep >= 0], pstep[pstep >= 0], strict=True)}
    if kept - groups.keys():
        r, s = min(kept - groups.keys())
        raise WriteError(
            f"{cfg.plan_dir}: the plan keeps rank {r}'s group of step {s} of the parent "
            f"generation {cfg.reuse_from}, which has no such group; plan against that parent"
        )
    used = group_pairs(unchanged.column("rank"), unchanged.column("step"))
    sources = [groups[k] for k in kept | used]
    verify_parent_shards(sources)  # each source gets its group's digest, carried in the jobs
    order = np.argsort(rank, kind="stable")  # plan order within each rank
    bounds = np.searchsorted(rank[order], np.arange(nodes * per + 1))
    jobs = []
    for r in range(nodes * per):
        # a take, not a slice: a pickled slice would carry the whole table's buffers
        mine = rows.take(pa.array(order[bounds[r] : bounds[r + 1]]))
        jobs.append(
            {
                "stage": str(stage.resolve()),  # a Ray worker's working directory differs
                "rank": r,
                "node": r // per,
                "local_rank": r % per,
                "dir": f"node-{r // per:03d}/rank-{r % per:03d}",
                "rows": mine,
                "reuse": {ps: groups[(rk, ps)] for rk, ps in kept if rk == r},
                "parents": {
                    k: groups[k] for k in group_pairs(mine["from_rank"], mine["from_step"])
                },
                "shard_size": cfg.shard_size,
                "read_options": read_options,
                # the modalities prep measured besides images: read as it read them
                "measured": [m for m in ("video", "audio") if prep_meta.get(f"{m}_rule")],
                "check_images": check_images,
                "stored_sizes": stored_sizes,
            }
        )
    return jobs


def prep_options(meta: dict, where: str) -> tuple[dict, str]:
    """How prep read the raw data (its reader options, its image check), from the cost table's
    metadata: checked here, since each stream's worker builds its reader from them."""
    ro = meta.get("read_options") or {}
    check = meta.get("check_images", "header")
    try:
        if not isinstance(ro, dict):
            raise TypeError(f"an object expected, got {type(ro).__name__}")
        ReadOptions(**ro)
    except (TypeError, ValueError) as exc:
        raise WriteError(
            f"{where}: its recorded read_options are not prep's ({exc}); prep it again"
        ) from None
    if check not in CHECKS:
        raise WriteError(f"{where}: its recorded check_images {check!r:.40} is not one of {CHECKS}")
    return ro, check


def group_pairs(rank, step) -> set[tuple[int, int]]:
    """The distinct (rank, step) pairs of two columns, nulls left out (one per parent group)."""
    pairs = pa.table({"r": rank, "s": step}).drop_null()
    if pairs.num_rows:
        pairs = pairs.group_by(["r", "s"]).aggregate([])
    return set(zip(pairs["r"].to_pylist(), pairs["s"].to_pylist(), strict=True))
