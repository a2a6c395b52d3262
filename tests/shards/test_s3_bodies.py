"""An S3-compatible endpoint that misbehaves inside a response's body: a real S3 server (moto)
behind a proxy that passes every request through unchanged, except a shard's body, which it
may follow with bytes that never end (no Content-Length) or send a trickle at a time. s3fs reads
a body whole (``cat_file``, each block of a file it opens) and botocore's read timeout is per
read, so either held a loader or ran it out of memory before reads went through
``store_limits.s3_get``."""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import urlsplit

import pytest

from shards.dataset import GroupDataset, RankInfo
from shards.manifest import open_generation
from shards.object_store import publish_generation
from shards.reader import ShardError
from shards.verify import verify_generation

pytest.importorskip("s3fs")

_SKIP = {"transfer-encoding", "connection", "content-length", "date", "server", "keep-alive"}


class _Proxy(BaseHTTPRequestHandler):
    """Forwards each request to ``upstream`` (moto) and its answer back; a shard's GET body is
    then, in mode ``overflow``, followed by up to 256 MiB more (counted in ``sent``), or in
    mode ``trickle`` sent 512 bytes every 0.1 s."""

    upstream: ClassVar[str] = ""
    mode: ClassVar[str] = "pass"
    sent: ClassVar[list[int]] = []

    def log_message(self, *args) -> None:
        pass

    def _forward(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        up = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn.request(self.command, self.path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        shard = self.command == "GET" and self.path.split("?")[0].endswith(".tar")
        shard = shard and r.status in (200, 206) and self.mode != "pass"
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in _SKIP:
                self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", r.getheader("Content-Length") or "0")
        elif not (shard and self.mode == "overflow"):
            self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command == "HEAD":
            return
        if not shard:
            self.wfile.write(data)
        elif self.mode == "overflow":
            self._overflow(data)
        else:
            self._trickle(data)

    def _overflow(self, data: bytes) -> None:
        sent = 0
        try:
            self.wfile.write(data)
            sent = len(data)
            chunk = b"\0" * (1 << 20)
            for _ in range(256):
                self.wfile.write(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self.sent.append(sent)

    def _trickle(self, data: bytes) -> None:
        try:
            for i in range(0, len(data), 512):
                self.wfile.write(data[i : i + 512])
                self.wfile.flush()
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


@pytest.fixture
def proxied(s3, generation, bucket):
    """The generation published to the S3 server, and storage options that reach it only
    through the proxy: ``(url, options)``; the proxy's mode is set by the test."""
    gen = (generation / "CURRENT").read_text().strip()
    publish_generation(generation / gen, bucket, storage_options=s3["opts"])
    _Proxy.upstream, _Proxy.mode = s3["endpoint"], "pass"
    _Proxy.sent.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    opts = {**s3["opts"], "endpoint_url": f"http://127.0.0.1:{server.server_address[1]}"}
    try:
        yield bucket, opts
    finally:
        server.shutdown()
        server.server_close()


def _first(url: str, opts: dict, verify: bool):
    ds = GroupDataset(url, RankInfo(rank=0, world_size=1), shuffle=False, verify=verify,
                      storage_options={**opts, "use_listings_cache": False})  # fmt: skip
    return next(iter(ds))


def test_the_proxy_passes_a_generation_through_unchanged(proxied, generation):
    """The reference: through the proxy in pass mode, the loader reads what it reads from the
    local copy, and verify finds every shard sound."""
    url, opts = proxied
    local = GroupDataset(generation, RankInfo(rank=0, world_size=1), shuffle=False)
    want = next(iter(local))
    got = _first(url, opts, verify=True)
    assert [(s.key, s.meta) for s in got["samples"]] == [(s.key, s.meta) for s in want["samples"]]
    assert verify_generation(url, storage_options=opts).ok


@pytest.mark.parametrize("verify", [False, True], ids=["group-read", "checksum"])
def test_an_s3_body_without_end_is_read_only_past_its_size(proxied, verify):
    """A group's ranged GetObject (or the checksum's whole-shard GET) answered and then
    followed by bytes without end: s3fs read it until the endpoint stopped (256 MiB here, into
    memory). Now the read stops one byte past the range (the manifest's shard size): the load
    fails naming the shard after a few MiB at most (socket buffers)."""
    url, opts = proxied
    _Proxy.mode = "overflow"
    match = "more than the .* bytes recorded" if verify else "ignores byte ranges"
    with pytest.raises(ShardError, match=f"shard-.*tar.*{match}"):
        _first(url, opts, verify)
    deadline = time.monotonic() + 30  # the handler ends at its first failed write
    while not _Proxy.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _Proxy.sent and max(_Proxy.sent) < 64 << 20, _Proxy.sent


def test_verify_reports_each_s3_shard_sent_past_its_size(proxied, generation):
    """``equishard verify`` through such an endpoint reports every shard as a problem naming
    it, having read one byte past each."""
    url, opts = proxied
    _Proxy.mode = "overflow"
    res = verify_generation(url, storage_options=opts)
    shards = sum(len(st.shards) for st in open_generation(generation).streams)
    assert not res.ok and res.shards == shards
    assert sum("bytes recorded for it" in p for p in res.problems) == shards, res.problems


@pytest.mark.parametrize("verify", [False, True], ids=["group-read", "checksum"])
def test_an_s3_body_sent_a_trickle_at_a_time_fails_within_its_deadline(
    proxied, monkeypatch, verify
):
    """512 bytes every 0.1 s (5 KB/s), each piece well inside botocore's per-read timeout: a
    group of ~700 KB took over two minutes, and a slower endpoint held the loader for as long as
    it liked. Each GetObject now has a deadline of the store timeout per MiB (plus one): with a
    1 s timeout the read fails in about 2 s, naming the shard."""
    url, opts = proxied
    monkeypatch.setenv("EQUISHARD_STORE_TIMEOUT", "1")
    _Proxy.mode = "trickle"
    t0 = time.monotonic()
    what = "cannot read for its checksum" if verify else "cannot read the shard"
    with pytest.raises(ShardError, match=f"shard-.*tar.*{what}"):
        _first(url, opts, verify)
    assert time.monotonic() - t0 < 20
