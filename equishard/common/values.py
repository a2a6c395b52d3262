"""Checks on single values from outside: what Python's ``json`` gives (JSON documents,
manifests, reports, metadata) and what a user passes to a configuration dataclass, checked for
the type a reader takes, so that ``True`` is not a count of 1, ``"4"`` not a rank count, ``1.5``
not a seed, and NaN (which compares false with every bound, so ``nan < 1`` lets it through) not
a number of workers.

The ``check_*`` functions raise a ``ValueError`` naming the setting (as the user spelled it: a
field or a ``--flag``), the value given and what is allowed; configurations call them from their
``__post_init__``.
"""

from __future__ import annotations

import math
import numbers
import re

__all__ = [
    "check_choice",
    "check_count",
    "check_flag",
    "check_real",
    "check_task_timeout",
    "is_count",
    "is_number",
    "parse_size",
]


def is_count(value, lo: int = 0, hi: int = 1 << 63) -> bool:
    """Whether ``value`` is a whole number (an ``int``, not a ``bool``) in ``[lo, hi)``."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value < hi


def is_number(value) -> bool:
    """Whether ``value`` is an ``int`` or ``float`` (not a ``bool``)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_count(name: str, value, lo: int = 0, hi: int = (1 << 63) - 1, *, none: bool = False):
    """``value`` is a whole number (an int or numpy integer, not a bool) in ``[lo, hi]``, or None
    where ``none``; returned as a Python int (or None)."""
    if value is None and none:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and lo <= value <= hi:
        return int(value)
    bound = f">= {lo}" if hi >= (1 << 63) - 1 else f"in {lo}..{hi}"
    kind = "a whole number" + (" or None" if none else "")
    raise ValueError(f"{name} must be {kind} {bound}, got {value!r}")


def check_real(
    name: str,
    value,
    lo: float = 0.0,
    hi: float = math.inf,
    *,
    lo_open: bool = False,
    hi_open: bool = True,
    none: bool = False,
):
    """``value`` is a real number (not a bool, not NaN) within the bounds (``hi`` is open by
    default, so infinity is refused unless ``hi_open=False`` and ``hi`` is inf); returned as a
    float (or None where ``none``)."""
    if value is None and none:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
    if ok:
        above = value > lo if lo_open else value >= lo
        below = value < hi if hi_open else value <= hi
        if above and below:
            return float(value)
    if hi == math.inf:
        bound = f"{'>' if lo_open else '>='} {lo:g}" if lo > -math.inf else ""
    else:
        bound = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    raise ValueError(f"{name} must be a finite number{' ' + bound if bound else ''}, got {value!r}")


def check_flag(name: str, value) -> bool:
    """``value`` is True or False (``"no"``, ``2`` or None are not read as a switch)."""
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be True or False, got {value!r}")


def check_choice(name: str, value, choices) -> str:
    """``value`` is one of ``choices`` (strings)."""
    if isinstance(value, str) and value in choices:
        return value
    raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


def check_task_timeout(value: float | None) -> None:
    """``--task-timeout``: seconds > 0 and finite, or None (no limit); ``ValueError`` otherwise
    (a negative one failed every task at once, NaN never timed out)."""
    if value is not None and not (is_number(value) and 0 < value < float("inf")):
        raise ValueError(
            f"--task-timeout must be > 0 seconds (0 on the command line: no limit), got {value}"
        )


def parse_size(text: str) -> int:
    """'1GB', '512MB', '64k', '1000' -> bytes (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m or len(m.group(1)) > 20:  # more digits than any size: float('9' * 400) is inf
        raise ValueError(f"bad size {text!r}: write e.g. 1GB, 256MB or 1048576")
    return int(float(m.group(1)) * 1024 ** "_kmgt".index(m.group(2) or "_"))
