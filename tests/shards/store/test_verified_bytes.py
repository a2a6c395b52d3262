"""The bytes used are the bytes verified: a shard is checked against its manifest's sha256 once
and its groups are read again later, one range at a time; a shard that changes in between
(rewritten in place, a cache file replaced, a parent generation modified during a night) must
never hand over bytes nobody checked.

The planted bug is the old behaviour: a shard once verified was trusted by name (the loader's
``_verified`` set, the store's kept whole shard, the writer's ``parent_verified`` list), so a
changed image went into training or into the next generation under a valid manifest.
"""

from __future__ import annotations

import contextlib
import tarfile
from pathlib import Path

import pytest

from shards.errors import WriteError
from shards.format.range_digests import RangeDigests, hash_file
from shards.nightly.rebalance import run_rebalance
from shards.read.dataset import GroupDataset, RankInfo
from shards.read.reader import ShardError
from shards.store.manifest import load_manifest
from shards.store.publish import read_current
from tests.shards.night_helpers import _night


def _image_byte(path: Path, offset: int, length: int) -> int | None:
    """A byte in the middle of an image member's data inside ``[offset, offset + length)``."""
    with tarfile.open(path) as tf:
        for m in tf:
            inside = offset <= m.offset_data and m.offset_data + m.size <= offset + length
            if inside and m.size and not m.name.endswith(".json"):
                return m.offset_data + m.size // 2
    return None


