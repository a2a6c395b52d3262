"""How long a request to an object store or HTTP server may take, and how often it is tried:
``$EQUISHARD_STORE_TIMEOUT`` / ``$EQUISHARD_STORE_RETRIES`` (the CLI's ``--store-timeout`` and
``--store-retries``), checked where read, and the fsspec options that bound every request with
them (:func:`bounded_options`), so an endpoint that never answers fails a run instead of
holding it."""

from __future__ import annotations

import os

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT",
    "RETRIES_ENV",
    "TIMEOUT_ENV",
    "bounded_options",
    "call_deadline",
    "http_deadline",
    "http_get",
    "listing_limit",
    "s3_get",
    "s3_list",
    "store_call",
    "store_limits",
]

TIMEOUT_ENV, RETRIES_ENV = "EQUISHARD_STORE_TIMEOUT", "EQUISHARD_STORE_RETRIES"
DEFAULT_TIMEOUT, DEFAULT_RETRIES = 30.0, 3
# a typo (--store-retries 30000) against an endpoint that never answers would hold a job for
# days: a request waits at most an hour, and is tried at most 100 times
MAX_TIMEOUT, MAX_RETRIES = 3600.0, 100


def store_limits() -> tuple[float, int]:
    """(seconds a store request may wait for a connection or a read, attempts per request):
    ``$EQUISHARD_STORE_TIMEOUT`` and ``$EQUISHARD_STORE_RETRIES`` (set by the CLI's
    ``--store-timeout`` and ``--store-retries``), else 30 s and 3."""
    try:
        timeout = float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT)
        retries = int(os.environ.get(RETRIES_ENV) or DEFAULT_RETRIES)
    except ValueError:
        raise ValueError(
            f"${TIMEOUT_ENV} must be seconds and ${RETRIES_ENV} a whole number, got "
            f"{os.environ.get(TIMEOUT_ENV)!r} and {os.environ.get(RETRIES_ENV)!r}"
        ) from None
    if not (0 < timeout <= MAX_TIMEOUT) or not 1 <= retries <= MAX_RETRIES:
        raise ValueError(
            f"${TIMEOUT_ENV} must be seconds in (0, {MAX_TIMEOUT:g}] and ${RETRIES_ENV} a whole "
            f"number in 1..{MAX_RETRIES}, got {timeout} and {retries}"
        )
    return timeout, retries


