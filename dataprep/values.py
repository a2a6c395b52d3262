"""Checks on single values read from outside (JSON documents, manifests, reports, metadata):
what Python's ``json`` gives is checked for the type a reader takes, so that ``True`` is not a
count of 1, ``"4"`` not a rank count, and ``1.5`` not a seed.
"""

from __future__ import annotations

__all__ = ["check_task_timeout", "is_count", "is_number"]


def is_count(value, lo: int = 0, hi: int = 1 << 63) -> bool:
    """Whether ``value`` is a whole number (an ``int``, not a ``bool``) in ``[lo, hi)``."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value < hi


def check_task_timeout(value: float | None) -> None:
    """``--task-timeout``: seconds > 0 and finite, or None (no limit); ``ValueError`` otherwise
    (a negative one failed every task at once, NaN never timed out)."""
    if value is not None and not (is_number(value) and 0 < value < float("inf")):
        raise ValueError(
            f"--task-timeout must be > 0 seconds (0 on the command line: no limit), got {value}"
        )


def is_number(value) -> bool:
    """Whether ``value`` is an ``int`` or ``float`` (not a ``bool``)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
