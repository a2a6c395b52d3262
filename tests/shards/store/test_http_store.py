"""Generations read over plain HTTP(S) (fsspec's http filesystem): a static file server on
127.0.0.1 serving a generation root, with and without support for byte ranges."""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from shards.read.dataset import GroupDataset, RankInfo
from shards.read.reader import ShardError
from shards.store.manifest import open_generation
from tests.shards.hostile_bodies import send_overflowing, send_trickle

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
    """Over HTTP the loader gives the same steps as from disk (no listing over HTTP: sizes come
    from a HEAD each); verify=True streams each shard once through its sha256 (one GET without
    a Range), and every group is then one ranged GET, never a whole shard."""
    server, url = _serve(generation, _RangeHandler)
    try:
        m = open_generation(url)
        assert m.generation == (generation / "CURRENT").read_text().strip()
        for rank in range(2):
            info = RankInfo(rank=rank, world_size=2)
            want = [(b["step"], [(s.key, s.images) for s in b["samples"]])
                    for b in GroupDataset(generation, info, seed=1)]  # fmt: skip
            _RangeHandler.requests.clear()
            got = [(b["step"], [(s.key, s.images) for s in b["samples"]])
                   for b in GroupDataset(url, info, seed=1, verify=True)]  # fmt: skip
            assert got == want
            gets = [(p, r) for c, p, r in _RangeHandler.requests
                    if c == "GET" and p.endswith(".tar")]  # fmt: skip
            whole = [p for p, r in gets if r is None]
            assert whole and len(whole) == len(set(whole))  # each shard hashed once
            assert len(gets) - len(whole) == sum(len(samples) > 0 for _, samples in got)
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
    from shards.store.storage import GenerationFiles

    server, url = _serve(".", _EndlessHandler)
    try:
        files = GenerationFiles(url)
        with pytest.raises(ValueError, match="more than the 4096 bytes"):
            files.read_bytes("CURRENT", 4096)
        with pytest.raises(ValueError, match="more than the 1048576 bytes"):
            files.read_bytes("manifest.json", 1 << 20)
    finally:
        server.shutdown()


