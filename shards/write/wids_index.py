"""``wids-index.json``: the generation's shard list in the format of webdataset's ``wids``
(indexed, random-access reading: ``wids.ShardListDataset("GEN/wids-index.json")``)."""

from __future__ import annotations

import json
from pathlib import Path

from equishard.contracts.generation_names import WIDS_INDEX
from shards.store.manifest import Manifest
from shards.store.publish import atomic_write_bytes

__all__ = ["WIDS_INDEX", "write_wids_index"]


def write_wids_index(m: Manifest) -> Path:
    """Write the index next to the manifest of ``m`` (a loaded, checked local generation): every
    shard in stream order, its sample count and size; URLs are relative, so wids resolves them
    against the index's own location."""
    index = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": m.generation,
        "shardlist": [
            {"url": sh.file, "nsamples": sh.samples, "filesize": sh.bytes}
            for st in m.streams
            for sh in st.shards
        ],
    }
    path = Path(m.path) / WIDS_INDEX
    atomic_write_bytes(path, json.dumps(index, indent=1).encode())
    return path
