"""How the tests' hostile servers (plain HTTP in ``test_http_store``, the S3 proxy in
``test_s3_bodies``) send a body: followed by bytes without end, or a trickle at a time."""

from __future__ import annotations

import time


def send_overflowing(wfile, data: bytes, sent: list[int]) -> None:
    """``data``, then up to 256 MiB more (a body that never ends, capped so a test ends either
    way); appends how much the client took to ``sent``."""
    n = 0
    try:
        wfile.write(data)
        n = len(data)
        chunk = b"\0" * (1 << 20)
        for _ in range(256):
            wfile.write(chunk)
            n += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sent.append(n)


def send_trickle(wfile, data: bytes) -> None:
    """``data`` 512 bytes every 0.1 s (5 KB/s), each piece well inside any read timeout."""
    try:
        for i in range(0, len(data), 512):
            wfile.write(data[i : i + 512])
            wfile.flush()
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass


def send_crawl(wfile, data: bytes, seconds: float = 120.0) -> None:
    """``data`` 16 bytes every 0.2 s (80 B/s: a manifest takes minutes), for ``seconds`` at
    most (so a test ends either way)."""
    end = time.monotonic() + seconds
    try:
        for i in range(0, len(data), 16):
            if time.monotonic() > end:
                return
            wfile.write(data[i : i + 16])
            wfile.flush()
            time.sleep(0.2)
    except (BrokenPipeError, ConnectionResetError):
        pass
