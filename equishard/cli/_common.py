"""Small helpers shared by the subcommands: error reporting and plain-text tables."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["add_engine_args", "check_output", "check_output_dir", "fail", "format_table"]


def fail(message: str, code: int = 2) -> int:
    print(f"equishard: error: {message}", file=sys.stderr)
    return code


def add_engine_args(p, what: str) -> None:
    """``--engine`` and ``--ray-address`` for a subcommand that can run on Ray."""
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help=f"local: {what} in worker processes on this machine (default); ray: in Ray tasks "
        "on a Ray cluster (needs equishard[ray]; every node must see the input and output "
        "paths). --workers then is the number of tasks at a time (a local cluster gets that "
        "many CPUs)",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to run on: auto, HOST:PORT or ray://HOST:10001 (default: "
        "$RAY_ADDRESS, else start a local cluster)",
    )


def check_output_dir(path: str | os.PathLike) -> None:
    """Make sure directory ``path`` exists (created if needed) and is writable; ``ValueError``
    naming it otherwise, before any work is done."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create output directory {p}: {exc.strerror or exc}") from None
    if not p.is_dir() or not os.access(p, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write into {p}: not a writable directory")


def check_output(path: str | os.PathLike) -> None:
    """Make sure output file ``path`` can be written (its directory exists or can be made and is
    writable, and it is not a directory)."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"output {p} is a directory; give a file name")
    check_output_dir(p.parent if str(p.parent) else ".")


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for n, r in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=False))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
