"""``equishard verify``: check every checksum and sample count of a generation."""

from __future__ import annotations

import argparse

from equishard.cli._common import add_json_arg, add_store_args

__all__ = ["add_parser", "run"]

# the line the top-level --help shows
HELP = "check every shard checksum and sample count (non-zero exit on any problem)"


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(
        name,
        help=HELP,
        description="Check a generation: the manifest, every shard's sha256 and the sha256 of the\n"
        "cost table and plan it carries, and (unless --fast)\n"
        "every group's samples: complete, safe, and as many as the manifest says.\n"
        "Exit code 1 on any mismatch.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "generation",
        metavar="GEN",
        help="a generation directory, or a root with CURRENT; also an object-store URL",
    )
    p.add_argument("--fast", action="store_true", help="checksums only, do not read samples")
    add_store_args(p)
    add_json_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from equishard.cli._common import fail, print_json
    from shards.read.verify import verify_generation
    from shards.store.storage import is_url

    if not is_url(args.generation) and not Path(args.generation).is_dir():
        return fail(
            f"{args.generation}: not a generation directory or a root with CURRENT"
            + (" (it is a file)" if Path(args.generation).exists() else " (no such directory)")
        )
    r = verify_generation(args.generation, deep=not args.fast, progress=not args.json)
    if args.json:
        fields = {"generation": r.generation, "shards": r.shards, "problems": r.problems}
        bad = max(r.expected - r.samples, 0) if r.problems else 0
        print_json("verify", ok=r.ok, n_in=r.expected, n_out=r.samples, rejected=bad, **fields)
    else:
        for problem in r.problems:
            print(f"PROBLEM: {problem}")
        print(
            f"verify: generation {r.generation}: {r.shards} shards, {r.samples} samples checked, "
            f"{len(r.problems)} problem(s) -> {'OK' if r.ok else 'FAILED'}"
        )
    return 0 if r.ok else 1
