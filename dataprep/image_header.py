"""Image size and format from the file header, without decoding pixels.

Pillow's ``Image.open`` parses only the header. A truncated file still has a valid header, so the
end of the file is checked too: JPEG must hold an EOI marker (``FF D9``) in its last bytes (entropy
coded data never holds one, so it marks the end), PNG must end with its ``IEND`` chunk, GIF with its
``;`` trailer, and WebP's RIFF size must match the byte count. Only header and tail are read.
"""

from __future__ import annotations

import io
import os
import warnings
from dataclasses import dataclass
from typing import BinaryIO

from PIL import Image

from dataprep.errors import SampleRejected

__all__ = [
    "SUPPORTED_FORMATS",
    "ImageHeader",
    "probe_image",
    "probe_image_bytes",
    "probe_image_file",
]

SUPPORTED_FORMATS = frozenset({"JPEG", "PNG", "WEBP", "GIF", "BMP"})
_TAIL = 4096


@dataclass(frozen=True, slots=True)
class ImageHeader:
    width: int
    height: int
    format: str
    nbytes: int


def _check_tail(fmt: str, tail: bytes, nbytes: int, head: bytes, where: str) -> None:
    if fmt == "JPEG":
        ok = b"\xff\xd9" in tail
    elif fmt == "PNG":
        ok = b"IEND" in tail[-32:]
    elif fmt == "GIF":
        ok = tail.rstrip(b"\x00").endswith(b";")
    elif fmt == "WEBP":
        ok = len(head) >= 8 and int.from_bytes(head[4:8], "little") + 8 <= nbytes
    else:  # BMP: the header's file size field
        ok = len(head) >= 6 and int.from_bytes(head[2:6], "little") <= nbytes
    if not ok:
        raise SampleRejected("truncated_image", f"{where}: {fmt} data ends before its end marker")


def probe_image(fileobj: BinaryIO, nbytes: int, where: str) -> ImageHeader:
    """Read size and format of the image in ``fileobj`` (its start at position 0, ``nbytes`` long).

    Raises :class:`SampleRejected` naming ``where`` when the image is empty, unreadable, truncated,
    too large or in an unsupported format.
    """
    if nbytes == 0:
        raise SampleRejected("empty_image", f"{where}: zero bytes")
    fileobj.seek(0)
    head = fileobj.read(16)
    fileobj.seek(0)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        _check_tail("WEBP", b"", nbytes, head, where)  # Pillow parses WebP whole: check size first
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(fileobj) as im:
                width, height = im.size
                fmt = im.format or "unknown"
    except Image.DecompressionBombError as exc:
        raise SampleRejected("image_too_large", f"{where}: {exc}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise SampleRejected("corrupt_image", f"{where}: cannot parse header ({exc})") from None
    if fmt not in SUPPORTED_FORMATS:
        raise SampleRejected(
            "unsupported_format",
            f"{where}: {fmt} (accepted: {', '.join(sorted(SUPPORTED_FORMATS))})",
        )
    if width <= 0 or height <= 0:
        raise SampleRejected("empty_image", f"{where}: {width}x{height} pixels")
    fileobj.seek(max(0, nbytes - _TAIL))
    tail = fileobj.read(min(nbytes, _TAIL))
    _check_tail(fmt, tail, nbytes, head, where)
    return ImageHeader(width=width, height=height, format=fmt, nbytes=nbytes)


def probe_image_file(path: str | os.PathLike) -> ImageHeader:
    """Probe an image file on disk; a missing file is a ``missing_image`` rejection."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, errors mapped to reasons
    except FileNotFoundError:
        raise SampleRejected("missing_image", f"{path}: no such file") from None
    except OSError as exc:
        raise SampleRejected("missing_image", f"{path}: {exc.strerror}") from None
    with f:
        return probe_image(f, os.fstat(f.fileno()).st_size, str(path))


def probe_image_bytes(data: bytes, where: str) -> ImageHeader:
    """Probe an image held in memory (an embedded Parquet/HF image column)."""
    return probe_image(io.BytesIO(data), len(data), where)
