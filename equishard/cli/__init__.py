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
    "import-lengths": "equishard.cli.import_lengths",
    "merge": "equishard.cli.merge",
    "balance": "equishard.cli.balance",
    "write": "equishard.cli.write",
    "verify": "equishard.cli.verify",
    "inspect": "equishard.cli.inspect",
    "train": "equishard.cli.train",
    "calibrate": "equishard.cli.calibrate",
    "rebalance": "equishard.cli.rebalance",
    "report": "equishard.cli.report",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line. ``only``: build that subcommand's options alone, the others with their
    help line only (what ``main`` does: a subcommand's options may come from a configuration
    whose module loads numba or torch, paid only by the command that runs); ``""``: none."""
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
        mod = importlib.import_module(module)
        if only is None or name == only:
            mod.add_parser(sub, name)
        else:
            sub.add_parser(name, help=mod.HELP)
    return parser


def _unrecognized(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> None:
    """Exit 2 for arguments the subcommand does not take, with the subcommand's usage (not the
    top-level one) and, for a mistyped option, the options it may have meant."""
    import difflib

    sub = parser._subparsers._group_actions[0].choices[command]
    known = [s for a in sub._actions for s in a.option_strings if s.startswith("--")]
    hints = []
    for word in unknown:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], known, n=3, cutoff=0.6)
            if close:
                hints.append(f"{word.split('=', 1)[0]}: did you mean {' or '.join(close)}?")
    message = f"unrecognized arguments: {' '.join(unknown)}"
    sub.error(f"{message} ({'; '.join(hints)})" if hints else message)


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. Whatever it raises becomes one line on stderr, never a traceback
    (``EQUISHARD_TRACEBACK=1`` shows it): bad input or arguments exit 2, a failure while
    working (a disk error, a write that cannot finish) exits 1. A reader that closes the pipe
    early (``equishard inspect ... | head``) ends the command quietly."""
    import os

    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    parser = build_parser(command if command in SUBCOMMANDS else "")
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _unrecognized(parser, args.command, unknown)
    from dataprep.errors import DataprepError
    from equishard.common.errors import describe

    try:
        if getattr(args, "apply_store", None) is not None:
            args.apply_store(args)
        return int(args.run(args) or 0)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
        return 0
    except KeyboardInterrupt:
        print(f"equishard {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, DataprepError) as exc:
        if os.environ.get("EQUISHARD_TRACEBACK"):
            raise
        print(f"equishard {args.command}: error: {describe(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        if os.environ.get("EQUISHARD_TRACEBACK"):
            raise
        print(f"equishard {args.command}: failed: {describe(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