def bounded_options(url: str, options: dict) -> tuple[dict, int | None]:
    """fsspec options for ``url`` with every request bounded: for S3, botocore's connect and
    read timeouts and its attempts (unless ``options`` set them), and the attempts of s3fs's
    own retry loop (returned). An endpoint that never answers then fails a request after
    about ``timeout x attempts`` seconds, not botocore's defaults times s3fs's retries."""
    if url.startswith(("http://", "https://")):  # aiohttp: per connect and per read
        import aiohttp

        timeout, _ = store_limits()
        opts = dict(options)
        client = dict(opts.get("client_kwargs") or {})
        client.setdefault(
            "timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        )
        opts["client_kwargs"] = client
        return opts, None
    if not url.startswith(("s3://", "s3a://")):
        return dict(options), None
    timeout, retries = store_limits()
    opts = dict(options)
    cfg = dict(opts.get("config_kwargs") or {})
    cfg.setdefault("connect_timeout", timeout)
    cfg.setdefault("read_timeout", timeout)
    cfg.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
    opts["config_kwargs"] = cfg
    return opts, retries


def http_deadline(nbytes: int):
    """aiohttp's timeouts for one HTTP request of ``nbytes``: the store timeout to connect and
    per read, and in all the timeout per MiB (plus one), so that a server sending a byte now
    and then cannot hold a run."""
    import aiohttp

    timeout, _ = store_limits()
    return aiohttp.ClientTimeout(
        total=timeout * (1 + nbytes / (1 << 20)), sock_connect=timeout, sock_read=timeout
    )


def _deadline_bytes(limit: int, expect: int | None) -> int:
    """The bytes a read's deadline is sized by: what the store said the object holds (a small
    object's read must not wait as long as the largest allowed), else the read's limit."""
    return limit if expect is None else max(0, min(limit, expect))


def http_get(
    fs, url: str, limit: int, sink, offset: int | None = None, expect: int | None = None
) -> int:
    """One GET of ``url`` through fsspec's HTTP filesystem ``fs`` (its session, options and
    timeouts), from ``offset`` (a Range) or the start, handing its body to ``sink`` piece by
    piece and stopping one byte past ``limit``; the bytes handed over. fsspec reads a response
    whole into memory (``cat_file``, each block of a file it opens), so a server that ignores a
    Range, or sends a body that never ends, was read until memory ran out. The GET has a
    deadline too (:func:`http_deadline` of ``limit``): each read waiting at most the timeout
    did not stop a server sending a byte now and then from holding a run for days.
    ``expect``: the size the server reported, which sizes the deadline instead of ``limit``."""

    deadline = http_deadline(_deadline_bytes(limit, expect))

    async def get() -> int:
        session = await fs.set_session()
        kw = dict(fs.kwargs)
        headers = dict(kw.pop("headers", None) or {})
        if offset is not None:
            headers["Range"] = f"bytes={offset}-{offset + limit - 1}"
        async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
            if r.status == 404:
                raise FileNotFoundError(url)
            if r.status == 416 and offset is not None:  # a range past the end: nothing there
                return 0
            r.raise_for_status()
            got = 0
            while got <= limit:  # a stream's read may return less than asked before its end
                part = await r.content.read(min(limit + 1 - got, 8 << 20))
                if not part:
                    break
                sink(part)
                got += len(part)
            return got

    return _run(fs, get, url, "GET", deadline.total)


def _run(fs, make, where: str, what: str, total: float):
    """Run the coroutine ``make()`` on ``fs``'s loop within ``total`` seconds; past it, an
    ``OSError`` naming ``where`` and the limits (fsspec turns every asyncio timeout into an
    ``FSTimeoutError`` whose message is empty: "FSTimeoutError: " said nothing of what or
    where)."""
    import asyncio

    from fsspec.asyn import sync
    from fsspec.exceptions import FSTimeoutError

    async def bounded():
        return await asyncio.wait_for(make(), total)

    try:
        return sync(fs.loop, bounded)
    except (TimeoutError, asyncio.TimeoutError, FSTimeoutError):
        timeout, retries = store_limits()
        raise OSError(
            f"{where}: the store did not finish {what} within {total:.0f} s (--store-timeout "
            f"{timeout:g} s x --store-retries {retries}, and per MiB); it is down, or too slow "
            "for these limits"
        ) from None


def s3_get(
    fs, url: str, limit: int, sink, offset: int | None = None, expect: int | None = None
) -> int:
    """:func:`http_get` for an S3 store through s3fs's filesystem ``fs`` (its client, retries
    and botocore timeouts): one ``GetObject`` of ``url``, from ``offset`` (a Range) or the
    start, its body handed to ``sink`` piece by piece, stopping one byte past ``limit``; the
    bytes handed over. s3fs reads a body whole (``cat_file``, each block of a file it opens),
    so an S3-compatible endpoint that streams a body without end was read until memory ran
    out; and botocore's read timeout, like aiohttp's, is per read, so the whole request has
    :func:`http_deadline`'s deadline too (``TimeoutError``, an ``OSError``)."""

    total = http_deadline(_deadline_bytes(limit, expect)).total

    async def get() -> int:
        bucket, key, version = fs.split_path(url)
        kw = {"VersionId": version} if version else {}
        if offset is not None:
            kw["Range"] = f"bytes={offset}-{offset + limit - 1}"
        resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
        body = resp["Body"]
        got = 0
        try:
            while got <= limit:  # a stream's read may return less than asked before its end
                part = await body.read(min(limit + 1 - got, 8 << 20))
                if not part:
                    break
                sink(part)
                got += len(part)
        except OSError:
            raise
        except Exception as exc:  # aiohttp's payload errors, botocore's length check
            raise OSError(f"{url}: {type(exc).__name__}: {exc}") from None
        finally:
            body.close()
        return got

    return _run(fs, get, url, "GetObject", total)


def listing_limit(files: int) -> int:
    """How many objects a listing of a generation of ``files`` files may name: its shards, the
    files carried beside them and Energon's index of each, with room to spare."""
    return 4 * files + 1000


def s3_list(fs, root: str, limit: int) -> dict[str, object]:
    """Every object under the S3 folder ``root`` by its name relative to it, with the size
    the listing gives (unchecked), through s3fs's client and retries: ListObjectsV2 pages of
    our own. s3fs follows a store's continuation tokens for as long as they come, so an
    endpoint listing without end (the same page again, or new names forever) held the run and
    filled its memory. An ``OSError`` naming ``root`` when a page names an object outside
    ``root`` or not after the last one (S3 lists in key order), a page is cut with no object
    or no token, the listing names more than ``limit`` objects, or it takes longer than the
    store timeout per 1,000 objects the limit allows (plus one)."""
    import asyncio

    from fsspec.asyn import sync

    timeout, _ = store_limits()
    bucket, key, _ = fs.split_path(root)
    prefix = key.rstrip("/") + "/" if key else ""

    def refuse(why: str) -> OSError:
        return OSError(f"{root}: the store's listing {why}; a store that lists without end?")

    async def walk() -> dict[str, object]:
        found: dict[str, object] = {}
        last, token = "", None
        while True:
            kw = {"ContinuationToken": token} if token else {}
            page = await fs._call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, **kw)
            objects = page.get("Contents") or []
            for obj in objects:
                name = obj.get("Key") if isinstance(obj, dict) else None
                if not isinstance(name, str) or not name.startswith(prefix):
                    raise refuse(f"names {name!r}, not an object under {prefix!r}")
                if name <= last:
                    raise refuse(f"names {name!r} after {last!r} (not in key order)")
                last = name
                if not name.endswith("/"):  # a folder marker, not a file
                    found[name[len(prefix) :]] = obj.get("Size")
                if len(found) > limit:
                    raise refuse(f"names more than {limit} objects, more than a generation holds")
            if not page.get("IsTruncated"):
                return found
            token = page.get("NextContinuationToken")
            if not objects or not isinstance(token, str) or not token:
                raise refuse("is cut with no object or no token to go on")

    async def bounded() -> dict[str, object]:
        try:
            return await asyncio.wait_for(walk(), timeout * (1 + limit / 1000))
        except TimeoutError:
            raise refuse(f"takes longer than {timeout * (1 + limit / 1000):.0f} s") from None

    return sync(fs.loop, bounded)


def call_deadline(nbytes: int = 0) -> float:
    """Seconds one store call moving ``nbytes`` may take in all, its retries included: the
    store timeout for each attempt, and per MiB moved."""
    timeout, retries = store_limits()
    return timeout * (retries + nbytes / (1 << 20))


def store_call(fs, method: str, *args, where: str, nbytes: int = 0, **kw):
    """``fs.method(*args, **kw)`` with a deadline (:func:`call_deadline` of ``nbytes``): an
    existence check, a size, a listing, an upload or a removal that an endpoint trickles or
    never answers is an ``OSError`` naming ``where`` and the limits, never a held run (the
    library's own timeouts are per read, so a byte now and then kept them waiting). Stores
    without an event loop (local files, memory) are called as they are."""
    coro = getattr(fs, f"_{method}", None) if getattr(fs, "async_impl", False) else None
    if coro is None:
        return getattr(fs, method)(*args, **kw)
    return _run(fs, lambda: coro(*args, **kw), where, method, call_deadline(nbytes))
