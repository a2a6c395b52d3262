"""Generations read over plain HTTP(S) (fsspec's http filesystem): a static file server on
127.0.0.1 serving a generation root, with and without support for byte ranges."""

from __future__ import annotations

import functools
import os
import re
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from shards.dataset import GroupDataset, RankInfo
from shards.manifest import open_generation
from shards.reader import ShardError

pytest.importorskip("aiohttp")  # fsspec's http filesystem


class _RangeHandler(SimpleHTTPRequestHandler):
    """Python's file server plus ``Range: bytes=a-b`` (as nginx or a CDN answers: 206)."""

    requests: ClassVar[list[tuple[str, str, str | None]]] = []

    def log_message(self, *args) -> None:
        pass

    def send_head(self):
        self.requests.append((self.command, self.path, self.headers.get("Range")))
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        path = self.translate_path(self.path)
        if m is None or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
        f = open(path, "rb")  # noqa: SIM115 - closed by copyfile's caller
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        return _Limited(f, end - start + 1)


class _Limited:
    def __init__(self, f, n: int) -> None:
        self.f, self.n = f, n

    def read(self, size: int = -1) -> bytes:
        size = self.n if size < 0 else min(size, self.n)
        data = self.f.read(size)
        self.n -= len(data)
        return data

    def close(self) -> None:
        self.f.close()


class _NoRangeHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _serve(directory, handler):
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=directory))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_loader_over_http_with_ranges(generation):
    """Over HTTP the loader gives the same steps as from disk, every shard GET carries a Range
    (no listing over HTTP: sizes come from a HEAD each), and verify=True streams each shard
    through its sha256."""
    server, url = _serve(generation, _RangeHandler)
    try:
        _RangeHandler.requests.clear()
        m = open_generation(url)
        assert m.generation == (generation / "CURRENT").read_text().strip()
        for rank in range(2):
            info = RankInfo(rank=rank, world_size=2)
            want = [(b["step"], [(s.key, s.images) for s in b["samples"]])
                    for b in GroupDataset(generation, info, seed=1)]  # fmt: skip
            got = [(b["step"], [(s.key, s.images) for s in b["samples"]])
                   for b in GroupDataset(url, info, seed=1, verify=True)]  # fmt: skip
            assert got == want
        gets = [(p, r) for c, p, r in _RangeHandler.requests if c == "GET" and p.endswith(".tar")]
        assert gets and all(r is not None for _, r in gets)
    finally:
        server.shutdown()


def test_server_without_ranges_is_refused(generation):
    """A server that ignores Range would send a whole shard per group: the read fails with a
    message that says so, instead of silently downloading shards over and over."""
    server, url = _serve(generation, _NoRangeHandler)
    try:
        ds = GroupDataset(url, RankInfo(rank=0, world_size=1), shuffle=False)
        with pytest.raises(ShardError, match="ignores byte ranges"):
            next(iter(ds))
    finally:
        server.shutdown()


class _EndlessHandler(SimpleHTTPRequestHandler):
    """A server whose every file is an endless stream without Content-Length (a misconfigured
    proxy, or a hostile one): capped at 64 MiB here so that the test ends either way."""

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()

    def do_GET(self):
        self.do_HEAD()
        chunk = b"gen-" + b"x" * 65532
        try:
            for _ in range(1024):
                self.wfile.write(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass


def test_a_small_file_of_unknown_size_is_read_only_to_its_limit():
    """CURRENT and the manifest are read whole: a server that gives no size and never stops
    (or a store whose size went stale) was read to the end, all of it into memory; now one byte
    past the limit is read and refused."""
    from shards.storage import GenerationFiles

    server, url = _serve(".", _EndlessHandler)
    try:
        files = GenerationFiles(url)
        with pytest.raises(ValueError, match="more than the 4096 bytes"):
            files.read_bytes("CURRENT", 4096)
        with pytest.raises(ValueError, match="more than the 1048576 bytes"):
            files.read_bytes("manifest.json", 1 << 20)
    finally:
        server.shutdown()
