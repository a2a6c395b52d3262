"""Write a plan's samples as balanced, node-aware WebDataset shards (one generation).

One stream of shards per plan rank, under ``node-NNN/rank-LLL/``: step s of a rank is the s-th
group of its stream. A sample is a WebDataset key group ``KEY.json`` + ``KEY.0.jpg``, ``KEY.1.png``
... with the original image bytes. Tars are byte-for-byte deterministic (fixed owner, mode and
mtime), groups never span shards, and the manifest records each group's byte range.

Crash safety: everything is written under ``GEN_ROOT/.staging-<id>`` (the id is a hash of the
plan, the cost table and the shard size). A shard is written as ``.partial``, fsynced and renamed,
then a sidecar records its checksum; a re-run keeps finished shards and resumes each stream at its
first unfinished one, so the output is byte-identical to an uninterrupted run. When all streams
are done the manifest is written, the staging directory is renamed to ``GEN_ROOT/<id>`` (the one
atomic publish) and ``CURRENT`` moves to it. Streams are written by parallel worker processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow.compute as pc

from equishard.common.ray_engine import RayOptions, ordered_map
from equishard.contracts.columns import (
    AUDIO_TOKENS,
    GROUP_LLM_TOKENS,
    GROUP_VIT_TOKENS,
    LLM_TOKENS,
    VIT_TOKENS,
)
from equishard.contracts.cost_table import read_cost_table, table_metadata, table_phases
from equishard.contracts.generation import (
    COST_FILE,
    FORMAT_VERSION,
    MANIFEST,
    PLAN_FILE,
    WIDS_INDEX,
    GenerationManifest,
    Layout,
    Shard,
    Stream,
)
from equishard.contracts.phases import check_balanced
from equishard.contracts.plan import PLAN_PARQUET
from equishard.contracts.shared_tower import fold_shared_towers
from shards.errors import WriteError
from shards.read.reader import sha256_of
from shards.store.current_guard import current_lock, descends_from, refuse_moved, refuse_rollback
from shards.store.manifest import ManifestError, checked_carried, load_manifest
from shards.store.publish import atomic_write_bytes, fsync_dir, read_current, set_current, try_lock
from shards.store.storage import GenerationFiles, is_url, join_url
from shards.write.energon import has_energon_metadata, write_energon_metadata
from shards.write.plan_input import read_plan
from shards.write.stream_pool import run_streams
from shards.write.stream_writer import StreamWriter, write_stream
from shards.write.wids_index import write_wids_index
from shards.write.write_config import WriteConfig, WriteResult, parse_size
from shards.write.write_jobs import stream_jobs

__all__ = [
    "WriteConfig",
    "WriteError",
    "WriteResult",
    "generation_id",
    "parse_size",
    "write_generation",
]


def generation_id(
    plan_sha256: str, cost_sha256: str, shard_size: int, reuse_from: str | None = None
) -> str:
    """The id of the generation a plan and cost table (by their sha256) and a shard size make."""
    h = hashlib.sha256()
    h.update(f"equishard-generation-v{FORMAT_VERSION}|{shard_size}|".encode())
    if reuse_from:  # kept groups come from there: part of what the generation is
        h.update(f"reuse:{Path(reuse_from).name}|".encode())
    h.update(plan_sha256.encode())
    h.update(cost_sha256.encode())
    return "gen-" + h.hexdigest()[:16]


def _clean_stale_staging(root: Path, keep: str) -> None:
    """Remove staging directories of crashed writers (their lock is free)."""
    for d in root.glob(".staging-*"):
        if d.name == keep or not d.is_dir():
            continue
        lock = try_lock(d / ".lock") if (d / ".lock").exists() else None
        if lock is not None or not (d / ".lock").exists():
            shutil.rmtree(d, ignore_errors=True)
        if lock is not None:
            lock.close()


def write_generation(cfg: WriteConfig, progress: bool = False) -> WriteResult:
    """Write (or finish, or find already written) the generation of ``cfg``'s plan."""
    if is_url(cfg.out):
        return _write_to_store(cfg, progress)
    root = Path(cfg.out)
    root.mkdir(parents=True, exist_ok=True)
    digests = (sha256_of(Path(cfg.plan_dir) / PLAN_FILE), sha256_of(Path(cfg.cost_table)))
    gen = generation_id(*digests, cfg.shard_size, cfg.reuse_from)
    final = root / gen
    parent = read_current(root)
    if (final / MANIFEST).exists():
        m = load_manifest(final)  # checked: structure, names inside the generation, sizes
        if not (final / WIDS_INDEX).exists():  # written by an equishard without it
            write_wids_index(m)
        if cfg.energon and not has_energon_metadata(final):  # written before without --energon
            write_energon_metadata(m, workers=cfg.workers)
        if parent != gen:
            with current_lock(root) as now:  # the check and the move as one step
                if now not in (None, gen):
                    if not cfg.force and not descends_from(root, m.parent, now):
                        raise refuse_rollback(str(root), now, gen)
                    set_current(root, gen)
                elif now is None:
                    set_current(root, gen)
        t = m.totals
        return WriteResult(
            gen, str(final), m.parent, t["samples"], t["groups"], t["shards"], t["bytes"], True
        )
    stage = root / f".staging-{gen}"
    # the plan checked against itself and the cost table before anything is staged
    cost = read_cost_table(cfg.cost_table)
    # the plan was balanced on the table as its encoders run it (video frames of the vision
    # tower in the vision phase); a phase balancing does not take could not have a plan
    balanced = fold_shared_towers(cost)
    try:
        check_balanced(table_phases(balanced, cfg.cost_table), cfg.cost_table)
    except ValueError as exc:
        raise WriteError(str(exc)) from None
    # shards/write/plan_input.py
    inputs = (cost, read_plan(cfg.plan_dir, balanced, cfg.cost_table))
    stage.mkdir(exist_ok=True)
    lock = try_lock(stage / ".lock")
    if lock is None:
        raise WriteError(f"another writer is writing {gen} into {root}; wait for it to finish")
    try:
        _clean_stale_staging(root, stage.name)
        if (stage / MANIFEST).exists() and not _staged_intact(stage, gen):
            (stage / MANIFEST).unlink()  # written again below, from checked shards only
        if not (stage / MANIFEST).exists():
            _write_all(cfg, stage, gen, parent, digests, progress, inputs)
        for stale in stage.glob(".*.tmp-*"):  # an atomic write a killed run left half done
            stale.unlink()
        # a run killed after the manifest but during this removal left part files behind
        shutil.rmtree(stage / ".parts", ignore_errors=True)
        staged = load_manifest(stage)
        write_wids_index(staged)
        if cfg.energon and not has_energon_metadata(stage):
            write_energon_metadata(staged, workers=cfg.workers)
        with current_lock(root) as now:
            if now != staged.parent and now is not None and not cfg.force:
                # a night or another write published while this one ran: its manifest names
                # the old parent; dropped so a re-run writes it again after ``now``
                (stage / MANIFEST).unlink()
                raise refuse_moved(str(root), staged.parent, now, gen)
            os.replace(stage, final)  # the atomic publish
            fsync_dir(root)
            set_current(root, gen)
        with contextlib.suppress(FileNotFoundError):
            (final / ".lock").unlink()
    finally:
        lock.close()
    m = load_manifest(final)
    t = m.totals
    return WriteResult(
        gen, str(final), m.parent, t["samples"], t["groups"], t["shards"], t["bytes"], False
    )


