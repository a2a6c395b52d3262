"""Every file name of a generation and of its root, and the checks on the names and digests a
manifest or ``CURRENT`` gives (a value from outside: it must never choose a path).

A generation root holds ``CURRENT`` (the newest complete generation's name), ``CURRENT.history``
and one directory per generation; a generation holds ``manifest.json``, the cost table and plan
it was written from (``cost.parquet``, ``plan.parquet``), its shards, optionally the wids index
and Energon's metadata (``.nv-meta/``, ``dataset.yaml`` written last, a ``.tar.idx`` beside each
shard).
"""

from __future__ import annotations

import re

from equishard.common.errors import EquishardError

__all__ = [
    "COST_FILE",
    "CURRENT",
    "ENERGON_DATASET_YAML",
    "ENERGON_DIR",
    "FORMAT_VERSION",
    "HISTORY",
    "MANIFEST",
    "PLAN_FILE",
    "WIDS_INDEX",
    "ManifestError",
    "check_digest",
    "check_generation_name",
    "check_member_path",
    "need_count",
    "need_field",
    "valid_generation_name",
]

FORMAT_VERSION = 1  # of manifest.json; a reader refuses any other
MANIFEST = "manifest.json"
CURRENT = "CURRENT"  # in the root: one line naming the newest complete generation
HISTORY = "CURRENT.history"  # in the root: one JSON line per move of CURRENT and night's start
COST_FILE = "cost.parquet"  # carried in every generation: the cost table it was written from
PLAN_FILE = "plan.parquet"  # carried in every generation: its plan
WIDS_INDEX = "wids-index.json"  # the wids reader's index (write --wids)
ENERGON_DIR = ".nv-meta"  # Megatron-Energon's metadata (write --energon)
ENERGON_DATASET_YAML = "dataset.yaml"  # inside ENERGON_DIR, written last


class ManifestError(EquishardError, ValueError):
    """A generation's manifest is missing, unreadable, or disagrees with its files."""


def valid_generation_name(name: str) -> bool:
    """One plain directory name: not empty, not hidden, no path separator or NUL, <= 255."""
    return bool(
        name
        and not name.startswith(".")
        and not {"/", "\\", "\x00"} & set(name)
        and len(name) <= 255
    )


def check_generation_name(name: str, where: str, field: str = "generation") -> str:
    """A generation id from a manifest or CURRENT: one plain directory name, never a path."""
    if not valid_generation_name(name):
        raise ManifestError(
            f"{where}: {field} {name[:80]!r} is not a generation name (one directory name, no "
            "path separators, not hidden)"
        )
    return name


_DIGEST = re.compile(r"[0-9a-f]{64}")


def check_digest(value: str, where: str) -> str:
    """A sha256 from a manifest, checked before it names a cache file: 64 lowercase hex."""
    if not (isinstance(value, str) and _DIGEST.fullmatch(value)):
        raise ManifestError(
            f"{where}: sha256 {str(value)[:80]!r} is not a sha256 digest (64 lowercase hex "
            "characters); the manifest is damaged or was not written by equishard"
        )
    return value


def check_member_path(name: str, where: str) -> str:
    """A file the manifest names inside its generation (a shard, a carried file): relative, no
    ``..``, ``.`` or empty part, no backslash or NUL. (Where the generation is a local
    directory, :func:`shards.store.manifest.load_manifest` also resolves symlinks.)"""
    parts = name.split("/")
    if not name or name.startswith("/") or {"", ".", ".."} & set(parts) or "\\" in name:
        raise ManifestError(f"{where}: shard path {name!r} leaves the generation directory")
    if "\x00" in name:
        raise ManifestError(f"{where}: shard path {name!r} leaves the generation directory")
    return name


def need_field(d: dict, key: str, typ, where: str):
    """``d[key]``, which must be there and of type ``typ`` (a bool is no int)."""
    if key not in d:
        raise ManifestError(f"{where}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, typ) or (isinstance(v, bool) and typ is not bool):
        raise ManifestError(
            f"{where}: field {key!r} is {type(v).__name__}, expected {typ.__name__}"
        )
    return v


def need_count(d: dict, key: str, where: str) -> int:
    """``d[key]``, a whole number >= 0."""
    v = need_field(d, key, int, where)
    if v < 0:
        raise ManifestError(f"{where}: field {key!r} is {v}, it cannot be negative")
    return v
