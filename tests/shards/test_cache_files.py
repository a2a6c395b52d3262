"""A cache directory others can write never redirects a write or a read (shards/cache_files.py).

The loader wrote through predictable temp names (``.<sha>.tar.tmp-<pid>``,
``<sha>/.<off>-<len>.tmp-<pid>``) with calls that follow symlinks: whoever could write the
shared cache directory could make the training job overwrite any file it can write, and a
``<cache>/<sha>`` that was a symlink to a directory had range files written there. Each test
plants what such a neighbour would and checks that the victim file or directory is untouched
and that the reads still equal the store's bytes."""

from __future__ import annotations

import hashlib
import os
import stat
import uuid

import fsspec
import pytest

from shards.cache_files import CacheDir
from shards.storage import GenerationFiles

DATA = bytes(range(256)) * 16
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def url():
    fs = fsspec.filesystem("memory")
    root = f"/cache-files-{uuid.uuid4().hex}"
    fs.pipe(f"{root}/gen/a.tar", DATA)
    yield f"memory://{root.lstrip('/')}/gen"
    fs.rm(root, recursive=True)


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim.txt"
    v.write_text("precious")
    return v


def _pids_ahead(n: int = 64) -> range:
    """The pids the next processes (and this one) may get: a neighbour plants each."""
    return range(max(os.getpid() - 4, 1), os.getpid() + n)


def test_predictable_temp_names_planted_as_symlinks_are_never_written_through(
    url, tmp_path, victim
):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / SHA).mkdir()
    for pid in _pids_ahead():
        (cache / f".{SHA}.tar.tmp-{pid}").symlink_to(victim)
        (cache / SHA / f".0-64.tmp-{pid}").symlink_to(victim)
    files = GenerationFiles(url, cache_dir=cache)
    assert files.read_range("a.tar", 0, 64, SHA) == DATA[:64]
    assert files.sha256("a.tar", expected=SHA, size=len(DATA)) == SHA
    assert files.read_range("a.tar", 64, 64, SHA) == DATA[64:128]
    assert victim.read_text() == "precious"
    # and the cache still works: the whole shard and a range landed as regular files
    assert stat.S_ISREG(os.lstat(cache / f"{SHA}.tar").st_mode)
    assert stat.S_ISREG(os.lstat(cache / SHA / "0-64").st_mode)


def test_a_digest_subdirectory_that_is_a_symlink_is_replaced_not_followed(url, tmp_path):
    cache, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    cache.mkdir()
    elsewhere.mkdir()
    (cache / SHA).symlink_to(elsewhere, target_is_directory=True)
    files = GenerationFiles(url, cache_dir=cache)
    assert files.read_range("a.tar", 0, 64, SHA) == DATA[:64]
    assert list(elsewhere.iterdir()) == []  # nothing written there
    assert (cache / SHA).is_dir() and not (cache / SHA).is_symlink()
    assert (cache / SHA / "0-64").is_file()


@pytest.mark.parametrize("entry", ["whole", "range"])
def test_a_cache_entry_that_is_a_symlink_is_never_read_through(url, tmp_path, entry):
    """A planted link to a file holding the right bytes (or a huge one) is not read: it is
    removed, and the bytes come from the store."""
    cache = tmp_path / "cache"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(
        DATA if entry == "whole" else DATA[:64] + hashlib.sha256(DATA[:64]).digest()
    )
    cache.mkdir()
    (cache / SHA).mkdir()
    name = cache / (f"{SHA}.tar" if entry == "whole" else f"{SHA}/0-64")
    name.symlink_to(outside)
    files = GenerationFiles(url, cache_dir=cache)
    fetched = files.fs.cat_file
    calls = []
    files.fs.cat_file = lambda *a, **k: calls.append(a) or fetched(*a, **k)
    if entry == "whole":
        assert files.sha256("a.tar", expected=SHA, size=len(DATA)) == SHA
    else:
        assert files.read_range("a.tar", 0, 64, SHA) == DATA[:64]
        assert calls, "the range came from the planted link, not the store"
    assert not name.is_symlink()


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775, 0o755, 0o700])
def test_a_cache_dir_anyone_may_write_without_the_sticky_bit_is_refused(url, tmp_path, mode):
    cache = tmp_path / f"cache-{mode:o}"
    cache.mkdir()
    os.chmod(cache, mode)
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        with pytest.raises(ValueError, match=rf"cache-{mode:o}: anyone may write it .*sticky"):
            GenerationFiles(url, cache_dir=cache)
    else:
        files = GenerationFiles(url, cache_dir=cache)
        assert files.read_range("a.tar", 0, 64, SHA) == DATA[:64]


def test_the_loader_refuses_such_a_cache_dir_at_open(s3, generation, bucket, tmp_path):
    from shards.dataset import GroupDataset, RankInfo
    from shards.object_store import publish_generation

    gen = (generation / "CURRENT").read_text().strip()
    publish_generation(generation / gen, bucket, storage_options=s3["opts"])
    cache = tmp_path / "open-cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.raises(ValueError, match="sticky"):
        GroupDataset(
            bucket, RankInfo(rank=0, world_size=1), storage_options=s3["opts"], cache_dir=cache
        )


def test_cache_dir_entries_are_plain_names(tmp_path):
    c = CacheDir(tmp_path / "c")
    for bad in ("", ".", "..", "a/b", "a\x00b"):
        with pytest.raises(ValueError, match="cannot name a cache entry"):
            c.write(bad, b"x")
    c.write("ok", b"data", sub="s")
    with c.open_read("ok", "s") as f:
        assert f.read() == b"data"
    assert c.open_read("missing", "s") is None and c.open_read("ok", "nosub") is None
    # an unpublished entry leaves nothing behind
    with c.new_entry("never", "s") as (f, _publish):
        f.write(b"half")
    assert sorted(p.name for p in (tmp_path / "c" / "s").iterdir()) == ["ok"]


@pytest.mark.parametrize("writer", [False, True], ids=["no-writer", "held-open"])
def test_a_fifo_planted_as_an_entry_is_a_miss_not_a_hang(tmp_path, writer):
    """Without a writer a FIFO reads as empty; one a neighbour holds open would block the
    read forever: either way it is no regular file, so it is removed and a miss."""
    c = CacheDir(tmp_path / "c")
    fifo = tmp_path / "c" / "f"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR) if writer else None  # a writer that never writes
    try:
        assert c.open_read("f") is None and not fifo.exists()
    finally:
        if held is not None:
            os.close(held)
