"""Nightly rebalancing: fold new, updated and deleted samples into a new shard generation.

``run_rebalance`` takes the root's CURRENT generation (which carries its cost table and plan)
and, in a work directory named by the night (the new inputs' paths, sizes and mtimes, the
deletion list) and the parent:

1. **prep** the new inputs with the parent's settings and its cost table as a cache, so a
   sample whose id and cache key (record bytes, image sizes and mtimes) match is not re-read;
2. **combine**: parent rows, minus deletions and updated ids, plus updated and added rows
   (an id that reappears with the same content is unchanged and ignored);
3. **plan** incrementally (``balancing.incremental``): the parent's balanced steps are kept as
   they were, the short last step, leftover steps and steps that lost or changed a sample are
   rebuilt with the new samples;
4. **write** the generation (kept groups are copied from the parent's checked shards) and
   publish it by one rename; CURRENT moves by rename;
5. **finish** (:func:`finish_night`, idempotent): the night's errors table (carried inside the
   generation) is copied to ``errors/``, ``LAST_NIGHT.json`` is written, old generations are
   collected (:func:`collect_generations`; never CURRENT) and the work directory goes.

Every step's output is written atomically, so a crash at any point leaves CURRENT on a complete
generation and the next run with the same inputs resumes where it stopped and ends in the same
generation. A night already applied (CURRENT records its key) only finishes step 5. One
rebalance runs per root at a time (a lock); a second returns ``in_progress`` at once.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pyarrow.parquet as pq

from equishard.common.options import option
from equishard.common.ray_engine import (
    DEFAULT_TASK_TIMEOUT,
    ENGINE_OPTION,
    ENGINES,
    RAY_ADDRESS_OPTION,
    TASK_TIMEOUT_OPTION,
)
from equishard.common.values import check_count, check_flag, check_real, check_task_timeout
from equishard.common.workers import MAX_WORKERS
from equishard.contracts.columns import NUM_IMAGES
from equishard.contracts.generation_names import COST_FILE, PLAN_FILE
from shards.nightly.night_costs import flag_steps, with_calibration
from shards.nightly.night_inputs import (
    combine_tables,
    measured,
    night_key,
    night_meta,
    read_deletions,
    record_measured,
)
from shards.store.manifest import ManifestError, load_manifest
from shards.store.object_store import STAGING_DEFAULT
from shards.store.publish import (
    CURRENT,
    atomic_write_bytes,
    note_current,
    read_current,
    read_small,
    try_lock,
)
from shards.store.retention import collect_generations
from shards.store.storage import check_writable, is_url
from shards.write.energon import has_energon_metadata

__all__ = [
    "RebalanceConfig",
    "RebalanceResult",
    "collect_generations",
    "read_deletions",
    "run_rebalance",
]


@dataclass(frozen=True, kw_only=True)
class RebalanceConfig:
    current: str = field(
        metadata=option(
            "the generation root (holds CURRENT): a directory or an object-store URL "
            "(s3://bucket/prefix, any fsspec URL)",
            required=True,
            metavar="GEN_ROOT",
        )
    )
    new: tuple[str, ...] = field(
        default=(),
        metadata=option(
            "new inputs (any format prep reads); an id seen before replaces its sample",
            nargs="*",
            default=[],
            metavar="INPUT",
            parse=tuple,
        ),
    )
    delete: str | None = field(
        default=None,
        metadata=option("sample ids to remove: one per line, or a JSON list", metavar="FILE"),
    )
    keep: int = field(
        default=3,
        metadata=option("generations to keep along the CURRENT -> parent chain (default 3)"),
    )
    workers: int = field(default=1, metadata=option("prep/write processes (default 1)"))
    image_root: str | None = field(
        default=None,
        metadata=option("where relative image paths start (default: as the current prep)"),
    )
    tokenizer: str | None = field(
        default=None, metadata=option("tokenizer.json if it moved since the first prep")
    )
    max_error_rate: float = field(
        default=0.01,
        metadata=option("fail when more of the new samples are rejected (default 0.01)"),
    )
    calibration: str | None = field(
        default=None,
        metadata=option(
            "re-plan every step under these measured costs (equishard calibrate) when they "
            "differ from those the current generation was planned with",
            metavar="JSON",
        ),
    )
    step_log: tuple[str, ...] = field(
        default=(),
        metadata=option(
            "training logs of the current generation: its steps furthest from their plan are "
            "flagged in the summary",
            nargs="*",
            default=[],
            metavar="LOG",
            parse=tuple,
        ),
    )
    progress: bool = False  # the command's --json turns it off
    # "ray": prep and write in Ray tasks (equishard.common.ray_engine)
    engine: str = field(default="local", metadata=ENGINE_OPTION)
    ray_address: str | None = field(default=None, metadata=RAY_ADDRESS_OPTION)
    # a Ray task stuck longer is retried
    task_timeout: float | None = field(default=DEFAULT_TASK_TIMEOUT, metadata=TASK_TIMEOUT_OPTION)
    # ``current`` may be an object-store URL: its CURRENT generation is fetched into the local
    # root ``staging`` (default: shards.store.object_store.default_staging), rebalanced there,
    # and the new generation published back (shards.store.object_store)
    staging: str | None = field(
        default=None,
        metadata=option(
            "when CURRENT_ROOT is an object-store URL: the local root its CURRENT generation is "
            f"fetched into and the new one written in before upload (default: {STAGING_DEFAULT})",
            metavar="DIR",
        ),
    )
    storage_options: dict | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.ray_address and self.engine != "ray":
            raise ValueError("--ray-address is for --engine ray; add --engine ray or drop it")
        if not self.new and not self.delete and not self.calibration:
            raise ValueError(
                "nothing to do: give new inputs (--new), a deletion list (--delete) and/or a "
                "calibration to re-plan with (--calibration)"
            )
        if self.calibration:  # read and checked here: a bad file is a bad argument
            from balancing.cost_model import CostModel

            CostModel.from_calibration(self.calibration)
        for p in self.step_log:
            if not Path(p).is_file():
                raise ValueError(f"--step-log {p}: no such file")
        check_writable(self.current, "--current")  # the night publishes there
        check_count("--keep (generations; CURRENT is always kept)", self.keep, 1)
        check_count("--workers", self.workers, 1, MAX_WORKERS)
        check_real("--max-error-rate", self.max_error_rate, 0.0, 1.0, hi_open=False)
        check_flag("progress", self.progress)
        check_task_timeout(self.task_timeout)
        for p in (*self.new, *([self.delete] if self.delete else [])):
            if not Path(p).exists():
                raise ValueError(f"{p} does not exist")
        if self.delete:
            read_deletions(self.delete)  # a malformed list is a bad argument, found before work


@dataclass(slots=True)
class RebalanceResult:
    status: str  # "published" or "unchanged"
    generation: str
    parent: str | None
    counts: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    balance: dict = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)  # seconds of prep, combine, plan, write
    flagged: dict = field(default_factory=dict)  # the steps furthest from their plan (--step-log)

    def as_dict(self) -> dict:
        return asdict(self)


NIGHT_ERRORS = "night.errors.parquet"  # the night's rejected samples, carried in its generation


def finish_night(root: Path, generation: str, keep: int) -> list[str]:
    """What follows the publish of a nightly generation, each step idempotent, so a run killed
    anywhere after CURRENT moved is finished by the next one: the night's errors table (carried
    inside the generation) is copied to ``errors/``, ``LAST_NIGHT.json`` names the generation,
    old generations are collected, work directories go. Returns the removed generations."""
    gen_dir = root / generation
    nightly = load_manifest(gen_dir, check_files=False).raw.get("nightly") or {}
    carried = gen_dir / NIGHT_ERRORS
    dest = root / "errors" / f"{generation}.errors.parquet"
    if carried.exists() and not dest.exists():
        dest.parent.mkdir(exist_ok=True)
        atomic_write_bytes(dest, carried.read_bytes())
    _record_night(root, {"generation": generation, "status": "published", **nightly})
    removed = collect_generations(root, keep)
    for w in root.glob(".nightly-*"):  # this night's, and any abandoned earlier one
        shutil.rmtree(w, ignore_errors=True)
    return removed


def _record_night(root: Path, summary: dict) -> None:
    """Write ``LAST_NIGHT.json`` unless it already says exactly this (a re-run writes nothing)."""
    path = root / "LAST_NIGHT.json"
    try:
        if json.loads(read_small(path, 1 << 20)) == summary:
            return
    except (FileNotFoundError, ValueError, RecursionError):  # absent, damaged, not a file
        pass
    atomic_write_bytes(path, json.dumps(summary).encode())


def _rebalance_store(cfg: RebalanceConfig) -> RebalanceResult:
    """Rebalance the generation root at an object-store URL through a local staging root."""
    from shards.store.object_store import (
        current_tag,
        default_staging,
        fetch_generation,
        publish_generation,
        remove_remote_generation,
    )

    url, opts = cfg.current, cfg.storage_options
    # CURRENT's name and the store's tag of it: the publish moves CURRENT only if it still
    # holds them (S3 If-Match), so of two nights from one parent exactly one publishes
    cur, tag = current_tag(url, storage_options=opts)
    if cur is None:
        raise ManifestError(
            f"{url}: no {CURRENT}; write the first generation with 'equishard write'"
        )
    staging = Path(cfg.staging or default_staging(url))
    fetch_generation(url, cur, staging, storage_options=opts)  # kept from the last night if sound
    res = run_rebalance(replace(cfg, current=str(staging)))
    if res.status == "in_progress":
        return res
    if res.generation != cur:
        publish_generation(
            staging / res.generation, url, storage_options=opts, expect_current=(cur, tag)
        )
    for gen in res.removed:  # the local retention, mirrored once CURRENT has moved on
        remove_remote_generation(url, gen, storage_options=opts)
    return res


def run_rebalance(cfg: RebalanceConfig) -> RebalanceResult:
    """One nightly run; see the module docstring. Returns status ``in_progress`` (and does
    nothing) while another rebalance of the same root runs."""
    if is_url(cfg.current):
        return _rebalance_store(cfg)
    root = Path(cfg.current)
    if not root.is_dir():
        raise ManifestError(f"{root}: not a generation root (no such directory)")
    lock = try_lock(root / ".nightly.lock")
    if lock is None:
        return RebalanceResult("in_progress", read_current(root) or "", None)
    try:
        return _run_locked(cfg, root)
    finally:
        lock.close()


def _run_locked(cfg: RebalanceConfig, root: Path) -> RebalanceResult:
    from balancing.incremental import incremental_plan
    from balancing.plan import BalanceConfig, write_plan
    from dataprep import PrepConfig, run_prep
    from dataprep.image_orientation import IMAGE_SIZES
    from equishard.contracts.cost_table import read_cost_table, table_metadata
    from shards.read.prep_settings import PrepSettings
    from shards.store.manifest import carried_bytes
    from shards.write.writer import WriteConfig, write_generation

    t0 = time.perf_counter()
    cur = read_current(root)
    if cur is None:
        raise ManifestError(
            f"{root}: no {CURRENT} generation; write the first one with 'equishard write'"
        )
    parent = load_manifest(root / cur)
    key = night_key(cfg)
    done = parent.raw.get("nightly", {})
    if done.get("key") != key:  # a night that does something: what was CURRENT as it began
        note_current(root, cur, "night")
    if done.get("key") == key:  # this night is CURRENT already: finish any leftover work
        removed = finish_night(root, cur, cfg.keep)
        return RebalanceResult(
            "unchanged",
            cur,
            parent.parent,
            done.get("counts", {}),
            done.get("plan", {}),
            parent.report.get("metrics", {}),
            removed,
            time.perf_counter() - t0,
        )
    pcost_path, pplan_path = parent.path / COST_FILE, parent.path / PLAN_FILE
    if not pcost_path.exists() or not pplan_path.exists():
        raise ManifestError(
            f"{parent.path}: the generation carries no cost table/plan (written by an older "
            "equishard); rebuild it once with 'equishard write', then rebalance"
        )
    work = root / f".nightly-{hashlib.sha256((key + cur).encode()).hexdigest()[:16]}"
    work.mkdir(exist_ok=True)
    # as the parent wrote them (its manifest's sha256), and these bytes are the ones used: the
    # files were read again later (the plan after prep's minutes), unchecked by then
    pcost_bytes = carried_bytes(parent, COST_FILE)
    parent_plan = pq.read_table(io.BytesIO(carried_bytes(parent, PLAN_FILE)))
    meta = table_metadata(io.BytesIO(pcost_bytes))
    try:  # the new samples are measured exactly as the parent's were: its recorded settings
        recorded = PrepSettings.from_manifest(parent)
    except ValueError as exc:
        raise ManifestError(str(exc)) from None
    if cfg.tokenizer and recorded.tokenizer is not None:  # another copy: the same bytes
        recorded.resolve_tokenizer(cfg.tokenizer)
    parent_cost = read_cost_table(io.BytesIO(pcost_bytes))
    if meta.get("image_sizes") != IMAGE_SIZES and any(parent_cost.column(NUM_IMAGES).to_pylist()):
        raise ManifestError(
            f"{parent.path}: its samples were measured by an equishard that counted images as "
            "stored, not as displayed (EXIF orientation applied, as transformers does): a photo "
            "stored sideways may carry the wrong cost. Measure its inputs once more ('equishard "
            f"prep ... --cache {pcost_path}' reuses every text-only row), balance and write a "
            "generation, then rebalance"
        )
    new_path = work / "new.parquet"
    phases = {}
    t1 = time.perf_counter()
    if cfg.new and not measured(work):
        ro = meta.get("read_options") or {}
        cache = work / "parent-cost.parquet"  # prep's cache: the checked bytes, not the path
        atomic_write_bytes(cache, pcost_bytes)
        run_prep(
            PrepConfig(
                inputs=tuple(cfg.new),
                output=str(new_path),
                tokenizer=cfg.tokenizer or recorded.tokenizer_spec(),
                vision_policy=recorded.vision_policy["spec"],
                # and the parent's videos and recordings by the rules it measured them with
                video_rule=_rule_spec(meta, "video_rule"),
                audio_rule=_rule_spec(meta, "audio_rule"),
                template=recorded.template,
                image_root=cfg.image_root or ro.get("image_root"),
                image_column=ro.get("image_column"),
                text_column=ro.get("text_column"),
                allow_outside_image_root=bool(ro.get("allow_outside_image_root")),
                check_images=meta.get("check_images", "header"),
                workers=cfg.workers,
                max_error_rate=cfg.max_error_rate,
                cache=str(cache),
                progress=cfg.progress,
                engine=cfg.engine,
                ray_address=cfg.ray_address,
                task_timeout=cfg.task_timeout,
            )
        )
        record_measured(work)
    phases["prep"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    new = read_cost_table(new_path) if cfg.new else parent_cost.slice(0, 0)
    new_meta = (
        table_metadata(new_path)["counts"] if cfg.new else {"in": 0, "rejected": 0, "cached": 0}
    )
    combined, counts, changed = combine_tables(
        parent_cost, new, read_deletions(cfg.delete), night_meta(meta, cfg), work / "cost.parquet"
    )
    counts.update(
        read=new_meta["in"], rejected=new_meta["rejected"], not_reread=new_meta.get("cached", 0)
    )
    try:  # balanced exactly as the parent was: its recorded parameters
        bcfg = BalanceConfig.from_report(parent.report.get("parameters"), str(parent.path))
    except ValueError as exc:
        raise ManifestError(str(exc)) from None
    bcfg, replan = with_calibration(bcfg, cfg.calibration)  # measured costs: every step again
    flagged = flag_steps(cfg.step_log, cur) if cfg.step_log else {}
    if not (counts["new"] or counts["updated"] or counts["deleted"] or replan):
        # nothing changed: CURRENT stays as it is; rejected new samples stay on record
        summary = {"generation": cur, "status": "unchanged", "key": key, "counts": counts}
        if counts["rejected"]:
            dest = root / "errors" / f"night-{key}.errors.parquet"
            dest.parent.mkdir(exist_ok=True)
            atomic_write_bytes(dest, (work / "new.errors.parquet").read_bytes())
            summary["errors"] = str(dest.relative_to(root))
        _record_night(root, summary)
        shutil.rmtree(work, ignore_errors=True)
        return RebalanceResult(
            "unchanged",
            cur,
            parent.parent,
            counts,
            {},
            parent.report.get("metrics", {}),
            collect_generations(root, cfg.keep),
            time.perf_counter() - t0,
            flagged=flagged,
        )
    phases["combine"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    result = incremental_plan(parent_plan, combined, changed, bcfg, replan=replan)
    write_plan(result, work / "plan")
    phases["plan"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    nightly = {
        "key": key,
        "inputs": [str(Path(p).resolve()) for p in cfg.new],
        "deletions": cfg.delete,
        "counts": counts,
        "plan": result.report["incremental"],
    }
    res = write_generation(
        WriteConfig(
            plan_dir=str(work / "plan"),
            cost_table=str(work / "cost.parquet"),
            out=str(root),
            shard_size=parent.raw.get("shard_size", 1 << 30),
            workers=cfg.workers,
            reuse_from=str(parent.path),
            manifest_extra={"nightly": nightly},
            # rejected new samples travel inside the generation, so the record of them survives
            # a crash anywhere after the publish (finish_night copies them to errors/)
            extra_files={NIGHT_ERRORS: str(work / "new.errors.parquet")} if cfg.new else None,
            energon=has_energon_metadata(parent.path),  # loadable by Energon like its parent
            engine=cfg.engine,
            ray_address=cfg.ray_address,
            task_timeout=cfg.task_timeout,
        ),
        progress=cfg.progress,
    )
    phases["write"] = time.perf_counter() - t1
    removed = finish_night(root, res.generation, cfg.keep)
    return RebalanceResult(
        "published",
        res.generation,
        cur,
        counts,
        result.report["incremental"],
        result.report["metrics"],
        removed,
        time.perf_counter() - t0,
        {k: round(v, 3) for k, v in phases.items()},
        flagged=flagged,
    )


def _rule_spec(meta: dict, key: str) -> str | None:
    """The spec of the parent's video or audio rule (None: it measured none), checked."""
    rule = meta.get(key)
    if rule is None:
        return None
    if not isinstance(rule, dict) or not isinstance(rule.get("spec"), str):
        raise ManifestError(
            f"the parent's cost table records a {key} that is not a rule: {rule!r:.80}"
        )
    return rule["spec"]
