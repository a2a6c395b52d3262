"""What ``equishard write`` is asked to do: :class:`WriteConfig`, checked where it is made (sizes,
workers, the engine, the extra manifest keys and carried files, the plan and cost table it
names), its :class:`WriteResult`, and :func:`parse_size` for ``--shard-size``."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from equishard.common.options import option
from equishard.common.ray_engine import (
    DEFAULT_TASK_TIMEOUT,
    ENGINE_OPTION,
    ENGINES,
    RAY_ADDRESS_OPTION,
    TASK_TIMEOUT_OPTION,
)
from equishard.common.values import (  # parse_size: re-exported (--shard-size)
    check_count,
    check_flag,
    check_task_timeout,
    is_count,
    parse_size,
)
from equishard.common.workers import MAX_WORKERS
from equishard.contracts.generation import COST_FILE, MANIFEST, PLAN_FILE, WIDS_INDEX, WRITER_KEYS
from equishard.contracts.plan import PLAN_PARQUET, PLAN_REPORT
from shards.store.object_store import STAGING_DEFAULT
from shards.store.storage import check_writable
from shards.write.stream_pool import usable_cores

__all__ = ["MAX_SHARD_SIZE", "WRITER_KEYS", "WriteConfig", "WriteResult", "parse_size"]


@dataclass(frozen=True, kw_only=True)
class WriteConfig:
    plan_dir: str = field(
        metadata=option("directory written by 'equishard balance'", flag="", metavar="PLAN_DIR")
    )
    cost_table: str = field(
        metadata=option("the cost table the plan was made from", required=True, metavar="T")
    )
    out: str = field(
        metadata=option(
            "generation root (created if missing): a directory, or an object-store URL "
            "(s3://bucket/prefix, gs://..., any fsspec URL; credentials and endpoint from the "
            "store's usual environment, e.g. AWS_* variables)",
            required=True,
            metavar="GEN_ROOT",
        )
    )
    shard_size: int = field(
        default=1 << 30,
        metadata=option(
            "close a shard after this many bytes (default: 1GB)",
            type=str,
            default="1GB",
            parse=lambda size: parse_size(size),
        ),
    )
    workers: int = field(
        default=1,
        metadata=option(
            "writer processes, one stream each at a time, this one included (default: 1); "
            "each keeps two cores busy, so at most usable cores / 2 run (EQUISHARD_CORES "
            "overrides the cores seen)"
        ),
    )
    # a generation directory whose shards hold the groups the plan marks with parent_step >= 0
    # (nightly rebalancing): those are copied from there instead of read from the raw data
    reuse_from: str | None = None
    # more manifest keys (e.g. the nightly run that made this generation)
    manifest_extra: dict | None = None
    # more files carried inside the generation: {name in the generation: source path}
    extra_files: dict[str, str] | None = None
    # also write Megatron-Energon's metadata (.nv-meta/, .tar.idx): shards.write.energon
    energon: bool = field(
        default=False,
        metadata=option(
            "also make the generation loadable by Megatron-Energon (needs equishard[energon]); "
            "'rebalance' keeps doing so for generations that have it"
        ),
    )
    # "local": worker processes here; "ray": one Ray task per stream
    engine: str = field(default="local", metadata=ENGINE_OPTION)
    # with engine="ray": a running cluster; None starts a local one
    ray_address: str | None = field(default=None, metadata=RAY_ADDRESS_OPTION)
    # a stream stuck longer: a Ray task is retried, a local worker process fails the write
    task_timeout: float | None = field(default=DEFAULT_TASK_TIMEOUT, metadata=TASK_TIMEOUT_OPTION)
    # ``out`` may be an object-store URL (s3://bucket/prefix, any fsspec URL): the generation is
    # then written in the local root ``staging`` (default: shards.store.object_store.default_staging)
    # and uploaded, manifest last, CURRENT last of all (shards.store.object_store)
    staging: str | None = field(
        default=None,
        metadata=option(
            "with a URL --out: the local root the generation is written in before upload, "
            f"kept so a killed run resumes (default: {STAGING_DEFAULT})",
            metavar="DIR",
        ),
    )
    storage_options: dict | None = None
    # move CURRENT even where that rolls the root back (shards.store.current_guard): on purpose only
    force: bool = field(
        default=False,
        metadata=option(
            "make this generation CURRENT even where that rolls the root back: it was "
            "published there before the one CURRENT names (say, a night's), or CURRENT moved "
            "while it was written. Without it such a write is refused and CURRENT stays"
        ),
    )

    def __post_init__(self) -> None:
        check_writable(self.out, "--out")
        check_task_timeout(self.task_timeout)
        if not is_count(self.shard_size, 1024, MAX_SHARD_SIZE + 1):
            raise ValueError(
                f"--shard-size must be 1KB to 1PB, got {self.shard_size} bytes (a shard is "
                "closed after the group that reaches it)"
            )
        check_count("--workers", self.workers, 1, MAX_WORKERS)
        check_flag("energon", self.energon)
        check_flag("force", self.force)
        if self.workers > 1 and self.engine == "local":
            usable_cores()  # EQUISHARD_CORES checked here, before anything is staged
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.ray_address and self.engine != "ray":
            raise ValueError("--ray-address is for --engine ray; add --engine ray or drop it")
        _check_extras(self.manifest_extra, self.extra_files)
        for f in (
            Path(self.plan_dir) / PLAN_PARQUET,
            Path(self.plan_dir) / PLAN_REPORT,
            Path(self.cost_table),
        ):
            if f.exists() and not f.is_file():
                raise ValueError(f"{f}: not a regular file (a FIFO, device or directory)")
            if not f.is_file():
                raise ValueError(
                    f"{f} does not exist: run 'equishard prep' and 'equishard balance' first"
                )


_CARRIED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def _check_extras(manifest_extra, extra_files) -> None:
    """``manifest_extra`` adds JSON keys the writer does not write; ``extra_files`` names plain
    files of the generation (one name, no directory, not one the writer writes: a name like
    ``../x`` would be written outside the generation) and their existing sources."""
    if manifest_extra is not None:
        if not isinstance(manifest_extra, dict):
            raise ValueError(f"manifest_extra must be a dict, got {type(manifest_extra).__name__}")
        clash = sorted(WRITER_KEYS & set(manifest_extra))
        if clash:
            raise ValueError(f"manifest_extra would replace the writer's own keys {clash}")
        try:
            json.dumps(manifest_extra, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"manifest_extra must be plain JSON: {exc}") from None
    if extra_files is None:
        return
    if not isinstance(extra_files, dict):
        raise ValueError(f"extra_files must be a dict, got {type(extra_files).__name__}")
    reserved = {MANIFEST, COST_FILE, PLAN_FILE, WIDS_INDEX}
    for name, src in extra_files.items():
        if not isinstance(name, str) or not _CARRIED_NAME.fullmatch(name) or name in reserved:
            raise ValueError(
                f"extra_files name {name!r} must be one plain file name (letters, digits, '.', "
                f"'_', '-'; no directory) other than {sorted(reserved)}"
            )
        if not isinstance(src, str | os.PathLike) or not Path(src).is_file():
            raise ValueError(f"extra_files[{name!r}]: {src!r} is not a regular file")


@dataclass(slots=True)
class WriteResult:
    generation: str
    path: str
    parent: str | None
    samples: int
    groups: int
    shards: int
    bytes: int
    reused: bool


MAX_SHARD_SIZE = 1 << 50  # 1 PiB: any larger size means one shard per stream anyway
