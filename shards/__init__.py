"""shards: balanced, node-aware WebDataset shard generations and the loader that streams them."""

from shards.collate import Collator
from shards.dataset import GroupDataset, RankInfo, merge_states, open_generation
from shards.manifest import Manifest, ManifestError, load_manifest
from shards.reader import ShardError, read_group
from shards.verify import VerifyResult, inspect_generation, verify_generation
from shards.writer import WriteConfig, WriteError, WriteResult, parse_size, write_generation

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
