"""The one base class of every equishard error, and the one way an exception becomes a message.

Every error equishard raises on purpose derives from :class:`EquishardError`, so a caller can
catch them all in one ``except``; each also keeps the built-in class it always had
(``ManifestError`` is still a ``ValueError``, ``WriteError`` a ``RuntimeError``), so code that
caught those keeps working.
"""

from __future__ import annotations

__all__ = ["EquishardError", "describe"]


class EquishardError(Exception):
    """Base class of every error equishard raises on purpose."""


def describe(exc: BaseException) -> str:
    """An exception as a message that is never empty: its text, else its type (a MemoryError or
    a bare exception says nothing by itself); both where the text does not name the type."""
    text = str(exc).strip()
    name = type(exc).__name__
    if not text:
        return name
    ours = isinstance(exc, EquishardError) or type(exc).__module__.split(".")[0] in _OURS
    return text if ours or isinstance(exc, ValueError) else f"{name}: {text}"


_OURS = {"dataprep", "shards", "balancing", "trainer_adapter", "equishard"}