class _OverflowHandler(_RangeHandler):
    """A server that answers every GET of a shard as asked (with a Range, a 206 of those
    bytes; without, the whole file) and then keeps sending (a hostile or broken one): up to
    256 MiB past the file, counting what it got to send, so a test ends either way and sees
    how much a client read."""

    sent: ClassVar[list[int]] = []

    def do_GET(self):
        path = self.translate_path(self.path)
        if not self.path.endswith(".tar") or not os.path.isfile(path):
            return super().do_GET()
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
        data = open(path, "rb").read()  # noqa: SIM115 - a small test shard
        if m:
            data = data[int(m.group(1)) : int(m.group(2)) + 1]
        self.send_response(206 if m else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()  # no Content-Length: the body ends when the server stops
        send_overflowing(self.wfile, data, self.sent)


@pytest.mark.parametrize("verify", [False, True], ids=["group-read", "checksum"])
def test_a_shard_streamed_without_end_is_read_only_past_its_size(generation, verify):
    """A server that answers a group's Range (or the checksum's whole-shard GET) and then keeps
    sending was read until it stopped, all of it into memory (fsspec's ``cat_file`` and its
    block reads read a response whole): a run held, or died of memory. Now a group's read
    stops one byte past its length and the checksum one byte past the manifest's shard size:
    the load fails naming the shard, after at most a few MiB were sent (socket buffers)."""
    server, url = _serve(generation, _OverflowHandler)
    try:
        _OverflowHandler.sent.clear()
        ds = GroupDataset(url, RankInfo(rank=0, world_size=1), shuffle=False, verify=verify)
        match = "more than the .* bytes recorded" if verify else "ignores byte ranges"
        with pytest.raises(ShardError, match=f"shard-.*tar.*{match}"):
            next(iter(ds))
        deadline = time.monotonic() + 30  # the handler ends at its first failed write
        while not _OverflowHandler.sent and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _OverflowHandler.sent and max(_OverflowHandler.sent) < 64 << 20
    finally:
        server.shutdown()


def test_verify_reports_a_shard_streamed_past_its_size(generation):
    """``equishard verify`` over such a server reports each shard as a problem naming it (the
    checksum stops one byte past the manifest's size) instead of reading without end."""
    from shards.read.verify import verify_generation

    server, url = _serve(generation, _OverflowHandler)
    try:
        res = verify_generation(url)
        shards = sum(len(st.shards) for st in open_generation(generation).streams)
        assert not res.ok and res.shards == shards
        assert sum("bytes recorded for it" in p for p in res.problems) == shards, res.problems
    finally:
        server.shutdown()


class _TrickleHandler(_RangeHandler):
    """A server that answers a shard's GET (a Range with a 206) and then sends its bytes a
    little at a time, each piece well inside the read timeout (a slow or hostile one)."""

    def do_GET(self):
        path = self.translate_path(self.path)
        if not self.path.endswith(".tar"):
            return super().do_GET()
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
        with open(path, "rb") as f:
            data = f.read()
        if m:
            data = data[int(m.group(1)) : int(m.group(2)) + 1]
        self.send_response(206 if m else 200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        send_trickle(self.wfile, data)


@pytest.mark.parametrize("verify", [False, True], ids=["group-read", "checksum"])
def test_a_shard_sent_a_trickle_at_a_time_fails_within_its_deadline(
    generation, monkeypatch, verify
):
    """Each read of a response waited at most the store timeout, so a server sending a few
    bytes now and then (5 KB/s here, a group or shard of ~700 KB: over two minutes) held the
    loader as long as it liked. A group's ranged read, and a shard's checksum read, now have a
    deadline of the timeout per MiB they may take (plus one): with a 1 s timeout they fail in
    about 2 s, naming the shard."""
    monkeypatch.setenv("EQUISHARD_STORE_TIMEOUT", "1")
    server, url = _serve(generation, _TrickleHandler)
    try:
        ds = GroupDataset(url, RankInfo(rank=0, world_size=1), shuffle=False, verify=verify)
        t0 = time.monotonic()
        what = "cannot read for its checksum" if verify else "cannot read the shard"
        with pytest.raises(ShardError, match=f"shard-.*tar.*{what}"):
            next(iter(ds))
        assert time.monotonic() - t0 < 20
    finally:
        server.shutdown()


def test_a_night_fetches_its_parent_over_http_without_a_listing(generation, tmp_path):
    """``fetch_generation`` from a plain HTTP server: one HEAD per file the manifest names
    (fsspec's HTTP listing crawls the links of index pages, which a server may give without
    end) and the copy equals the generation on disk, file by file (the reference)."""
    from shards.store.object_store import fetch_generation
    from shards.store.storage import sha256_of

    gen = (generation / "CURRENT").read_text().strip()
    server, url = _serve(generation, _RangeHandler)
    try:
        _RangeHandler.requests.clear()
        dest = fetch_generation(url, gen, tmp_path / "staging")
        listed = [p for c, p, _ in _RangeHandler.requests if c == "GET" and p.endswith("/")]
    finally:
        server.shutdown()
    assert not listed, listed
    src = generation / gen
    want = {str(p.relative_to(src)): sha256_of(p) for p in src.rglob("*") if p.is_file()}
    got = {str(p.relative_to(dest)): sha256_of(p) for p in dest.rglob("*") if p.is_file()}
    # what a night reads: manifest, shards, the files carried beside them (not the wids index)
    assert got == {k: v for k, v in want.items() if k != "wids-index.json"}
    assert sum(k.endswith(".tar") for k in got) == sum(
        len(st.shards) for st in open_generation(generation).streams
    )


def test_nothing_is_aimed_at_an_http_server_to_publish(generation, tmp_path):
    """An HTTP(S) server serves a generation but cannot take one (no listing, no atomic
    CURRENT, no deletion): ``write --out``, ``rebalance --current`` and a publish to one are
    refused before any work, naming the URL (a night ran whole and failed at its publish)."""
    from shards.nightly.rebalance import RebalanceConfig
    from shards.store.object_store import publish_generation
    from shards.write.writer import WriteConfig

    url = "https://example.invalid/shards"
    new = tmp_path / "new.jsonl"
    new.write_text("")
    with pytest.raises(ValueError, match=f"--out {url}: an HTTP.* is read-only"):
        WriteConfig(plan_dir=str(tmp_path), cost_table=str(new), out=url)
    with pytest.raises(ValueError, match=f"--current {url}: an HTTP.* is read-only"):
        RebalanceConfig(current=url, new=(str(new),))
    gen = (generation / "CURRENT").read_text().strip()
    with pytest.raises(ValueError, match=f"publish to {url}: an HTTP"):
        publish_generation(generation / gen, url)


class _StallHandler(_RangeHandler):
    """Answers every request only after 30 s (a server that accepts and then says nothing)."""

    def send_head(self):
        time.sleep(30)
        return super().send_head()


def test_verify_over_a_stalling_http_server_fails_in_seconds_naming_the_url(generation):
    """``equishard verify http://... --store-timeout 1 --store-retries 1``: its existence check
    and size waited on fsspec's own timeouts and failed as ``FSTimeoutError: `` (an empty
    message). Now each call has the deadline of timeout x retries: one line naming the URL."""
    import subprocess
    import sys

    server, url = _serve(generation, _StallHandler)
    try:
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "equishard", "verify", url, "--store-timeout", "1"]
        p = subprocess.run(
            [*cmd, "--store-retries", "1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - t0
    finally:
        server.shutdown()
    out = [x for x in (p.stdout + p.stderr).splitlines() if x.strip()]
    assert p.returncode in (1, 2), (p.returncode, out)
    msg = " ".join(out)
    assert url in msg and "within" in msg and "FSTimeoutError: " not in msg, out
    assert "Traceback" not in p.stderr and took < 25, (took, out)
