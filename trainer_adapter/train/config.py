"""Configuration of a training run (``equishard train``)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from equishard.common.values import check_choice, check_count, check_flag, check_real
from equishard.common.workers import MAX_WORKERS

__all__ = ["TrainConfig"]

# (2 * radius + 1) ** (pp - 1) partitions jittered around the anchor are costed; more would
# hang the set-up (radius 8 at pp 8 is 17^7 = 410M)
MAX_PARTITION_CANDIDATES = 100_000
MAX_STAGES = 1024


# the model presets (trainer_adapter.train.model._PRESETS) and the pipeline schedules
# (trainer_adapter.train.pipeline), named here so that the configuration loads without torch
MODEL_SIZES = ("tiny", "small", "1b")
SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")


def parse_steps(text: str) -> tuple[int, int]:
    """``"A:B"`` -> (A, B), steps A to B - 1 (0-based), with 0 <= A < B."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"profile steps must be A:B (two integers), got {text!r}") from None
    if not 0 <= a < b:
        raise ValueError(f"profile steps A:B need 0 <= A < B, got {text!r}")
    return a, b


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run over a shard generation, DP x PP ranks.

    ``tokenizer``/``vision_policy``/``template`` default to what the generation was prepared with
    (its manifest records them); ``mb_tokens`` (tokens per pipeline microbatch) defaults to a size
    that fits the generation's largest sample and group.
    """

    shards: str  # a generation or root: a directory or an fsspec URL (s3://bucket/prefix)
    dp: int
    pp: int = 1
    steps: int = 10
    schedule: str = "1f1b"
    microbatches: int | None = None
    virtual_stages: int = 2
    model: str = "tiny"
    mb_tokens: int | None = None
    # microbatch row sizes form a ladder up to mb_tokens, each this much larger than the last;
    # a step runs the smallest that holds its load (1.0: one fixed size, mb_tokens)
    bucket_ratio: float = 1.08
    # cut samples across microbatches where whole samples leave rows uneven (attention is
    # carried across the cut; the chain of rows runs backward in reverse)
    split_samples: bool = True
    lr: float = 1e-3
    seed: int = 0
    redistribute: bool = True
    method: str = "auto"
    placement: str = "nodewise"
    ranks_per_node: int | None = None
    workers: int = 1
    loader_timeout: float = 600.0  # seconds a DataLoader worker may take for one group
    tokenizer: str | None = None
    shards_cache: str | None = None  # a local directory keeping what is read from a URL --shards
    vision_policy: str | None = None
    template: str | None = None
    recompute: str = "off"
    memory_fraction: float = 0.9
    precision: str = "fp32"  # bf16: autocast (fp32 weights, gradients, optimizer state and loss)
    # torch.compile the transformer blocks' work around attention (model.compile_blocks)
    compile: bool = False
    backend: str = "auto"  # auto: NCCL with a GPU per local rank, gloo without CUDA
    partition_radius: int = 1
    partition_top_k: int = 3
    log: str | None = None
    profile: str | None = None  # a directory: torch profiler tables of steps profile_steps
    profile_steps: str = "3:5"  # A:B, steps A to B - 1
    profile_trace: bool = False  # also the chrome trace of the window (large)

    def __post_init__(self) -> None:
        self._check_types()
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}"
            )
        if self.schedule == "interleaved1f1b":
            if self.virtual_stages < 2:
                raise ValueError("interleaved1f1b needs virtual_stages >= 2 (stages per rank)")
            if self.n_microbatches % self.pp:
                raise ValueError(
                    f"interleaved1f1b needs microbatches divisible by pp={self.pp}, "
                    f"got {self.n_microbatches}"
                )
        if not 1.0 <= self.bucket_ratio < float("inf"):
            raise ValueError(
                f"bucket_ratio must be >= 1 (1: one microbatch size), got {self.bucket_ratio}"
            )
        if self.recompute not in ("off", "all", "adaptive"):
            raise ValueError(
                f"recompute must be off, all or adaptive (GPU only), got {self.recompute!r}"
            )
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(
                f"precision must be fp32 or bf16 (mixed precision), got {self.precision!r}"
            )
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ValueError(f"backend must be auto, nccl or gloo, got {self.backend!r}")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")
        if not 0 < self.lr < float("inf"):  # NaN fails this too
            raise ValueError(f"lr must be finite and > 0, got {self.lr}")
        if not 0 < self.loader_timeout < float("inf"):  # NaN fails this too
            raise ValueError(
                f"loader_timeout must be finite seconds > 0, got {self.loader_timeout}: a worker "
                "stuck on a read (a hung mount) would otherwise hold every rank forever"
            )
        # rank 0 appends to the log: a FIFO there would block it at the first step, for good
        if self.log is not None and os.path.exists(self.log) and not os.path.isfile(self.log):
            raise ValueError(f"--log {self.log}: not a regular file (a FIFO, device or directory)")
        if (
            self.profile is not None
            and os.path.exists(self.profile)
            and not os.path.isdir(self.profile)
        ):
            raise ValueError(f"--profile {self.profile}: not a directory")
        _, b = parse_steps(self.profile_steps)
        if self.profile is not None and b > self.steps:
            raise ValueError(
                f"profile steps {self.profile_steps} end after the run's {self.steps} steps; "
                f"profile an earlier window or raise steps"
            )

    def _check_types(self) -> None:
        """Counts are whole numbers in range, switches True or False, names known ones: a
        Python caller's ``steps=2.5`` or ``pp=float("nan")`` (NaN passes every ``<`` bound), or
        ``method="bogus"``, are refused here, before any rank is spawned."""
        for name, lo in (("dp", 1), ("steps", 1)):
            check_count(name, getattr(self, name), lo)
        # a stage holds at least one layer: no model here has MAX_STAGES layers (and
        # (2r + 1) ** (pp - 1) of a pp past it would take the set-up minutes to compute)
        for name in ("pp", "virtual_stages"):
            check_count(name, getattr(self, name), 1, MAX_STAGES)
        for name in ("microbatches", "mb_tokens", "ranks_per_node"):
            check_count(name, getattr(self, name), 1, none=True)
        check_count("workers", self.workers, 0, MAX_WORKERS)
        check_count("seed", self.seed, 0, (1 << 63) - 1)
        check_count("partition_radius", self.partition_radius, 0, 64)
        check_count("partition_top_k", self.partition_top_k, 1, 1024)
        if (2 * self.partition_radius + 1) ** (self.pp - 1) > MAX_PARTITION_CANDIDATES:
            raise ValueError(
                f"partition_radius {self.partition_radius} with pp={self.pp} makes "
                f"{2 * self.partition_radius + 1}^{self.pp - 1} candidate partitions to profile "
                f"(at most {MAX_PARTITION_CANDIDATES:,}); give a smaller radius (1 is the default)"
            )
        for name in ("split_samples", "redistribute", "compile", "profile_trace"):
            check_flag(name, getattr(self, name))
        check_choice("model", self.model, MODEL_SIZES)
        from balancing.post_balance import RUNTIME_METHODS  # numba: loaded when checked

        check_choice("method", self.method, RUNTIME_METHODS)
        check_choice("placement", self.placement, ("nodewise", "identity"))
        for name in ("bucket_ratio", "lr", "memory_fraction", "loader_timeout"):
            check_real(name, getattr(self, name), 0.0, lo_open=True)

    @property
    def world_size(self) -> int:
        return self.dp * self.pp

    @property
    def n_microbatches(self) -> int:
        return self.microbatches if self.microbatches is not None else 2 * self.pp

    @property
    def stages_per_rank(self) -> int:
        return self.virtual_stages if self.schedule == "interleaved1f1b" else 1

    def to_dict(self) -> dict:
        return asdict(self)
