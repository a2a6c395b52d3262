"""The local cache of remote reads keys every byte range by everything that tells content apart:
the shard's digest, the offset and the length. Two shards (or two ranges) that differ in one of
these never serve each other's bytes, through one cache directory shared by several readers (as
ranks and DataLoader workers share it). The reference is the store itself: each read must equal
the bytes fetched straight from it.

Planted bugs these catch: a range cache keyed without the shard's digest (one shard's bytes
served for another at the same offset), or without the length (a shorter read's bytes returned
for a longer one)."""

from __future__ import annotations

import hashlib
import uuid

import fsspec
import pytest

from shards.store.storage import GenerationFiles


@pytest.fixture
def store():
    """Two shards of the same size and different bytes in an in-memory fsspec store."""
    fs = fsspec.filesystem("memory")
    root = f"/cache-keys-{uuid.uuid4().hex}"
    blobs = {"a.tar": bytes(range(256)) * 4, "b.tar": bytes(reversed(range(256))) * 4}
    for name, data in blobs.items():
        fs.pipe(f"{root}/gen/{name}", data)
    yield f"memory://{root.lstrip('/')}/gen", blobs
    fs.rm(root, recursive=True)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "reads",
    [
        # (shard, offset, length) read one after another through one cache
        [("a.tar", 0, 64), ("b.tar", 0, 64)],  # differ in the digest only
        [("a.tar", 0, 64), ("a.tar", 64, 64)],  # in the offset only
        [("a.tar", 100, 16), ("a.tar", 100, 64)],  # in the length only (shorter first)
        [("a.tar", 100, 64), ("a.tar", 100, 16)],  # (longer first)
        [("b.tar", 512, 256), ("a.tar", 512, 256), ("b.tar", 512, 256)],
    ],
)
def test_every_field_that_tells_content_apart_keys_the_cache(store, tmp_path, reads):
    url, blobs = store
    for reader in range(2):  # a second reader finds the first one's cache files
        files = GenerationFiles(url, cache_dir=tmp_path)
        for name, offset, length in reads:
            got = files.read_range(name, offset, length, _digest(blobs[name]))
            assert got == blobs[name][offset : offset + length], (reader, name, offset, length)


def test_a_kept_whole_shard_serves_only_its_own_ranges(store, tmp_path):
    url, blobs = store
    files = GenerationFiles(url, cache_dir=tmp_path)
    assert files.sha256("a.tar", expected=_digest(blobs["a.tar"])) == _digest(blobs["a.tar"])
    assert (tmp_path / f"{_digest(blobs['a.tar'])}.tar").read_bytes() == blobs["a.tar"]
    assert files.read_range("b.tar", 10, 20, _digest(blobs["b.tar"])) == blobs["b.tar"][10:30]
    assert files.read_range("a.tar", 10, 20, _digest(blobs["a.tar"])) == blobs["a.tar"][10:30]
    # both kept whole: each shard's ranges still come from its own copy
    assert files.sha256("b.tar", expected=_digest(blobs["b.tar"])) == _digest(blobs["b.tar"])
    for name in ("a.tar", "b.tar", "a.tar"):
        got = files.read_range(name, 40, 30, _digest(blobs[name]))
        assert got == blobs[name][40:70], name
