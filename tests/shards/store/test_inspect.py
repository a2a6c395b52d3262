"""``equishard inspect``: each stream's line and the totals against the generation's files
read independently (the tars with Python's ``tarfile``, their sizes from the file system, each
record's step), not against the manifest the command reads."""

from __future__ import annotations

import json
import tarfile
from collections import defaultdict
from pathlib import Path

from equishard.cli import main
from shards.store.publish import read_current


def _from_files(gen: Path) -> dict[tuple[int, int], dict]:
    """(node, local_rank) -> shards, groups, samples and bytes of its stream directory."""
    out: dict = defaultdict(lambda: {"shards": 0, "steps": set(), "samples": 0, "bytes": 0})
    for tar in sorted(gen.glob("node-*/rank-*/*.tar")):
        node, rank = (int(p.split("-")[1]) for p in tar.parts[-3:-1])
        s = out[(node, rank)]
        s["shards"] += 1
        s["bytes"] += tar.stat().st_size
        with tarfile.open(tar) as tf:
            for member in tf.getmembers():
                if member.name.endswith(".json"):
                    record = json.loads(tf.extractfile(member).read())
                    s["samples"] += 1
                    s["steps"].add(record["step"])
    return out


def test_inspect_counts_what_the_files_hold(generation, capsys):
    gen = generation / read_current(generation)
    want = _from_files(gen)
    assert main(["inspect", str(generation), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert len(info["streams"]) == len(want) and len(want) > 1
    for s in info["streams"]:
        w = want[(s["node"], s["local_rank"])]
        got = (s["shards"], s["groups"], s["samples"], s["bytes"])
        assert got == (w["shards"], len(w["steps"]), w["samples"], w["bytes"]), s
    t = info["totals"]
    assert t["samples"] == sum(w["samples"] for w in want.values())
    assert t["shards"] == sum(w["shards"] for w in want.values())
    assert t["groups"] == sum(len(w["steps"]) for w in want.values())
    # the table a person reads: one line per stream with the same numbers, in its columns
    assert main(["inspect", str(generation)]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    for s in info["streams"]:
        w = want[(s["node"], s["local_rank"])]
        row = [f"{s['node']}/{s['local_rank']}", str(s["rank"]), str(w["shards"])]
        row += [str(len(w["steps"])), str(w["samples"]), f"{w['bytes'] / 2**20:.1f}"]
        assert row in lines, row
