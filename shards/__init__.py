"""shards: balanced, node-aware WebDataset shard generations and the loader that streams them.

Every name is imported on first use (PEP 562): the writer's worker processes and the commands
that only write, verify or inspect shards start without torch, and a training process that only
streams shards (``GroupDataset``) loads neither the writer nor the prep pipeline.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and the docs site (griffe) read; no import at run time
    from shards.read.collate import Collator
    from shards.read.dataset import GroupDataset, RankInfo, merge_states
    from shards.read.media import decode_audio, decode_video
    from shards.read.reader import ShardError, read_group
    from shards.read.verify import VerifyResult, inspect_generation, verify_generation
    from shards.store.manifest import Manifest, ManifestError, load_manifest, open_generation
    from shards.write.writer import (
        WriteConfig,
        WriteError,
        WriteResult,
        parse_size,
        write_generation,
    )

_LAZY = {
    "Collator": "shards.read.collate",
    "GroupDataset": "shards.read.dataset",
    "RankInfo": "shards.read.dataset",
    "merge_states": "shards.read.dataset",
    "decode_audio": "shards.read.media",
    "decode_video": "shards.read.media",
    "Manifest": "shards.store.manifest",
    "ManifestError": "shards.store.manifest",
    "load_manifest": "shards.store.manifest",
    "open_generation": "shards.store.manifest",
    "ShardError": "shards.read.reader",
    "read_group": "shards.read.reader",
    "VerifyResult": "shards.read.verify",
    "inspect_generation": "shards.read.verify",
    "verify_generation": "shards.read.verify",
    "WriteConfig": "shards.write.writer",
    "WriteError": "shards.write.writer",
    "WriteResult": "shards.write.writer",
    "parse_size": "shards.write.writer",
    "write_generation": "shards.write.writer",
}

__all__ = [
    "Collator",
    "GroupDataset",
    "Manifest",
    "ManifestError",
    "RankInfo",
    "ShardError",
    "VerifyResult",
    "WriteConfig",
    "WriteError",
    "WriteResult",
    "decode_audio",
    "decode_video",
    "inspect_generation",
    "load_manifest",
    "merge_states",
    "open_generation",
    "parse_size",
    "read_group",
    "verify_generation",
    "write_generation",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shards' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