def _staged_intact(stage: Path, gen: str) -> bool:
    """Whether the manifest a killed run left in ``stage`` (it died before the rename that
    publishes) may be published as it is: it must be this generation's, and every shard and
    carried file it names must match its sha256 (a leftover damaged since, or not the one this
    plan makes, is written again, as a finished shard without a matching sidecar is)."""
    try:
        m = load_manifest(stage)
        for name in m.carried or ():
            checked_carried(m, name)
    except ManifestError:
        return False
    return m.generation == gen and all(
        sha256_of(stage / sh.file) == sh.sha256 for st in m.streams for sh in st.shards
    )


def _write_to_store(cfg: WriteConfig, progress: bool) -> WriteResult:
    """Write locally in the staging root, then publish to the object store at ``cfg.out``."""
    from shards.store.object_store import current_tag, default_staging, publish_generation

    staging = cfg.staging or str(default_staging(cfg.out))
    # CURRENT as it was before this write: it moves only if no other writer moved it meanwhile
    expect = current_tag(cfg.out, storage_options=cfg.storage_options)
    # the staging root is a cache: what its CURRENT says never decides; the store's does
    local = write_generation(replace(cfg, out=staging, force=True), progress)
    now = expect[0]
    if now not in (None, local.generation) and not cfg.force:
        in_store = GenerationFiles(
            join_url(cfg.out, local.generation), storage_options=cfg.storage_options
        ).exists(MANIFEST)
        if (local.reused or in_store) and not descends_from(Path(staging), local.parent, now):
            raise refuse_rollback(cfg.out, now, local.generation)
    publish_generation(
        local.path, cfg.out, storage_options=cfg.storage_options, expect_current=expect
    )
    return replace(local, path=join_url(cfg.out, local.generation))


