"""Configuration of a training run (``equishard train``)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from equishard.common.options import option
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
PLACEMENTS = ("nodewise", "identity")
RECOMPUTE = ("off", "all", "adaptive")
PRECISIONS = ("fp32", "bf16")
BACKENDS = ("auto", "nccl", "gloo")


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

    shards: str = field(
        metadata=option(
            "a generation directory, or a root with CURRENT; also an object-store URL "
            "(s3://bucket/prefix, any fsspec URL; groups are read by byte range)",
            required=True,
            metavar="GEN",
        )
    )
    dp: int = field(metadata=option("data-parallel replicas", required=True))
    pp: int = field(default=1, metadata=option("pipeline stages per replica (default 1)"))
    steps: int = field(default=10, metadata=option("optimizer steps (default 10)"))
    schedule: str = field(
        default="1f1b", metadata=option("pipeline schedule (default 1f1b)", choices=SCHEDULES)
    )
    microbatches: int | None = field(
        default=None, metadata=option("microbatches per step and replica (default 2 x pp)")
    )
    virtual_stages: int = field(
        default=2, metadata=option("stages per rank for interleaved1f1b (default 2)")
    )
    model: str = field(
        default="tiny",
        metadata=option("model size (default tiny: runs on a CPU)", choices=MODEL_SIZES),
    )
    mb_tokens: int | None = field(
        default=None,
        metadata=option(
            "largest microbatch row in tokens (default: fits the largest sample and group)"
        ),
    )
    # microbatch row sizes form a ladder up to mb_tokens, each this much larger than the last;
    # a step runs the smallest that holds its load (1.0: one fixed size, mb_tokens)
    bucket_ratio: float = field(
        default=1.08,
        metadata=option(
            "row sizes form a ladder up to --mb-tokens, each this much larger than the last; "
            "a step runs the smallest that holds it (default 1.08; 1 = always --mb-tokens)"
        ),
    )
    # cut samples across microbatches where whole samples leave rows uneven (attention is
    # carried across the cut; the chain of rows runs backward in reverse)
    split_samples: bool = field(
        default=True,
        metadata=option(
            "never cut a sample across pipeline microbatches (rows then fit the step's "
            "longest sample: more padding; default: cut where whole samples leave rows uneven, "
            "attention carried across the cut, so the model sees each sample whole)",
            flag="--whole-samples",
            negate=True,
        ),
    )
    lr: float = field(default=1e-3, metadata=option("AdamW learning rate (default 1e-3)"))
    seed: int = field(default=0, metadata=option("model init and loader order (default 0)"))
    redistribute: bool = field(
        default=True,
        metadata=option(
            "train on the groups as read (the baseline to compare against); each step still "
            "logs the max/mean redistribution would have given (a dry run: nothing moves)",
            flag="--no-redistribute",
            negate=True,
        ),
    )
    method: str = field(
        default="auto",
        metadata=option(
            "runtime balancer: auto, best, lpt, kk, kk_equal, locality, ... (default auto)"
        ),
    )
    placement: str = field(
        default="nodewise",
        metadata=option(
            "place balanced batches to keep traffic inside nodes (default nodewise)",
            choices=PLACEMENTS,
        ),
    )
    calibration: str | None = field(
        default=None,
        metadata=option(
            "runtime balancing costs from `equishard calibrate`'s file, measured on this "
            "hardware (default: the model's dimensions)",
            metavar="JSON",
        ),
    )
    ranks_per_node: int | None = field(
        default=None,
        metadata=option("ranks sharing a node (default: torchrun's processes per node)"),
    )
    workers: int = field(
        default=1, metadata=option("DataLoader workers per reading rank (default 1)")
    )
    loader_timeout: float = field(
        default=600.0,
        metadata=option(
            "seconds a DataLoader worker may take to read and collate one group before the "
            "run fails naming it (with --workers >= 1; default 600): a read stuck on a hung "
            "mount ends the run instead of holding every rank",
            metavar="S",
        ),
    )
    tokenizer: str | None = field(
        default=None,
        metadata=option("tokenizer.json (default: the one prep used, from the manifest)"),
    )
    shards_cache: str | None = field(
        default=None,
        metadata=option(
            "with a URL --shards: keep the bytes read in this local directory, so later "
            "epochs read nothing twice (safe to share between ranks)",
            metavar="DIR",
        ),
    )
    vision_policy: str | None = field(default=None, metadata=option("default: the one prep used"))
    template: str | None = field(default=None, metadata=option("default: the one prep used"))
    recompute: str = field(
        default="off",
        metadata=option(
            "activation recomputation: off, all blocks, or adaptive (GPU: measure memory, "
            "recompute only what does not fit; OmniBal A.1.1) (default off)",
            choices=RECOMPUTE,
        ),
    )
    memory_fraction: float = field(
        default=0.9,
        metadata=option("share of GPU memory adaptive recomputation may plan for (default 0.9)"),
    )
    # bf16: autocast (fp32 weights, gradients, optimizer state and loss)
    precision: str = field(
        default="fp32",
        metadata=option(
            "fp32, or bf16 mixed precision (autocast: weights, gradients and optimizer in "
            "fp32, matrix products in bf16; the loss in fp32) (default fp32)",
            choices=PRECISIONS,
        ),
    )
    # torch.compile the transformer blocks' work around attention (model.compile_blocks)
    compile: bool = field(
        default=False,
        metadata=option(
            "compile the transformer blocks' norms, projections, MLP and residuals with "
            "torch.compile (fused kernels, cheap activations recomputed instead of kept; the "
            "first steps pay the compile; attention stays the flash path)"
        ),
    )
    backend: str = field(
        default="auto",
        metadata=option(
            "process group backend (default auto: NCCL with one GPU per process, else gloo)",
            choices=BACKENDS,
        ),
    )
    partition_radius: int = 1
    partition_top_k: int = 3
    log: str | None = field(
        default=None, metadata=option("append per-step records here", metavar="JSONL")
    )
    profile: str | None = field(
        default=None,
        metadata=option(
            "profile steps --profile-steps with torch's profiler; each rank writes its top "
            "operators and kernels, device busy share and stalling calls into DIR",
            metavar="DIR",
        ),
    )
    profile_steps: str = field(
        default="3:5",
        metadata=option(
            "the profiled window, steps A to B-1 (default 3:5, after warm-up)", metavar="A:B"
        ),
    )
    profile_trace: bool = field(
        default=False,
        metadata=option("also write each rank's chrome trace of the window (large) into --profile"),
    )

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
        if self.recompute not in RECOMPUTE:
            raise ValueError(
                f"recompute must be off, all or adaptive (GPU only), got {self.recompute!r}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"precision must be fp32 or bf16 (mixed precision), got {self.precision!r}"
            )
        if self.backend not in BACKENDS:
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
        if self.calibration is not None:  # read and checked here, before any rank starts
            from balancing.cost_model import CostModel

            CostModel.from_calibration(self.calibration)
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
        check_choice("placement", self.placement, PLACEMENTS)
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
