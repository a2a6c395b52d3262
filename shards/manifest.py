"""``shards.manifest``, as equishard 0.1 laid it out: the same names as :mod:`shards.store.manifest`
(kept for code that imports them from here; new code imports that module)."""

from shards.store.manifest import (
    FORMAT_VERSION,
    Group,
    Manifest,
    ManifestError,
    Shard,
    Stream,
    carried_bytes,
    check_digest,
    check_generation_name,
    checked_carried,
    load_manifest,
    open_generation,
)

__all__ = [
    "FORMAT_VERSION",
    "Group",
    "Manifest",
    "ManifestError",
    "Shard",
    "Stream",
    "carried_bytes",
    "check_digest",
    "check_generation_name",
    "checked_carried",
    "load_manifest",
    "open_generation",
]
