"""``equishard merge``: combine partial cost tables of a split prep run."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]

# the line the top-level --help shows
HELP = "combine partial cost tables from 'prep --shard-index K --num-shards N'"


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    from equishard.cli._common import add_json_arg

    p = sub.add_parser(
        name,
        help=HELP,
        description=(
            "Combine the partial cost tables written by 'equishard prep --shard-index K\n"
            "--num-shards N' on several machines into one cost table (and one errors table next to\n"
            "it). Every shard 0..N-1 must be given once; a sample_id found in two parts is an error."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "parts", nargs="+", metavar="PART", help="partial cost tables (.parquet), any order"
    )
    p.add_argument(
        "-o", "--output", required=True, metavar="COST_TABLE", help="merged cost table to write"
    )
    add_json_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from dataprep.errors import DataprepError
    from dataprep.merge import merge_cost_tables
    from equishard.cli._common import check_output, fail, print_json

    try:
        check_output(args.output)
        c = merge_cost_tables(args.parts, args.output)
    except (DataprepError, ValueError) as exc:
        return fail(str(exc))
    if args.json:
        fields = {"output": args.output, "parts": len(args.parts)}
        print_json(
            "merge", ok=True, n_in=c["in"], n_out=c["written"], rejected=c["rejected"], **fields
        )
        return 0
    print(
        f"merge: {len(args.parts)} parts -> {args.output}: {c['in']} samples in = "
        f"{c['written']} written + {c['rejected']} rejected"
    )
    return 0
