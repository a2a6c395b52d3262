"""A cache directory others can write never redirects a write or a read (shards/store/cache_files.py).

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

from shards.store.cache_files import CacheDir
from shards.store.storage import GenerationFiles

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
    from shards.read.dataset import GroupDataset, RankInfo
    from shards.store.object_store import publish_generation

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


def test_what_the_cache_creates_is_private_and_nested_paths_are_made(tmp_path):
    """The cache directory (its missing parents too) and a digest subdirectory are made
    rwx------, an entry rw------- (less the umask): other users read no cached shard."""
    umask = os.umask(0)
    os.umask(umask)
    c = CacheDir(tmp_path / "a" / "b" / "cache")
    c.write("e", b"data", sub="s")
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(tmp_path / "a" / "b" / "cache") == 0o700 & ~umask
    assert mode(tmp_path / "a" / "b" / "cache" / "s") == 0o700 & ~umask
    assert mode(tmp_path / "a" / "b" / "cache" / "s" / "e") == 0o600 & ~umask


def test_a_cache_dir_that_cannot_be_made_is_a_value_error_naming_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"cache_dir .*file/cache: cannot create it"):
        CacheDir(blocker / "cache")
    with pytest.raises(ValueError, match=r"file: cannot create it \(File exists\)"):
        CacheDir(blocker)


def test_reading_or_removing_never_creates_a_subdirectory(tmp_path):
    c = CacheDir(tmp_path / "c")
    assert c.open_read("x", "nosub") is None
    c.remove("x", "nosub")
    assert not (tmp_path / "c" / "nosub").exists()
    c.write("x", b"1", sub="s")
    c.remove("x", "s")
    assert not (tmp_path / "c" / "s" / "x").exists()
    # removing from an absent subdirectory touches nothing elsewhere (never the working dir)
    (tmp_path / "x").write_text("keep")
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        c.remove("x", "absent")
    finally:
        os.chdir(old)
    assert (tmp_path / "x").read_text() == "keep"


def test_a_file_planted_where_a_subdirectory_belongs_is_replaced(tmp_path):
    c = CacheDir(tmp_path / "c")
    (tmp_path / "c" / "s").write_text("planted")
    c.write("e", b"data", sub="s")
    with c.open_read("e", "s") as f:
        assert f.read() == b"data"
    assert (tmp_path / "c" / "s").is_dir()


def test_a_guessed_temp_name_is_never_written_through(tmp_path, monkeypatch, victim):
    """Were the random part of a temp name guessed (here: made fixed), O_EXCL|O_NOFOLLOW still
    refuses the link planted there: the write fails, the victim is untouched."""
    import shards.store.cache_files as cf

    monkeypatch.setattr(cf.secrets, "token_hex", lambda n: "guessed")
    c = CacheDir(tmp_path / "c")
    (tmp_path / "c" / ".e.guessed.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        c.write("e", b"evil")
    assert victim.read_text() == "precious" and c.open_read("e") is None


def test_a_subdirectory_that_cannot_be_made_is_named(tmp_path, monkeypatch):
    """Both tries to open the digest subdirectory fail (a neighbour removing it each time):
    FileNotFoundError naming the cache and the subdirectory."""
    c = CacheDir(tmp_path / "c")
    real = os.open

    def never(path, flags, *a, **k):
        if path == "s" and k.get("dir_fd") is not None:
            raise FileNotFoundError(path)
        return real(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", never)
    with pytest.raises(FileNotFoundError, match=r"c/s: could not be made"):
        c.write("e", b"x", sub="s")


def test_no_descriptor_is_left_open(tmp_path):
    """A hundred writes, reads and removals leave as many descriptors open as before (a
    directory opened twice in the retry loop leaked one per call)."""
    c = CacheDir(tmp_path / "c")
    before = len(os.listdir("/proc/self/fd"))
    for i in range(100):
        c.write(f"e{i}", b"x", sub=f"s{i % 3}")
        with c.open_read(f"e{i}", f"s{i % 3}") as f:
            f.read()
        c.remove(f"e{i}", f"s{i % 3}")
    assert len(os.listdir("/proc/self/fd")) == before


def test_an_entry_it_may_not_remove_is_a_miss(tmp_path, monkeypatch):
    """In a sticky cache directory a neighbour's planted link cannot be removed by us
    (PermissionError, simulated here: root may remove anything): a miss, never followed."""
    c = CacheDir(tmp_path / "c")
    (tmp_path / "c" / "e").symlink_to(tmp_path)

    def refused(*a, **k):
        raise PermissionError("Operation not permitted")

    monkeypatch.setattr(os, "unlink", refused)
    assert c.open_read("e") is None
    (tmp_path / "c" / "s").symlink_to(tmp_path, target_is_directory=True)
    assert c.open_read("e", "s") is None
    with pytest.raises(PermissionError):
        c.write("e", b"x", sub="s")  # storage treats it as a cache it cannot write
