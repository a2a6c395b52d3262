"""``wids-index.json``: the generation's shard list in the format of webdataset's ``wids``
(indexed, random-access reading: ``wids.ShardListDataset("GEN/wids-index.json")``)."""

from __future__ import annotations

import json
from pathlib import Path

from shards.publish import atomic_write_bytes

__all__ = ["WIDS_INDEX", "write_wids_index"]

WIDS_INDEX = "wids-index.json"


def write_wids_index(gen_dir: str | Path) -> Path:
    """Write the index next to ``manifest.json``: every shard in stream order, its sample count
    and size; URLs are relative, so wids resolves them against the index's own location."""
    gen_dir = Path(gen_dir)
    manifest = json.loads((gen_dir / "manifest.json").read_text())
    index = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": manifest["generation"],
        "shardlist": [
            {"url": shard["file"], "nsamples": shard["samples"], "filesize": shard["bytes"]}
            for stream in manifest["streams"]
            for shard in stream["shards"]
        ],
    }
    path = gen_dir / WIDS_INDEX
    atomic_write_bytes(path, json.dumps(index, indent=1).encode())
    return path
