"""Errors of writing a generation (reading has ``ManifestError`` and ``ShardError``)."""

from __future__ import annotations

__all__ = ["WriteError"]


class WriteError(RuntimeError):
    """The generation cannot be written (a sample no longer reads, another writer is active...)."""
