"""Small helpers shared by the subcommands: error reporting and plain-text tables."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "add_engine_args",
    "add_json_arg",
    "add_store_args",
    "check_output",
    "check_output_dir",
    "fail",
    "format_table",
    "os_failure",
    "print_json",
]


def fail(message: str, code: int = 2) -> int:
    print(f"equishard: error: {message}", file=sys.stderr)
    return code


def os_failure(exc: BaseException, doing: str) -> str:
    """One line for a failure while working: an ``OSError`` that names no file (a full disk
    during a write: ``[Errno 28] No space left on device``) gets what was being done and
    where; anything else its own text (``describe``)."""
    from equishard.common.errors import describe

    if isinstance(exc, OSError) and not exc.filename:
        return f"{exc.strerror or describe(exc)} while {doing}"
    return describe(exc)


def add_json_arg(p) -> None:
    """``--json``: one JSON line on stdout instead of the readable summary (see print_json)."""
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON line instead of the summary: command, status, counts "
        "(in / out / rejected) and what the command made or checked",
    )


def print_json(command: str, *, ok: bool, n_in: int, n_out: int, rejected: int, **fields) -> None:
    """The machine-readable summary every artifact command prints with ``--json``: one line,
    the same shape everywhere: ``{"command", "status": "ok" | "failed", "counts": {"in",
    "out", "rejected"}, ...}``, the command's own fields after those (paths, ids, problems).
    ``in`` is what the command read, ``out`` what it wrote or found intact, ``rejected`` what it
    turned away or found broken."""
    import json

    counts = {"in": int(n_in), "out": int(n_out), "rejected": int(rejected)}
    status = "ok" if ok else "failed"
    print(json.dumps({"command": command, "status": status, "counts": counts, **fields}))


def add_engine_args(p, what: str) -> None:
    """``--engine``, ``--ray-address`` and ``--task-timeout`` for a subcommand that can run on
    Ray (a configuration that declares them on its fields gets them from ``add_options``)."""
    from equishard.common.options import add_option
    from equishard.common.ray_engine import (
        DEFAULT_TASK_TIMEOUT,
        ENGINE_OPTION,
        RAY_ADDRESS_OPTION,
        TASK_TIMEOUT_OPTION,
    )

    add_option(p, "engine", "str", ENGINE_OPTION["option"], "local", what=what)
    add_option(p, "ray_address", "str | None", RAY_ADDRESS_OPTION["option"], None)
    add_option(p, "task_timeout", "float", TASK_TIMEOUT_OPTION["option"], DEFAULT_TASK_TIMEOUT)


def add_store_args(p) -> None:
    """``--store-timeout`` and ``--store-retries`` for a subcommand that may read or write an
    object store: every request is bounded (set as ``$EQUISHARD_STORE_TIMEOUT`` and
    ``$EQUISHARD_STORE_RETRIES``, so worker processes and training ranks started by the command
    inherit them)."""
    p.add_argument(
        "--store-timeout",
        type=float,
        metavar="S",
        help="object stores: seconds a request may wait to connect or for data before it is "
        "retried (default: $EQUISHARD_STORE_TIMEOUT, else 30)",
    )
    p.add_argument(
        "--store-retries",
        type=int,
        metavar="N",
        help="object stores: attempts per request before the command fails naming the object "
        "(default: $EQUISHARD_STORE_RETRIES, else 3); an endpoint that never answers fails "
        "after about S x N seconds",
    )
    p.set_defaults(apply_store=_apply_store_args)


def _apply_store_args(args) -> None:
    from shards.store.store_limits import (
        MAX_RETRIES,
        MAX_TIMEOUT,
        RETRIES_ENV,
        TIMEOUT_ENV,
        store_limits,
    )

    if args.store_timeout is not None:
        if not 0 < args.store_timeout <= MAX_TIMEOUT:
            raise ValueError(
                f"--store-timeout must be seconds in (0, {MAX_TIMEOUT:g}], got {args.store_timeout}"
            )
        os.environ[TIMEOUT_ENV] = repr(args.store_timeout)
    if args.store_retries is not None:
        if not 1 <= args.store_retries <= MAX_RETRIES:
            raise ValueError(
                f"--store-retries must be a whole number in 1..{MAX_RETRIES}, got "
                f"{args.store_retries}"
            )
        os.environ[RETRIES_ENV] = str(args.store_retries)
    store_limits()  # a bad value in the environment is an error before any work


def _inside_generation(p: Path) -> Path | None:
    """The published generation directory ``p`` is in (or is), if any."""
    from equishard.contracts.generation_names import MANIFEST, valid_generation_name

    for d in (p.resolve(), *p.resolve().parents):
        if valid_generation_name(d.name) and (d / MANIFEST).is_file():
            return d
    return None


def check_output_dir(path: str | os.PathLike) -> None:
    """Make sure directory ``path`` exists (created if needed) and is writable, and is not in
    a published generation (it never changes: its files are checksummed); ``ValueError``
    naming it otherwise, before any work is done."""
    p = Path(path)
    gen = _inside_generation(p)
    if gen is not None:
        raise ValueError(
            f"{p} is inside the published generation {gen}, which never changes; write "
            "elsewhere (e.g. beside the generation root)"
        )
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
