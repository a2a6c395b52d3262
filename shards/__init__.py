"""shards: balanced, node-aware WebDataset shard generations and the loader that streams them.

The loader's names (``GroupDataset``, ``Collator``, ...) need torch and are imported on first
use (PEP 562), so the writer's worker processes and the CLI commands that only write, verify or
inspect shards start without importing torch.
"""

from importlib import import_module

from shards.manifest import Manifest, ManifestError, load_manifest, open_generation
from shards.reader import ShardError, read_group
from shards.verify import VerifyResult, inspect_generation, verify_generation
from shards.writer import WriteConfig, WriteError, WriteResult, parse_size, write_generation

_LAZY = {
    "Collator": "shards.collate",
    "GroupDataset": "shards.dataset",
    "RankInfo": "shards.dataset",
    "merge_states": "shards.dataset",
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
