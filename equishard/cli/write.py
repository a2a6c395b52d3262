"""``equishard write``: plan + cost table -> a published shard generation."""

from __future__ import annotations

import argparse

from equishard.cli._common import add_json_arg, add_store_args
from equishard.common.options import add_options, config_kwargs
from shards.write.write_config import WriteConfig

__all__ = ["add_parser", "run"]

# the line the top-level --help shows
HELP = "write balanced WebDataset shards from a plan"

_DESCRIPTION = """\
Write the samples of a plan as WebDataset shards: one stream per (node, local rank), step s of a
rank being the s-th group of its stream, each sample KEY.json + KEY.0.jpg, KEY.1.png, ... with the
original image bytes. The generation is written under GEN_ROOT/.staging-<id>, published by one
atomic rename to GEN_ROOT/<id>, and GEN_ROOT/CURRENT then names it. Killing the writer at any
moment is safe: re-running resumes and gives byte-identical shards; re-running a finished write
does nothing, and never moves CURRENT back: a generation published before the one CURRENT names
(say, a night's) is made CURRENT again only with --force. --energon also writes
Megatron-Energon's metadata (.nv-meta/ and a .tar.idx per shard, as 'energon prepare' does,
plus dataset.yaml) so Energon loads the generation directly.
With an object-store URL as --out, the generation is written in a local staging root, then
uploaded: shards first, manifest last, CURRENT last of all (readers never see a partial one).
--engine ray writes the streams in Ray tasks (one per stream) with the same bytes as a local run.

examples:
  equishard write build/plan --cost-table build/cost.parquet --out build/shards --shard-size 1GB --workers 4
  equishard write build/plan --cost-table build/cost.parquet --out s3://bucket/vlm-shards \\
      --engine ray --ray-address auto --workers 64
"""


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(
        name,
        help=HELP,
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, WriteConfig, what="write streams")  # declared on its fields
    add_store_args(p)
    add_json_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from equishard.cli._common import check_output_dir, fail, os_failure, print_json
    from shards.store.storage import is_url
    from shards.write.writer import WriteConfig, WriteError, write_generation

    try:
        if not is_url(args.out):
            check_output_dir(args.out)
        elif args.staging:
            check_output_dir(args.staging)
        cfg = WriteConfig(**config_kwargs(WriteConfig, args))
    except ValueError as exc:  # a bad argument or input (exit 2)
        return fail(str(exc))
    try:
        r = write_generation(cfg, progress=not args.json)
    except (ValueError, WriteError) as exc:  # bad input found while reading it, a refused
        return fail(str(exc))  # publish (exit 2)
    except OSError as exc:  # a failure while working: a full disk, a lost mount (exit 1)
        return fail(os_failure(exc, f"writing under {args.out}"), code=1)
    if args.json:
        fields = {"generation": r.generation, "path": str(r.path), "parent": r.parent}
        fields |= {"reused": r.reused, "groups": r.groups, "shards": r.shards, "bytes": r.bytes}
        print_json("write", ok=True, n_in=r.samples, n_out=r.samples, rejected=0, **fields)
        return 0
    state = "already complete, nothing written" if r.reused else "published"
    print(
        f"\nwrite: generation {r.generation} {state}\n  {r.path}\n"
        f"  {r.samples} samples in {r.groups} groups, "
        f"{r.shards} shards, {r.bytes / 2**20:.1f} MiB; parent {r.parent or '-'}"
    )
    return 0
