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
    "http_deadline",
    "read_http_range",
    "store_limits",
]

TIMEOUT_ENV, RETRIES_ENV = "EQUISHARD_STORE_TIMEOUT", "EQUISHARD_STORE_RETRIES"
DEFAULT_TIMEOUT, DEFAULT_RETRIES = 30.0, 3


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
    if not (0 < timeout < float("inf")) or retries < 1:
        raise ValueError(
            f"${TIMEOUT_ENV} must be > 0 seconds and ${RETRIES_ENV} >= 1, got {timeout} and "
            f"{retries}"
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


def read_http_range(fs, url: str, offset: int, length: int) -> bytes:
    """Bytes ``offset`` to ``offset + length`` of ``url`` through fsspec's HTTP filesystem
    ``fs`` (its session, options and timeouts), read to at most one byte past ``length``:
    fsspec's ``cat_file`` reads a whole response into memory, so a server that ignores the
    Range header, or answers it with a body that never ends, was read until memory ran out.
    A caller sees ``length + 1`` bytes as "more than asked for". The whole read has a deadline
    too, the store timeout per MiB asked for (plus one): each read waiting at most the timeout
    did not stop a server sending a byte now and then from holding a run for days."""
    from fsspec.asyn import sync

    deadline = http_deadline(length)

    async def get() -> bytes:
        session = await fs.set_session()
        kw = dict(fs.kwargs)
        kw.setdefault("timeout", deadline)
        headers = dict(kw.pop("headers", None) or {})
        headers["Range"] = f"bytes={offset}-{offset + length - 1}"
        async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
            if r.status == 404:
                raise FileNotFoundError(url)
            if r.status == 416:  # a range past the end: nothing there
                return b""
            r.raise_for_status()
            parts, got = [], 0
            while got <= length:  # a stream's read may return less than asked before its end
                part = await r.content.read(min(length + 1 - got, 8 << 20))
                if not part:
                    break
                parts.append(part)
                got += len(part)
            return b"".join(parts)

    return sync(fs.loop, get)