def _check_streams(stage: Path, streams) -> None:
    """Every shard a stream's task reported is in the staging directory with its size: on a
    Ray cluster whose nodes do not share the output's file system a task's shards land on its
    own node's disk, and nothing may be published without them."""
    for st in streams:
        for sh in st.shards:
            path = stage / sh.file
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                size = None
            if size != sh.bytes:
                raise WriteError(
                    f"stream of rank {st.rank}: {path} is "
                    f"{'missing' if size is None else f'{size} bytes'} here, its writer reported "
                    f"{sh.bytes} bytes; with --engine ray the output directory must be on a "
                    "file system every Ray node shares. Nothing was published"
                )


def _max(table, column: str) -> int:
    return int(pc.max(table.column(column)).as_py() or 0) if table.num_rows else 0


def _audio_loads(cost, plan) -> dict:
    """The largest audio loads, for a table with recordings (its plan has the phase: checked
    by ``read_plan``); nothing for one without."""
    if AUDIO_TOKENS not in cost.column_names:
        return {}
    return {
        "max_sample_audio_tokens": _max(cost, AUDIO_TOKENS),
        "max_group_audio_tokens": _max(plan, f"group_{AUDIO_TOKENS}"),
    }


def _write_all(
    cfg: WriteConfig,
    stage: Path,
    gen: str,
    parent: str | None,
    digests: tuple[str, str],
    progress: bool,
    inputs: tuple,
) -> None:
    from tqdm import tqdm

    cost, (plan, report, nodes, per, where) = inputs
    meta = table_metadata(cfg.cost_table, required=False)
    jobs = stream_jobs(plan, cost, where, stage, cfg, meta, nodes, per)
    results: dict[int, list[dict]] = {}
    bar = tqdm(total=len(jobs), unit="stream", desc="write", disable=None if progress else True)
    if cfg.engine == "ray":
        opts = RayOptions(
            address=cfg.ray_address, num_cpus=cfg.workers, task_timeout=cfg.task_timeout
        )
        for job, shards in zip(
            jobs,
            ordered_map(
                write_stream, jobs, opts=opts, inflight=2 * cfg.workers, name="equishard-write"
            ),
            strict=True,
        ):
            results[job["rank"]] = shards
            bar.update()
    else:  # this process writes streams too (shards/write/stream_pool.py)
        try:
            results = run_streams(
                jobs,
                cfg.workers,
                write_stream,
                bar.update,
                local=StreamWriter,
                timeout=cfg.task_timeout,
            )
        except TimeoutError as exc:
            raise WriteError(
                f"{exc}; nothing was published; raise --task-timeout if a stream needs longer"
            ) from None
    bar.close()
    streams = tuple(
        Stream(
            node=job["node"],
            local_rank=job["local_rank"],
            rank=job["rank"],
            shards=tuple(
                Shard.from_json(sh, f"stream of rank {job['rank']}") for sh in results[job["rank"]]
            ),
        )
        for job in jobs
    )
    _check_streams(stage, streams)
    samples = sum(st.samples for st in streams)
    if samples != plan.num_rows:
        raise WriteError(
            f"wrote {samples} samples but the plan has {plan.num_rows}; nothing was published"
        )
    carried = {}  # files carried beside the shards, named with their digest in the manifest
    for src, name in (
        (Path(cfg.cost_table), COST_FILE),
        (Path(cfg.plan_dir) / PLAN_PARQUET, PLAN_FILE),
        *((Path(src), name) for name, src in (cfg.extra_files or {}).items()),
    ):
        data = src.read_bytes()
        atomic_write_bytes(stage / name, data)
        carried[name] = (len(data), hashlib.sha256(data).hexdigest())
    manifest = GenerationManifest(
        generation=gen,
        parent=parent,
        plan_sha256=digests[0],
        cost_table_sha256=digests[1],
        shard_size=cfg.shard_size,
        layout=Layout(nodes=nodes, gpus_per_node=per, steps=report["counts"]["steps"]),
        streams=streams,
        report=report,
        # What the loader's collator and the trainer need to match prep: the vision policy,
        # tokenizer and template the costs were counted with, and the largest loads to size
        # fixed-shape pipeline microbatches.
        prep={k: v for k, v in meta.items() if k != "inputs"},
        loads={
            "max_sample_llm_tokens": _max(cost, LLM_TOKENS),
            "max_sample_vit_tokens": _max(cost, VIT_TOKENS),
            "max_group_llm_tokens": _max(plan, GROUP_LLM_TOKENS),
            "max_group_vit_tokens": _max(plan, GROUP_VIT_TOKENS),
            **_audio_loads(cost, plan),
        },
        extra=dict(cfg.manifest_extra or {}),
        files=carried,
    )
    atomic_write_bytes(stage / MANIFEST, json.dumps(manifest.to_json(), indent=1).encode())
    shutil.rmtree(stage / ".parts", ignore_errors=True)
