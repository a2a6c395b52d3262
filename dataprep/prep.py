"""The prep stage: inputs -> cost table + errors table, with counts that always add up.

``run_prep(PrepConfig(...))`` scans the inputs into work units (optionally one shard of them,
``shard_index``/``num_shards``), measures units in worker processes (in input order), drops
duplicate ``sample_id``s into the errors table, and writes both tables atomically (temp file +
rename). It aborts with :class:`ErrorRateExceeded` as soon as the rejected fraction of the run is
certain to exceed ``max_error_rate``; the errors table is still written so the cause can be seen.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dataprep.chat_template import load_template
from dataprep.errors import DataprepError, ErrorRateExceeded
from dataprep.image_orientation import IMAGE_SIZES
from dataprep.measure import ChunkResult, Measurer
from dataprep.media_rules import parse_audio_rule, parse_video_rule
from dataprep.media_rules.registry import measured_phases, media_rules_recorded
from dataprep.policies import parse_vision_policy
from dataprep.prep_cache import (
    cache_keys,
    check_cache_settings,
    seal_keys,
    settings_identity,
    with_cached,
)
from dataprep.prep_config import PrepConfig, PrepResult
from dataprep.readers import ReadOptions, WorkUnit, scan_inputs, split_units
from dataprep.setting_checks import check_settings, settings_summary
from dataprep.text_tokens import TokenCounter, TokenizerSpec
from equishard.common.durable import durable_replace
from equishard.common.ray_engine import RayOptions, ordered_map
from equishard.common.workers import exit_with_parent, usable_cores
from equishard.contracts.columns import LLM_TOKENS, NUM_IMAGES, VIT_TOKENS
from equishard.contracts.cost_table import (
    ERRORS_SCHEMA,
    FORMAT_VERSION,
    METADATA_KEY,
    cost_schema,
    errors_path,
    read_cost_table,
    remove_stale_temps,
)

__all__ = ["PrepConfig", "PrepResult", "run_prep"]


def _measurer(cfg: PrepConfig) -> Measurer:
    return Measurer(
        cache=cache_keys(cfg),
        policy=parse_vision_policy(cfg.vision_policy),
        template=load_template(cfg.template),
        counter=TokenCounter(
            TokenizerSpec.parse(cfg.tokenizer),
            ("image", *(m for m in ("video", "audio") if getattr(cfg, f"{m}_rule"))),
        ),
        opts=_read_options(cfg),
        check_images=cfg.check_images,
        video_rule=parse_video_rule(cfg.video_rule) if cfg.video_rule else None,
        audio_rule=parse_audio_rule(cfg.audio_rule) if cfg.audio_rule else None,
    )


def _read_options(cfg: PrepConfig) -> ReadOptions:
    return ReadOptions(
        image_root=str(Path(cfg.image_root).resolve()) if cfg.image_root else None,
        image_column=cfg.image_column,
        text_column=cfg.text_column,
        allow_outside_image_root=cfg.allow_outside_image_root,
    )


_WORKER: Measurer | None = None


def _init_worker(cfg: PrepConfig, parent: int) -> None:
    global _WORKER
    exit_with_parent(parent)
    # Worker processes already use every core; a tokenizer thread pool per process only contends.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = _measurer(cfg)


def _measure_in_worker(unit: WorkUnit) -> ChunkResult:
    assert _WORKER is not None
    return _WORKER.measure(unit)


_RAY_MEASURERS: dict[tuple[PrepConfig, str], Measurer] = {}


def _measure_task(cfg: PrepConfig, unit: WorkUnit, run: str) -> ChunkResult:
    """One unit measured in a Ray task; the worker process keeps its Measurer for the next unit
    of the same run (``run``: a token made once per prep). A worker of a long-lived cluster
    outlives runs: one keyed by the configuration alone measured a later run with the tokenizer
    and template files the configuration named at the earlier run, though edited since."""
    m = _RAY_MEASURERS.get((cfg, run))
    if m is None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        _RAY_MEASURERS.clear()
        m = _RAY_MEASURERS[(cfg, run)] = _measurer(cfg)
    return m.measure(unit)


def _absolute(cfg: PrepConfig) -> PrepConfig:
    """``cfg`` with the files it names made absolute: a Ray worker's working directory is not
    the driver's."""

    def resolve(p: str | None) -> str | None:
        if not p:
            return p
        path, sep, rest = p.partition("#")
        return str(Path(path).resolve()) + sep + rest if Path(path).exists() else p

    return replace(
        cfg,
        tokenizer=resolve(cfg.tokenizer),
        template=resolve(cfg.template),
        image_root=resolve(cfg.image_root),
        cache=resolve(cfg.cache),
    )


