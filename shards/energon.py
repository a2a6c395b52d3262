"""``shards.energon``, as equishard 0.1 laid it out: the same names as :mod:`shards.write.energon`
(kept for code that imports them from here; new code imports that module)."""

from shards.write.energon import (
    ENERGON_DIR,
    equishard_cooker,
    group_sizes,
    has_energon_metadata,
    write_energon_metadata,
)

__all__ = [
    "ENERGON_DIR",
    "equishard_cooker",
    "group_sizes",
    "has_energon_metadata",
    "write_energon_metadata",
]
