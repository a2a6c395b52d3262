"""The ``equishard`` command: one subcommand per module in this package."""

from __future__ import annotations

import argparse
import importlib
import sys

from equishard import __version__

__all__ = ["main"]

# subcommand -> module under equishard.cli (each has add_parser(subparsers) and run(args) -> int)
SUBCOMMANDS = {
    "demo": "equishard.cli.demo",
    "prep": "equishard.cli.prep",
    "merge": "equishard.cli.merge",
    "balance": "equishard.cli.balance",
    "write": "equishard.cli.write",
    "verify": "equishard.cli.verify",
    "inspect": "equishard.cli.inspect",
    "train": "equishard.cli.train",
    "rebalance": "equishard.cli.rebalance",
    "report": "equishard.cli.report",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="equishard",
        description=(
            "Turn a vision-language dataset into balanced shards so that no GPU waits for another.\n"
            "Stages: demo (make a sample dataset) -> prep (measure every sample's vision and text\n"
            "tokens into a cost table) -> balance (group samples into balanced steps and ranks)\n"
            "-> write (balanced WebDataset shards) -> verify / inspect (check and summarize them)\n"
            "-> train (runtime redistribution + pipelined training of a VLM on the shards).\n"
            "Run 'equishard SUBCOMMAND --help' for each one."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"equishard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    for name, module in SUBCOMMANDS.items():
        importlib.import_module(module).add_parser(sub, name)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
