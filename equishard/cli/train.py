"""``equishard train``: DP x PP training of a small VLM on a shard generation, through torchrun."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from equishard.cli._common import add_store_args

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(
        name,
        help="train a VLM on a generation: runtime redistribution + pipeline (torchrun)",
        description="Start N processes with torchrun (gloo on CPU, NCCL on GPUs). Each step,\n"
        "the first pipeline stage of every DP replica reads one balanced group from the shards;\n"
        "the runtime balancer moves samples between ranks (vision and LLM phases planned apart,\n"
        "node-local first); the image encoder runs on every rank; the LLM runs as a PP-stage\n"
        "pipeline under torch.distributed.pipelining. Logs per step: time, tokens/s, loads\n"
        "max/mean before -> after redistribution, bytes moved inside/across nodes, and the\n"
        "measured bubble fraction per stage.\n\n"
        "example: equishard train --shards build/demo/shards --nproc 4 --dp 2 --pp 2 --steps 5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--shards",
        required=True,
        metavar="GEN",
        help="a generation directory, or a root with CURRENT; also an object-store URL "
        "(s3://bucket/prefix, any fsspec URL; groups are read by byte range)",
    )
    p.add_argument(
        "--shards-cache",
        metavar="DIR",
        help="with a URL --shards: keep the bytes read in this local directory, so later epochs "
        "read nothing twice (safe to share between ranks)",
    )
    p.add_argument("--nproc", type=int, required=True, help="processes (= dp x pp)")
    p.add_argument("--dp", type=int, required=True, help="data-parallel replicas")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages per replica (default 1)")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    p.add_argument(
        "--schedule",
        default="1f1b",
        choices=("gpipe", "1f1b", "interleaved1f1b"),
        help="pipeline schedule (default 1f1b)",
    )
    p.add_argument(
        "--microbatches",
        type=int,
        default=None,
        help="microbatches per step and replica (default 2 x pp)",
    )
    p.add_argument(
        "--virtual-stages",
        type=int,
        default=2,
        help="stages per rank for interleaved1f1b (default 2)",
    )
    p.add_argument(
        "--mb-tokens",
        type=int,
        default=None,
        help="largest microbatch row in tokens (default: fits the largest sample and group)",
    )
    p.add_argument(
        "--bucket-ratio",
        type=float,
        default=1.08,
        help="row sizes form a ladder up to --mb-tokens, each this much larger than the last; "
        "a step runs the smallest that holds it (default 1.08; 1 = always --mb-tokens)",
    )
    p.add_argument(
        "--whole-samples",
        action="store_true",
        help="never cut a sample across pipeline microbatches (rows then fit the step's "
        "longest sample: more padding; default: cut where whole samples leave rows uneven, "
        "attention carried across the cut, so the model sees each sample whole)",
    )
    p.add_argument(
        "--model",
        default="tiny",
        choices=("tiny", "small", "1b"),
        help="model size (default tiny: runs on a CPU)",
    )
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="model init and loader order (default 0)")
    p.add_argument(
        "--no-redistribute",
        action="store_true",
        help="train on the groups as read (the baseline to compare against); each step still "
        "logs the max/mean redistribution would have given (a dry run: nothing moves)",
    )
    p.add_argument(
        "--method",
        default="auto",
        help="runtime balancer: auto, best, lpt, kk, kk_equal, locality, ... (default auto)",
    )
    p.add_argument(
        "--placement",
        default="nodewise",
        choices=("nodewise", "identity"),
        help="place balanced batches to keep traffic inside nodes (default nodewise)",
    )
    p.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        help="ranks sharing a node (default: torchrun's processes per node)",
    )
    p.add_argument(
        "--workers", type=int, default=1, help="DataLoader workers per reading rank (default 1)"
    )
    p.add_argument(
        "--loader-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds a DataLoader worker may take to read and collate one group before the "
        "run fails naming it (with --workers >= 1; default 600): a read stuck on a hung mount "
        "ends the run instead of holding every rank",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer.json (default: the one prep used, from the manifest)",
    )
    p.add_argument("--vision-policy", default=None, help="default: the one prep used")
    p.add_argument("--template", default=None, help="default: the one prep used")
    p.add_argument(
        "--recompute",
        default="off",
        choices=("off", "all", "adaptive"),
        help="activation recomputation: off, all blocks, or adaptive (GPU: measure "
        "memory, recompute only what does not fit; OmniBal A.1.1) (default off)",
    )
    p.add_argument(
        "--memory-fraction",
        type=float,
        default=0.9,
        help="share of GPU memory adaptive recomputation may plan for (default 0.9)",
    )
    p.add_argument(
        "--precision",
        default="fp32",
        choices=("fp32", "bf16"),
        help="fp32, or bf16 mixed precision (autocast: weights, gradients and optimizer in "
        "fp32, matrix products in bf16; the loss in fp32) (default fp32)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="compile the transformer blocks' norms, projections, MLP and residuals with "
        "torch.compile (fused kernels, cheap activations recomputed instead of kept; the first "
        "steps pay the compile; attention stays the flash path)",
    )
    p.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "nccl", "gloo"),
        help="process group backend (default auto: NCCL with one GPU per process, else gloo)",
    )
    p.add_argument("--log", default=None, metavar="JSONL", help="append per-step records here")
    p.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="profile steps --profile-steps with torch's profiler; each rank writes its top "
        "operators and kernels, device busy share and stalling calls into DIR",
    )
    p.add_argument(
        "--profile-steps",
        default="3:5",
        metavar="A:B",
        help="the profiled window, steps A to B-1 (default 3:5, after warm-up)",
    )
    p.add_argument(
        "--profile-trace",
        action="store_true",
        help="also write each rank's chrome trace of the window (large) into --profile",
    )
    add_store_args(p)
    p.set_defaults(run=run)


def local_rank_limit() -> int:
    """The most ranks ``equishard train`` starts on one machine: a typo such as ``--dp
    100000`` must fail at once, never fork that many Python processes."""
    from equishard.common.workers import usable_cores

    return max(8, 4 * usable_cores())


def run(args: argparse.Namespace) -> int:
    from equishard.cli._common import fail
    from shards.store.manifest import ManifestError, open_generation
    from trainer_adapter.train.config import TrainConfig

    if args.nproc != args.dp * args.pp:
        return fail(f"--nproc {args.nproc} must equal --dp x --pp = {args.dp * args.pp}")
    try:  # before any process starts: a wrong --shards is one line, not a torchrun failure
        open_generation(args.shards)
    except ManifestError as exc:
        return fail(f"--shards: {exc}")
    try:
        cfg = TrainConfig(
            shards=args.shards,
            shards_cache=args.shards_cache,
            dp=args.dp,
            pp=args.pp,
            steps=args.steps,
            schedule=args.schedule,
            microbatches=args.microbatches,
            virtual_stages=args.virtual_stages,
            model=args.model,
            mb_tokens=args.mb_tokens,
            bucket_ratio=args.bucket_ratio,
            split_samples=not args.whole_samples,
            lr=args.lr,
            seed=args.seed,
            redistribute=not args.no_redistribute,
            method=args.method,
            placement=args.placement,
            ranks_per_node=args.ranks_per_node,
            workers=args.workers,
            loader_timeout=args.loader_timeout,
            tokenizer=args.tokenizer,
            vision_policy=args.vision_policy,
            template=args.template,
            recompute=args.recompute,
            memory_fraction=args.memory_fraction,
            precision=args.precision,
            compile=args.compile,
            backend=args.backend,
            log=args.log,
            profile=args.profile,
            profile_steps=args.profile_steps,
            profile_trace=args.profile_trace,
        )
    except ValueError as exc:
        return fail(str(exc))
    most = local_rank_limit()  # the settings are checked; now what this machine can start
    if not 1 <= args.nproc <= most:
        return fail(
            f"--nproc {args.nproc}: equishard train starts every rank on this machine, at most "
            f"{most} here (4 per usable core, at least 8); for more, run "
            "trainer_adapter.train.loop under torchrun or your cluster's launcher across "
            "machines, as this command does on one"
        )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.nproc}",
        "-m",
        "trainer_adapter.train.loop",
        "--config",
        json.dumps(cfg.to_dict()),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    # torchrun and its ranks start with ``-m``, which puts the working directory first on
    # sys.path: a data folder there named like a package of ours (./shards) must not be imported
    env["PYTHONSAFEPATH"] = "1"
    print(
        f"train: {args.nproc} processes (dp {args.dp} x pp {args.pp}, {args.schedule}) on "
        f"{args.shards}",
        flush=True,
    )
    return subprocess.call(cmd, env=env)