def _results(cfg: PrepConfig, units: list[WorkUnit]) -> Iterator[ChunkResult]:
    """Measured units in input order; at most 2 units per worker in flight."""
    if cfg.engine == "ray":
        task_cfg = _absolute(cfg)
        opts = RayOptions(
            address=cfg.ray_address, num_cpus=cfg.workers, task_timeout=cfg.task_timeout
        )
        run = uuid.uuid4().hex
        yield from ordered_map(
            _measure_task,
            ((task_cfg, u, run) for u in units),
            opts=opts,
            inflight=2 * cfg.workers,
            name="equishard-prep",
            star=True,
        )
        return
    if cfg.workers == 1:
        yield from _measurer(cfg).measure_many(units)
        return
    ctx = mp.get_context("spawn")  # no fork: tokenizers' thread pool is not fork-safe
    # processes on this machine: at most one per usable core (each holds its own interpreter
    # and tokenizer: --workers 1024 on 2 cores ran out of memory, not faster); Ray spreads
    # the --workers over its cluster instead
    procs = min(cfg.workers, usable_cores())
    with ProcessPoolExecutor(
        procs, mp_context=ctx, initializer=_init_worker, initargs=(cfg, os.getpid())
    ) as ex:
        it = iter(units)
        inflight = deque(
            ex.submit(_measure_in_worker, u) for _, u in zip(range(2 * procs), it, strict=False)
        )
        order = deque(u for u in units[: len(inflight)])
        while inflight:
            unit = order.popleft()
            try:
                result = inflight.popleft().result(timeout=cfg.task_timeout)
            except FutureTimeout:
                for proc in list(getattr(ex, "_processes", {}).values()):
                    proc.kill()  # a frozen worker (a hung mount) is not waited for
                raise DataprepError(
                    f"a prep worker made no progress for {cfg.task_timeout:g} s on {unit.path} "
                    f"records {unit.first}..{unit.first + unit.count - 1} (a hung mount or a "
                    "frozen process?); nothing was written; raise --task-timeout if it needs "
                    "longer"
                ) from None
            nxt = next(it, None)
            if nxt is not None:
                inflight.append(ex.submit(_measure_in_worker, nxt))
                order.append(nxt)
            yield result


def _metadata(cfg: PrepConfig, units: list[WorkUnit], result: PrepResult, phases) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        # the phases measured: the vision encoder (settings: vision_policy), the video and
        # audio encoders where the run has their rules (video_rule, audio_rule), and the LLM
        # (tokenizer, template); equishard.contracts.phases
        "phases": [p.name for p in phases] + ["llm"],
        "vision_policy": parse_vision_policy(cfg.vision_policy).describe(),
        **media_rules_recorded(cfg),
        "tokenizer": TokenizerSpec.parse(cfg.tokenizer).describe(),
        "template": load_template(cfg.template).describe(),
        "inputs": [str(Path(p).resolve()) for p in cfg.inputs],
        "read_options": _read_options(cfg).recorded(),
        "check_images": cfg.check_images,
        "image_sizes": IMAGE_SIZES,
        "shard": {"index": cfg.shard_index, "num_shards": cfg.num_shards},
        "counts": {
            "in": result.n_in,
            "written": result.n_written,
            "rejected": result.n_rejected,
            "damaged_ranges": result.damaged_ranges,
            "cached": result.n_cached,
        },
    }


