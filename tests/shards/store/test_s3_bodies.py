"""An S3-compatible endpoint that misbehaves inside a response: a real S3 server (moto) behind a
proxy that passes every request through unchanged, except a shard's body, which it may follow
with bytes that never end (no Content-Length) or send a trickle at a time, and a listing, which
it may continue without end. s3fs reads a body whole (``cat_file``, each block of a file it
opens), follows continuation tokens for as long as they come, and botocore's read timeout is
per read: each held a loader or ran it out of memory before reads and listings went through
``store_limits.s3_get`` and ``s3_list``."""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest

from shards.read.dataset import GroupDataset, RankInfo
from shards.read.reader import ShardError
from shards.read.verify import verify_generation
from shards.store.manifest import ManifestError, open_generation
from shards.store.object_store import publish_generation, read_remote_current
from tests.shards.hostile_bodies import send_crawl, send_overflowing, send_trickle

pytest.importorskip("s3fs")

_SKIP = {"transfer-encoding", "connection", "content-length", "date", "server", "keep-alive"}


class _Proxy(BaseHTTPRequestHandler):
    """Forwards each request to ``upstream`` (moto) and its answer back; a shard's GET body is
    then, in mode ``overflow``, followed by up to 256 MiB more (counted in ``sent``), or in
    mode ``trickle`` sent 512 bytes every 0.1 s."""

    upstream: ClassVar[str] = ""
    mode: ClassVar[str] = "pass"
    sent: ClassVar[list[int]] = []
    pages: ClassVar[list[int]] = [0]  # listing pages answered past the first
    # bodies sent at a crawl (send_crawl): "list" listing pages, "small" every other GET
    # that is no shard (CURRENT, the manifest)
    crawl: ClassVar[set[str]] = set()

    def _list(self) -> bool:
        """A ListObjectsV2 in modes ``relist`` (the real first page again and again, each with
        a new token), ``fresh`` (1,000 new names a page) and ``slow`` (one new name a page,
        each page after 0.3 s); every page says there is more, up to 300 pages."""
        query = parse_qs(urlsplit(self.path).query)
        if self.command != "GET" or "list-type" not in query:
            return False
        if self.mode not in ("relist", "fresh", "slow", "foreign"):
            return False
        token = (query.get("continuation-token") or [""])[0]
        if token and self.mode != "relist":
            k = int(token.split("-")[1])
            self.pages[0] += 1
            if self.mode == "slow":
                time.sleep(0.3)
            names = [f"zz/{k:06d}-{i:04d}" for i in range(1 if self.mode == "slow" else 1000)]
            prefix = query["prefix"][0]
            body = "".join(
                f"<Contents><Key>{prefix}{n}</Key><LastModified>2026-11-29T00:00:00.000Z"
                "</LastModified><ETag>&quot;0&quot;</ETag><Size>1</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
                for n in names
            )
            more = self.pages[0] < 300
            data = (
                '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.'
                f'amazonaws.com/doc/2006-03-01/"><Name>bkt</Name><Prefix>{prefix}</Prefix>'
                f"<MaxKeys>1000</MaxKeys><KeyCount>{len(names)}</KeyCount><IsTruncated>"
                f"{str(more).lower()}</IsTruncated><NextContinuationToken>tok-{k + 1}"
                f"</NextContinuationToken>{body}</ListBucketResult>"
            ).encode()
        else:  # the real first page, said to go on
            if token:
                self.pages[0] += 1
            path = self.path.replace(f"continuation-token={token}", "") if token else self.path
            up = urlsplit(self.upstream)
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
            conn.request("GET", path, headers={k: v for k, v in self.headers.items()})
            data = conn.getresponse().read()
            conn.close()
            k = int(token.split("-")[1]) if token else 0
            if self.mode == "foreign":  # one more object, outside the folder listed
                bucket_prefix = query["prefix"][0].split("/")[0]
                data = data.replace(  # last, in key order ("keep" after "gen-")
                    b"</ListBucketResult>",
                    f"<Contents><Key>{bucket_prefix}/keep/precious.bin</Key><LastModified>"
                    "2026-11-29T00:00:00.000Z</LastModified><ETag>&quot;0&quot;</ETag>"
                    "<Size>1</Size><StorageClass>STANDARD</StorageClass></Contents>"
                    "</ListBucketResult>".encode(),
                )
            elif self.pages[0] < 300:
                data = data.replace(
                    b"<IsTruncated>false</IsTruncated>",
                    f"<IsTruncated>true</IsTruncated><NextContinuationToken>tok-{k + 1}"
                    "</NextContinuationToken>".encode(),
                )
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        return True

    def log_message(self, *args) -> None:
        pass

    def _forward(self) -> None:
        if self._list():
            return
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        up = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn.request(self.command, self.path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        tar = self.command == "GET" and self.path.split("?")[0].endswith(".tar")
        shard = tar and r.status in (200, 206) and self.mode != "pass"
        listing = "list-type" in parse_qs(urlsplit(self.path).query)
        crawl = self.command == "GET" and not tar and r.status == 200
        crawl = crawl and ("list" if listing else "small") in self.crawl
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
        if crawl:
            send_crawl(self.wfile, data)
        elif not shard:
            self.wfile.write(data)
        elif self.mode == "overflow":
            send_overflowing(self.wfile, data, self.sent)
        else:
            send_trickle(self.wfile, data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


@pytest.fixture
def proxied(s3, generation, bucket):
    """The generation published to the S3 server, and storage options that reach it only
    through the proxy: ``(url, options)``; the proxy's mode is set by the test."""
    gen = (generation / "CURRENT").read_text().strip()
    publish_generation(generation / gen, bucket, storage_options=s3["opts"])
    _Proxy.upstream, _Proxy.mode = s3["endpoint"], "pass"
    _Proxy.sent.clear()
    _Proxy.crawl = set()
    _Proxy.pages[0] = 0
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


@pytest.mark.parametrize("mode", ["relist", "fresh"])
def test_an_s3_listing_without_end_is_refused(proxied, mode):
    """A listing whose every page says there is more (the same page again with a new token,
    or a thousand new names a page): s3fs followed it for as long as it went on, so the loader
    never started and its memory grew (here the proxy stops after 300 pages, and the old
    listing then loaded the generation as if nothing were wrong). The loader's one listing is
    now refused naming the generation: at the second page when it names an object again (S3
    lists in key order), past the objects a generation of its manifest's files may hold."""
    url, opts = proxied
    _Proxy.mode = mode
    with pytest.raises(ManifestError, match=f"cannot list .*{url}.*listing"):
        _first(url, opts, verify=False)
    assert _Proxy.pages[0] <= 3, _Proxy.pages[0]


def test_an_s3_listing_sent_a_page_at_a_time_fails_within_its_deadline(proxied, monkeypatch):
    """One new name a page, each page after 0.3 s (well inside the per-request timeout): the
    listing may name a thousand more objects than the generation holds, so the count alone
    let it run for minutes. It has a deadline of the store timeout per 1,000 objects it may
    name (plus one): with a 1 s timeout it fails in a few seconds."""
    url, opts = proxied
    monkeypatch.setenv("EQUISHARD_STORE_TIMEOUT", "1")
    _Proxy.mode = "slow"
    t0 = time.monotonic()
    with pytest.raises(ManifestError, match=f"cannot list .*{url}.*takes longer"):
        _first(url, opts, verify=False)
    assert time.monotonic() - t0 < 20 and _Proxy.pages[0] < 100


def test_removing_a_generation_deletes_its_objects_and_nothing_else(s3, generation, bucket):
    """The nightly retention's remote removal (the reference): every object of the generation
    goes, the manifest first; its neighbours stay, a name that only starts like it too."""
    from shards.store.object_store import remove_remote_generation
    from tests.shards.conftest import s3fs_of

    gen = (generation / "CURRENT").read_text().strip()
    publish_generation(generation / gen, bucket, storage_options=s3["opts"])
    fs = s3fs_of(s3)
    fs.pipe({f"{bucket}/{gen}x/keep.bin": b"1", f"{bucket}/keep/precious.bin": b"2"})
    before = set(fs.find(bucket))
    ours = {k for k in before if k.startswith(f"{bucket[5:]}/{gen}/")}
    assert len(ours) > 20
    remove_remote_generation(bucket, gen, storage_options=s3["opts"])
    fs.invalidate_cache()
    assert set(fs.find(bucket)) == before - ours
    remove_remote_generation(bucket, gen, storage_options=s3["opts"])  # nothing left: no error


def test_an_interrupted_removal_is_finished_without_its_manifest(s3, generation, bucket):
    """A removal killed after the manifest went leaves the shards: the next removal deletes
    them, listing as many objects as a generation without a manifest may hold."""
    from shards.store.object_store import remove_remote_generation
    from tests.shards.conftest import s3fs_of

    gen = (generation / "CURRENT").read_text().strip()
    publish_generation(generation / gen, bucket, storage_options=s3["opts"])
    fs = s3fs_of(s3)
    fs.rm_file(f"{bucket}/{gen}/manifest.json")
    remove_remote_generation(bucket, gen, storage_options=s3["opts"])
    fs.invalidate_cache()
    assert not fs.find(f"{bucket}/{gen}/")


def test_a_listing_naming_an_object_outside_the_generation_deletes_nothing_of_it(proxied, s3):
    """A listing (a store's bug, a proxy) that names an object outside the generation being
    removed: fsspec's recursive rm deleted what the listing named, so a night's retention could
    delete any object of the bucket. The removal now lists with the checked listing: it is
    refused naming the generation, and the object outside stays."""
    from shards.store.object_store import remove_remote_generation
    from tests.shards.conftest import s3fs_of

    url, opts = proxied
    fs = s3fs_of(s3)
    precious = f"{url}/keep/precious.bin"
    fs.pipe_file(precious, b"precious")
    gen = read_remote_current(url, storage_options=opts)
    _Proxy.mode = "foreign"
    with pytest.raises(OSError, match=f"{gen}.*listing names .*keep/precious.bin"):
        remove_remote_generation(url, gen, storage_options=opts)
    fs.invalidate_cache()
    assert fs.cat_file(precious) == b"precious"


@pytest.mark.parametrize("crawl", ["small", "list"])
def test_verify_through_a_crawling_endpoint_fails_within_its_limits(proxied, crawl):
    """``equishard verify s3://ROOT --store-timeout 1 --store-retries 1`` where CURRENT and the
    manifest (or every listing page) come at 80 B/s: a small object's deadline was sized from
    the 1 GiB small-file limit (hours) and s3fs's existence checks and listings had none, so
    verify ran for over 300 s. Now every call's deadline is the store timeout x retries (and
    per MiB of the object): verify fails in seconds, one line naming the root."""
    import os
    import subprocess
    import sys

    url, opts = proxied
    _Proxy.crawl = {crawl}
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": opts["endpoint_url"],
    }
    cmd = [sys.executable, "-m", "equishard", "verify", url, "--store-timeout", "1"]
    t0 = time.monotonic()
    p = subprocess.run(
        [*cmd, "--store-retries", "1"], capture_output=True, text=True, env=env, timeout=200
    )
    took = time.monotonic() - t0
    assert p.returncode == 1, p.stderr
    # verify reports what it found on stdout: the problem names the root and the limit
    problems = [x for x in p.stdout.splitlines() if x.startswith("PROBLEM:")]
    assert problems and all(url in x and "within" in x for x in problems), p.stdout
    assert "Traceback" not in p.stderr and took < 30, (took, p.stderr)
