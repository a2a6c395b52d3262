"""Errors of writing a generation (reading has ``ManifestError`` and ``ShardError``)."""

from __future__ import annotations

from equishard.common.errors import EquishardError

__all__ = ["WriteError"]


class WriteError(EquishardError, RuntimeError):
    """The generation cannot be written (a sample no longer reads, another writer is active...)."""
