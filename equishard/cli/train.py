"""``equishard train``: DP x PP training of a small VLM on a shard generation, through torchrun."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from equishard.cli._common import add_store_args

__all__ = ["add_parser", "run"]

# the line the top-level --help shows
HELP = "train a VLM on a generation: runtime redistribution + pipeline (torchrun)"


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(
        name,
        help=HELP,
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
    from equishard.common.options import add_options
    from trainer_adapter.train.config import TrainConfig

    p.add_argument("--nproc", type=int, required=True, help="processes (= dp x pp)")
    add_options(p, TrainConfig)  # declared on its fields
    add_store_args(p)
    p.set_defaults(run=run)


def local_rank_limit() -> int:
    """The most ranks ``equishard train`` starts on one machine: a typo such as ``--dp
    100000`` must fail at once, never fork that many Python processes."""
    from equishard.common.workers import usable_cores

    return max(8, 4 * usable_cores())


def run(args: argparse.Namespace) -> int:
    from equishard.cli._common import fail
    from equishard.common.options import config_kwargs
    from shards.store.manifest import ManifestError, open_generation
    from trainer_adapter.train.config import TrainConfig

    if args.nproc != args.dp * args.pp:
        return fail(f"--nproc {args.nproc} must equal --dp x --pp = {args.dp * args.pp}")
    try:  # before any process starts: a wrong --shards is one line, not a torchrun failure
        open_generation(args.shards)
    except ManifestError as exc:
        return fail(f"--shards: {exc}")
    try:
        cfg = TrainConfig(**config_kwargs(TrainConfig, args))
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