def _percentiles(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {}
    qs = np.percentile(values, [0, 50, 90, 99, 100])
    return {
        "min": float(qs[0]),
        "p50": float(qs[1]),
        "p90": float(qs[2]),
        "p99": float(qs[3]),
        "max": float(qs[4]),
        "mean": float(values.mean()),
    }


def run_prep(cfg: PrepConfig) -> PrepResult:
    """Run the prep stage; returns the counts and statistics that the CLI prints."""
    import time

    from tqdm import tqdm

    t0 = time.perf_counter()
    out_path = Path(cfg.output)
    err_path = errors_path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    for p in (out_path, err_path):
        remove_stale_temps(p)  # left by a killed run
    # the template, policy and tokenizer against each other, before anything is measured
    warned = check_settings(
        cfg.template, cfg.vision_policy, cfg.tokenizer, cfg.video_rule, cfg.audio_rule
    )
    check_cache_settings(cfg)  # a cache of other settings would lend its counts to this table
    units = scan_inputs(list(cfg.inputs), cfg.chunk_size)
    if cfg.num_shards > 1:
        units = split_units(units, cfg.shard_index, cfg.num_shards)
    expected = sum(u.kept for u in units)
    result = PrepResult(
        output=str(out_path),
        errors_output=str(err_path),
        settings={
            **settings_summary(cfg.template, cfg.vision_policy, cfg.tokenizer),
            **{k: v["spec"] for k, v in media_rules_recorded(cfg).items()},
        },
        warnings=warned,
    )
    tmp_out = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    tmp_err = err_path.with_name(f".{err_path.name}.tmp-{os.getpid()}")
    phases = measured_phases(cfg.video_rule, cfg.audio_rule)
    seen: set[str] = set()
    errors: list[dict] = []
    ranges: list[dict] = []
    stats = {VIT_TOKENS: [], **{p.tokens: [] for p in phases[1:]}, LLM_TOKENS: [], NUM_IMAGES: []}
    modalities: Counter = Counter()
    cache = read_cost_table(cfg.cache).select(cost_schema(phases).names) if cfg.cache else None
    identity = settings_identity(cfg)
    cache_where = (
        {s: i for i, s in enumerate(cache.column("sample_id").to_pylist())} if cache else {}
    )
    writer = pq.ParquetWriter(tmp_out, cost_schema(phases))
    aborted: ErrorRateExceeded | None = None
    try:
        with tqdm(
            total=expected, unit="sample", desc="prep", disable=None if cfg.progress else True
        ) as bar:
            for chunk in _results(cfg, units):
                result.n_in += chunk.n_in
                errors.extend(chunk.errors)
                ranges.extend(chunk.ranges)
                result.damaged_ranges = len(ranges)
                result.n_cached += len(chunk.cached)
                batch = with_cached(chunk, cache, cache_where) if chunk.cached else chunk.batch
                batch = seal_keys(batch, identity)  # a later --cache reuses only sealed rows
                ids = batch.column("sample_id").to_pylist()
                lines = chunk.row_lines()
                keep = np.ones(len(ids), dtype=bool)
                for i, sid in enumerate(ids):
                    if sid in seen:
                        keep[i] = False
                        errors.append(
                            {
                                "source": batch.column("source")[i].as_py(),
                                "location": batch.column("location")[i].as_py(),
                                "line": lines[i],
                                "sample_id": sid,
                                "reason": "duplicate_id",
                                "detail": f"sample_id {sid!r} is used by an earlier sample",
                            }
                        )
                    else:
                        seen.add(sid)
                if not keep.all():
                    batch = batch.filter(pa.array(keep))
                if batch.num_rows:
                    writer.write_batch(batch)
                    for name in stats:
                        stats[name].append(batch.column(name).to_numpy())
                    modalities.update(batch.column("modality").to_pylist())
                result.n_written += batch.num_rows
                result.n_rejected = len(errors)
                bar.update(chunk.n_in + len(chunk.ranges))
                if result.n_rejected > cfg.max_error_rate * expected:
                    aborted = ErrorRateExceeded(
                        f"{result.n_rejected} of {expected} samples rejected, above --max-error-rate "
                        f"{cfg.max_error_rate:g}; see {err_path} for each sample and reason "
                        "(common causes: a wrong --image-root, a wrong --text-column); raise "
                        "--max-error-rate to accept this many"
                    )
                    break
        meta = _metadata(cfg, units, result, phases)
        writer.add_key_value_metadata({METADATA_KEY: json.dumps(meta)})
    except BaseException:
        writer.close()
        tmp_out.unlink(missing_ok=True)  # interrupted: leave no temp file behind
        raise
    writer.close()
    err_table = pa.Table.from_pylist(errors + ranges, schema=ERRORS_SCHEMA)
    pq.write_table(err_table, tmp_err)
    durable_replace(tmp_err, err_path)
    if aborted is not None:
        tmp_out.unlink(missing_ok=True)
        if cfg.cache and out_path.exists() and os.path.samefile(out_path, cfg.cache):
            # refreshed in place: the table this run reused is the user's, kept as it was
            aborted.args = (f"{aborted.args[0]}; {out_path} (this run's --cache) is kept",)
        elif out_path.exists():  # an older run's table must not sit beside this run's errors
            out_path.unlink()
            aborted.args = (f"{aborted.args[0]}; the older {out_path} was removed",)
        raise aborted
    if result.n_in + len(ranges) != expected or result.n_in != result.n_written + result.n_rejected:
        tmp_out.unlink(missing_ok=True)
        raise DataprepError(
            f"internal count mismatch: expected {expected}, read {result.n_in} (and "
            f"{len(ranges)} damaged ranges), written "
            f"{result.n_written} + rejected {result.n_rejected}; nothing was published"
        )
    durable_replace(tmp_out, out_path)
    result.reasons = dict(Counter(e["reason"] for e in errors).most_common())
    result.modalities = dict(modalities.most_common())
    for name, parts in stats.items():
        result.percentiles[name] = _percentiles(np.concatenate(parts) if parts else np.array([]))
    result.seconds = time.perf_counter() - t0
    return result