def _flip(path: Path, at: int) -> None:
    """Change one byte in place (same size, same name: only the content differs)."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x5A]))


def _two_groups_with_an_image(gen: Path):
    """(stream, shard, first group, a later group of the same shard, its image byte)."""
    m = load_manifest(gen)
    for st in m.streams:
        for sh in st.shards:
            for later in sh.groups[1:]:
                at = _image_byte(gen / sh.file, later.offset, later.length)
                if at is not None:
                    return m, st, sh, sh.groups[0], later, at
    raise AssertionError("the test generation has no shard with an image past its first group")


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_loader_refuses_a_group_changed_after_its_shard_was_verified(gen_copy, on_error):
    gen = gen_copy / read_current(gen_copy)
    m, st, sh, first, later, at = _two_groups_with_an_image(gen)
    info = RankInfo(rank=st.rank, world_size=m.dp)  # this rank reads its plan rank's steps
    ds = GroupDataset(gen_copy, info, shuffle=False, verify=True, on_error=on_error)
    got = {}
    expect = (
        pytest.raises(ShardError, match="changed after it was verified")
        if on_error == "raise"
        else contextlib.nullcontext()
    )
    with expect:
        for batch in ds:
            got[batch["step"]] = batch
            if batch["step"] == first.step:  # the shard was hashed whole for this group
                _flip(gen / sh.file, at)
    if on_error == "skip":
        bad = got[later.step]
        assert bad["samples"] == [] and len(bad["skipped"]) == later.samples
        assert "changed after it was verified" in bad["skipped"][0]


def test_a_kept_whole_shard_replaced_after_its_check_is_fetched_again(
    s3, generation, bucket, tmp_path
):
    """Over S3 with a cache: the whole shard kept on disk when it matched is replaced by
    other bytes of the same size while the job runs; the groups read after that come from the
    store, equal to a loader that never cached (bug: read from the replaced file unchecked)."""
    from tests.shards.store.test_store_trust import _batches, _publish

    name = _publish(s3, generation, bucket)
    m, st, sh, first, _, at = _two_groups_with_an_image(generation / name)
    info = RankInfo(rank=st.rank, world_size=m.dp)
    want = _batches(GroupDataset(bucket, info, storage_options=s3["opts"], shuffle=False))
    cache = tmp_path / "cache"
    ds = GroupDataset(
        bucket, info, storage_options=s3["opts"], cache_dir=cache, verify=True, shuffle=False
    )
    got = []
    for batch in ds:
        got.append([(s.key, s.meta, s.images) for s in batch["samples"]])
        if batch["step"] == first.step:
            kept = cache / f"{sh.sha256}.tar"
            assert kept.exists()
            _flip(kept, at)
    assert got == want


def test_a_parent_shard_changed_after_its_check_never_reaches_the_next_generation(
    root, monkeypatch
):
    """A night reuses the parent's groups: its shards are hashed once before any stream is
    written; one changes right after that check (another job, a disk fault). The night fails
    naming the shard and CURRENT stays (bug: the changed bytes were copied into the new
    generation, whose manifest then vouched for them)."""
    import shards.write.write_jobs as write_jobs

    real = write_jobs.verify_parent_shards
    changed = []

    def check_then_change(sources):
        real(sources)
        for src in sources:
            path = Path(src["gen_dir"]) / src["file"]
            at = _image_byte(path, src["group"][2], src["group"][3])
            if at is not None:
                _flip(path, at)
                changed.append(path)
                return

    monkeypatch.setattr(write_jobs, "verify_parent_shards", check_then_change)
    before = read_current(root)
    with pytest.raises(WriteError, match="changed after it was verified") as err:
        run_rebalance(_night(root, 2))
    assert changed and str(changed[0]) in str(err.value)
    assert read_current(root) == before


@pytest.mark.parametrize("seed", range(40))
def test_range_digests_equal_hashing_each_range_alone(seed, tmp_path):
    """Reference: hashlib over each slice. Ranges of any size, touching, overlapping, empty,
    past the end; blocks of any size (the file read in 8 MiB blocks, the stream in small)."""
    import hashlib

    import numpy as np

    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, int(rng.integers(0, 5000)), dtype=np.uint8).tobytes()
    ranges = [
        (int(rng.integers(0, len(data) + 10)), int(rng.integers(0, 800)))
        for _ in range(int(rng.integers(0, 12)))
    ]
    want = {(o, n): hashlib.sha256(data[o : o + n]).digest() for o, n in ranges}
    h = RangeDigests(ranges)
    pos = 0
    while pos < len(data):
        step = int(rng.integers(1, 700))
        h.update(data[pos : pos + step])
        pos += step
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    assert h.ranges() == want
    (tmp_path / "f").write_bytes(data)
    assert hash_file(tmp_path / "f", ranges) == (hashlib.sha256(data).hexdigest(), want)


@pytest.mark.parametrize("size", [0, 63, 64, 200, 999])
def test_hashing_reads_blocks_and_stops_one_byte_past_the_recorded_size(size, monkeypatch):
    """A shard longer than its manifest's size (replaced, or a store streaming without end) is
    read in blocks, one byte past that size at most, never whole: reference, a stream that
    records what each read asked for. Planted bug this catches: a read asking for everything
    up to the size at once (``max`` for ``min``: a 10 GB size read into memory in one call)."""
    import io

    from shards.format import range_digests

    monkeypatch.setattr(range_digests, "BLOCK", 64)

    class Recorded(io.BytesIO):
        def __init__(self, data: bytes) -> None:
            super().__init__(data)
            self.asked: list[int] = []

        def read(self, n=-1):
            self.asked.append(n)
            return super().read(n)

    f = Recorded(bytes(1000))
    with pytest.raises(OSError, match=f"more than the {size} bytes recorded"):
        range_digests._hash_stream(f, RangeDigests(), "shard.tar", size)
    assert all(0 < n <= 64 for n in f.asked), f.asked
    assert f.tell() == size + 1


def test_verify_reads_each_group_from_the_bytes_it_hashed(gen_copy, monkeypatch):
    """``equishard verify`` hashes a shard and then reads its groups (deep): a shard that
    changes in between is reported, not counted as good (bug: the groups read after the hash
    were not compared with it, so a changed image passed verification)."""
    from shards.read.verify import verify_generation
    from shards.store.storage import GenerationFiles

    gen = gen_copy / read_current(gen_copy)
    _, _, sh, _, later, at = _two_groups_with_an_image(gen)
    real = GenerationFiles.sha256

    def hash_then_change(self, name, *args, **kw):
        digest = real(self, name, *args, **kw)
        if name == sh.file:
            _flip(gen / sh.file, at)
        return digest

    monkeypatch.setattr(GenerationFiles, "sha256", hash_then_change)
    res = verify_generation(gen_copy)
    assert not res.ok
    assert any(sh.file in p and "changed after it was verified" in p for p in res.problems)
    assert res.samples == res.expected - later.samples


def test_publish_refuses_a_local_shard_damaged_since_it_was_written(s3, gen_copy, bucket):
    """A local generation whose shard lost a byte at rest (same size) is not uploaded: the
    store's CURRENT would otherwise name a generation that fails its own manifest (bug: only
    sizes were compared before the upload)."""
    from shards.store.object_store import publish_generation, read_remote_current

    gen = gen_copy / read_current(gen_copy)
    _, _, sh, _, _, at = _two_groups_with_an_image(gen)
    _flip(gen / sh.file, at)
    with pytest.raises(WriteError, match="the local generation is damaged") as err:
        publish_generation(gen, bucket, storage_options=s3["opts"])
    assert sh.file in str(err.value)
    assert read_remote_current(bucket, storage_options=s3["opts"]) is None


def test_fifos_put_in_the_cache_never_block_the_loader(s3, generation, bucket, tmp_path):
    """A cache directory is read back on the next epoch: a kept whole shard or a cached range
    replaced by a FIFO (opening one waits for a writer) is removed and read from the store
    again (bug: the loader blocked forever on the cache file). Reference: a loader without a
    cache."""
    import os
    import threading

    from tests.shards.store.test_store_trust import _batches, _publish

    _publish(s3, generation, bucket)
    info = RankInfo(rank=0, world_size=2)
    want = _batches(GroupDataset(bucket, info, storage_options=s3["opts"], shuffle=False))
    fifos = []
    for verify in (False, True):
        cache = tmp_path / f"cache-{verify}"
        opts = dict(storage_options=s3["opts"], cache_dir=cache, shuffle=False, verify=verify)
        assert _batches(GroupDataset(bucket, info, **opts)) == want  # fills the cache
        kept = sorted(cache.glob("*.tar")) if verify else sorted(cache.rglob("*-*"))
        assert kept
        for path in kept:
            path.unlink()
            os.mkfifo(path)
            fifos.append(path)
        got = []
        reader = threading.Thread(
            target=lambda o=opts, g=got: g.append(_batches(GroupDataset(bucket, info, **o))),
            daemon=True,
        )
        reader.start()
        reader.join(60)
        try:
            assert not reader.is_alive(), "the loader blocked on a FIFO in its cache"
        finally:  # a reader stuck opening a FIFO is let go (planted bug: fail, never hang)
            for path in fifos:
                with contextlib.suppress(OSError):
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        assert got == [want]
