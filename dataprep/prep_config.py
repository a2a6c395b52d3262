"""What ``equishard prep`` is asked to do (:class:`PrepConfig`, checked where it is made: inputs
and output, workers and engine, the shard of the inputs, the error rate, the image check, the
cache, and the vision policy, tokenizer and template specs) and what it reports
(:class:`PrepResult`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dataprep.chat_template import load_template
from dataprep.image_header import CHECKS
from dataprep.policies import parse_vision_policy
from dataprep.text_tokens import TokenizerSpec
from equishard.common.ray_engine import DEFAULT_TASK_TIMEOUT, ENGINES
from equishard.common.values import check_count, check_flag, check_real, check_task_timeout
from equishard.common.workers import MAX_WORKERS
from equishard.contracts.cost_table import errors_path

__all__ = ["PrepConfig", "PrepResult"]


@dataclass(frozen=True, kw_only=True)
class PrepConfig:
    inputs: tuple[str, ...]
    output: str
    tokenizer: str | None
    vision_policy: str = "internvl"
    template: str = "chatml"
    image_root: str | None = None
    image_column: str | None = None
    text_column: str | None = None
    workers: int = 1
    chunk_size: int = 1024
    shard_index: int = 0
    num_shards: int = 1
    max_error_rate: float = 0.01
    progress: bool = False
    cache: str | None = None  # a cost table whose rows are reused when sample_id + cache_key match
    check_images: str = "header"  # "header": walk each file's structure; "decode": full decode
    allow_outside_image_root: bool = False  # read image paths that resolve outside image_root
    engine: str = (
        "local"  # "local": worker processes here; "ray": Ray tasks (equishard.common.ray_engine)
    )
    ray_address: str | None = None  # with engine="ray": a running cluster; None starts a local one
    task_timeout: float | None = DEFAULT_TASK_TIMEOUT  # a Ray task stuck longer is retried

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError(
                "no inputs: give one or more .json/.jsonl/.parquet/.tar files or HF dataset dirs"
            )
        if not self.output.endswith(".parquet"):
            raise ValueError(
                f"output {self.output!r} must end in .parquet (e.g. -o build/cost.parquet)"
            )
        check_count("--workers", self.workers, 1, MAX_WORKERS)
        check_task_timeout(self.task_timeout)
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.ray_address and self.engine != "ray":
            raise ValueError("--ray-address is for --engine ray; add --engine ray or drop it")
        check_count("chunk_size (samples)", self.chunk_size, 1, 1 << 24)
        check_count("--num-shards", self.num_shards, 1, 1 << 20)
        check_count("--shard-index", self.shard_index, 0, 1 << 20)
        for name in ("progress", "allow_outside_image_root"):
            check_flag(name, getattr(self, name))
        if not 0 <= self.shard_index < self.num_shards:
            raise ValueError(
                f"--shard-index must be in [0, --num-shards), got {self.shard_index} of {self.num_shards}"
            )
        check_real("--max-error-rate", self.max_error_rate, 0.0, 1.0, hi_open=False)
        if self.check_images not in CHECKS:
            raise ValueError(
                f"--check-images must be one of {', '.join(CHECKS)}, got {self.check_images!r}"
            )
        if self.cache is not None and not Path(self.cache).is_file():
            raise ValueError(
                f"--cache {self.cache}: no such cost table; give the cost table of an earlier prep"
            )
        for out in (Path(self.output), errors_path(self.output)):  # never over an input
            for given in self.inputs:
                if out.is_file() and Path(given).is_file() and os.path.samefile(out, given):
                    what = "cost" if out == Path(self.output) else "errors"
                    raise ValueError(
                        f"output {out} is the input {given}: prep would replace its own input "
                        f"with its {what} table; write it elsewhere (e.g. -o build/cost.parquet)"
                    )
        parse_vision_policy(self.vision_policy)  # validates the spec early
        TokenizerSpec.parse(self.tokenizer)
        load_template(self.template)


@dataclass(slots=True)
class PrepResult:
    output: str
    errors_output: str
    n_in: int = 0
    n_written: int = 0
    n_rejected: int = 0
    n_cached: int = 0
    damaged_ranges: int = 0  # byte ranges of tars that held no sample (rows of the errors table)
    reasons: dict[str, int] = field(default_factory=dict)
    percentiles: dict[str, dict[str, float]] = field(default_factory=dict)
    modalities: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    # what the counts were measured with, and what looked wrong about it (setting_checks)
    settings: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)
