"""One backend class per store kind, and a new kind added in one module.

The bugs these tests catch: a location served by the wrong backend (an S3 root read through
fsspec's whole-body reads, a plain HTTP server crawled for a listing), and a store kind that can
only be added by editing the branches of ``GenerationFiles``: here a backend written in this
file alone (its own bounded reads and listing of a ``memory://`` store, counting its calls)
serves the loader, ``verify`` and the manifest checks of a real generation, byte-identical to
the same generation read from local disk.
"""

from __future__ import annotations

import pickle
from typing import ClassVar

import fsspec
import pytest

import shards.store.backends.registry as registry
from shards.read.dataset import GroupDataset, RankInfo
from shards.read.verify import verify_generation
from shards.store.backends import (
    HttpBackend,
    LocalBackend,
    S3Backend,
    StoreBackend,
    register_backend,
    registered,
)
from shards.store.backends.base import store_size
from shards.store.storage import GenerationFiles


class CountingMemoryBackend(StoreBackend):
    """A backend of its own for fsspec's ``memory://``: GETs and listings by hand, counted."""

    kind = "counting-memory"
    protocols = frozenset({"memory"})
    calls: ClassVar[dict[str, int]] = {}

    def _count(self, what: str) -> None:
        type(self).calls[what] = type(self).calls.get(what, 0) + 1

    def get(self, path, limit, sink, offset=None, expect=None):
        self._count("get")
        start = offset or 0  # a range is asked exactly; a whole object one byte past its limit
        data = self.fs.cat_file(path, start=start, end=start + limit + (offset is None))
        sink(data)
        return len(data)

    def list_sizes(self, root, location, limit):
        self._count("list")
        prefix = root.rstrip("/") + "/"
        found = {
            k[len(prefix) :]: store_size(v["size"], k, True)
            for k, v in self.fs.find(root, detail=True).items()
            if k.startswith(prefix)
        }
        if len(found) > limit:
            raise OSError(f"{location}: more than {limit} objects")
        return found


@pytest.fixture
def counting_backend(monkeypatch):
    monkeypatch.setattr(registry, "_BACKENDS", list(registry._BACKENDS))  # undone after
    CountingMemoryBackend.calls = {}
    register_backend(CountingMemoryBackend)
    return CountingMemoryBackend


def _batches(ds) -> list:
    return [[(s.key, s.meta, s.images) for s in b["samples"]] for b in ds]


def test_each_location_gets_its_kinds_backend(tmp_path):
    assert type(GenerationFiles(tmp_path).backend) is LocalBackend
    assert GenerationFiles(f"file://{tmp_path}").kind == "local"
    assert type(GenerationFiles("http://127.0.0.1:9/gen").backend) is HttpBackend
    s3 = GenerationFiles("s3://bucket/gen", storage_options={"anon": True})
    assert type(s3.backend) is S3Backend and s3.kind == "s3"
    mem = GenerationFiles("memory://kinds/gen")
    assert type(mem.backend) is StoreBackend and mem.kind == "fsspec"
    assert [b.listable for b in (LocalBackend, HttpBackend, S3Backend, StoreBackend)] == [
        True,
        False,
        True,
        True,
    ]
    assert [b.conditional_put for b in (LocalBackend, HttpBackend, S3Backend, StoreBackend)] == [
        False,
        False,
        True,
        False,
    ]
    # a pickled copy (a DataLoader worker) makes its own file system and backend again
    copy = pickle.loads(pickle.dumps(mem))
    assert copy._backend is None and copy.kind == "fsspec" and copy.backend.fs is copy.fs


def test_a_backend_added_in_one_module_serves_loader_verify_and_listing(
    generation, counting_backend
):
    fs = fsspec.filesystem("memory")
    fs.put(str(generation), "/added-backend/root", recursive=True)
    url = "memory://added-backend/root"
    files = GenerationFiles(url)
    assert type(files.backend) is CountingMemoryBackend and files.kind == "counting-memory"
    assert registered()[0] is CountingMemoryBackend
    info = RankInfo(rank=0, world_size=1)
    local = _batches(GroupDataset(generation, info, shuffle=False))
    remote = _batches(GroupDataset(url, info, shuffle=False, verify=True))
    assert remote == local and sum(map(len, local)) > 0
    assert counting_backend.calls["get"] > 0 and counting_backend.calls["list"] > 0
    res = verify_generation(url)
    assert res.ok, res
    # the same bytes, damaged in the store, are found by the same backend
    name = next(p for p in fs.find("/added-backend/root") if p.endswith(".tar"))
    data = bytearray(fs.cat_file(name))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(name, bytes(data))
    assert not verify_generation(url).ok


def test_a_backend_must_name_its_protocols(monkeypatch):
    monkeypatch.setattr(registry, "_BACKENDS", list(registry._BACKENDS))

    class Nameless(StoreBackend):
        pass

    with pytest.raises(ValueError, match="names no protocols"):
        register_backend(Nameless)
    with pytest.raises(TypeError, match="not a StoreBackend"):
        register_backend(dict)
    assert registered() == (HttpBackend, S3Backend)


def test_only_a_store_with_conditional_writes_is_asked_for_one(tmp_path):
    with pytest.raises(TypeError, match=r"published by shards\.store\.publish"):
        LocalBackend().put(str(tmp_path / "CURRENT"), b"x\n", "CURRENT")
    with pytest.raises(ValueError, match="read-only"):
        HttpBackend(None).put("http://h/CURRENT", b"x\n", "CURRENT")
    mem = fsspec.filesystem("memory")
    with pytest.raises(NotImplementedError):  # a generic store names no conditional write

        class Claims(StoreBackend):
            conditional_put = True

        Claims(mem).put("/claims/CURRENT", b"x\n", "CURRENT", expect=("a", "tag"))
    StoreBackend(mem).put("/plain/CURRENT", b"x\n", "CURRENT")
    assert mem.cat_file("/plain/CURRENT") == b"x\n"
