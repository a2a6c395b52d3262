"""Small helpers shared by the subcommands: error reporting and plain-text tables."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["fail", "format_table"]


def fail(message: str, code: int = 2) -> int:
    print(f"equishard: error: {message}", file=sys.stderr)
    return code


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
