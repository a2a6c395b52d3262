"""The generation contract: ``GenerationManifest`` both writes and reads ``manifest.json``.

Anchored to the writer's real output: a generation written by ``equishard write`` reads back
through the contract and writes out again byte for byte, so no field is written by a second
hand (the writer built the manifest as a 40-line dict literal and ``load_manifest`` parsed it
back by separate code). Round trips of synthetic manifests and every required field missing
are checked too.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equishard.contracts.generation import (
    MANIFEST,
    WRITER_KEYS,
    GenerationManifest,
    Group,
    Layout,
    ManifestError,
    Shard,
    Stream,
)
from tests.shards.conftest import gen_inputs, generation  # noqa: F401  (fixtures)

DIGEST = "ab" * 32


def test_a_written_manifest_reads_and_writes_back_byte_for_byte(generation):  # noqa: F811
    (path,) = generation.glob(f"*/{MANIFEST}")
    text = path.read_text()
    doc = GenerationManifest.from_json(json.loads(text), path)
    assert json.dumps(doc.to_json(), indent=1) == text
    assert set(json.loads(text)) == WRITER_KEYS  # the writer writes exactly its own keys
    assert doc.totals == json.loads(text)["totals"]
    assert doc.layout.dp == len(doc.streams)


def _manifest(nodes: int, per: int, steps: int, samples: list[int]) -> GenerationManifest:
    streams = []
    for rank in range(nodes * per):
        groups, offset = [], 0
        for step in range(steps):
            n = samples[(rank * steps + step) % len(samples)]
            groups.append(Group(step=step, samples=n, offset=offset, length=512 * (n + 1)))
            offset += 512 * (n + 1)
        shard = Shard(
            file=f"node-{rank // per}/rank-{rank % per}/shard-000000.tar",
            bytes=offset,
            sha256=DIGEST,
            samples=sum(g.samples for g in groups),
            groups=tuple(groups),
        )
        streams.append(Stream(node=rank // per, local_rank=rank % per, rank=rank, shards=(shard,)))
    return GenerationManifest(
        generation="gen-1",
        parent=None,
        layout=Layout(nodes=nodes, gpus_per_node=per, steps=steps),
        streams=tuple(streams),
        files={"cost.parquet": (10, DIGEST)},
        extra={"nightly": {"key": "k"}},
    )


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 5),
    st.lists(st.integers(0, 9), min_size=1, max_size=6),
)
def test_any_manifest_round_trips(nodes, per, steps, samples):
    doc = _manifest(nodes, per, steps, samples)
    raw = json.loads(json.dumps(doc.to_json()))
    assert GenerationManifest.from_json(raw, "m.json") == doc


@pytest.mark.parametrize("key", ["format_version", "generation", "layout", "streams", "totals"])
def test_a_required_field_missing_is_refused_naming_it(key):
    raw = _manifest(1, 2, 2, [1, 2]).to_json()
    del raw[key]
    with pytest.raises(ManifestError, match=rf"m\.json: missing field '{key}'"):
        GenerationManifest.from_json(raw, "m.json")


@pytest.mark.parametrize("key", sorted(WRITER_KEYS))
def test_extra_keys_never_replace_the_writers_own(key):
    doc = _manifest(1, 1, 1, [1])
    bad = GenerationManifest(
        generation=doc.generation,
        parent=None,
        layout=doc.layout,
        streams=doc.streams,
        extra={key: 1},
    )
    with pytest.raises(ValueError, match="replace the writer's own keys"):
        bad.to_json()


def test_a_member_path_that_leaves_the_generation_is_refused_without_a_file_system():
    raw = _manifest(1, 1, 1, [1]).to_json()
    raw["streams"][0]["shards"][0]["file"] = "../elsewhere.tar"
    with pytest.raises(ManifestError, match="leaves the generation directory"):
        GenerationManifest.from_json(raw, "m.json")
    raw = _manifest(1, 1, 1, [1]).to_json()
    raw["files"] = {"manifest.json": {"bytes": 1, "sha256": DIGEST}}
    with pytest.raises(ManifestError, match="the manifest itself is not a carried file"):
        GenerationManifest.from_json(raw, "m.json")
