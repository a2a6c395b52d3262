"""Image size and format from the file header, and a check that the file is complete.

Pillow's ``Image.open`` parses only the header, so a truncated file still opens. Two checks of
completeness exist (``check``):

* ``"header"`` (default): no pixels are decoded, but the file must reach its end marker. A JPEG
  that ends with EOI is checked by walking its marker segments up to the first scan (a few small
  reads; so an ``FF D9`` at the end that belongs to an embedded thumbnail or a comment is not
  taken for the end), a PNG ending with its ``IEND`` chunk passes; any other file has its whole
  structure walked: JPEG segments and entropy-coded scans up to EOI, PNG chunks up to ``IEND``,
  GIF blocks up to its trailer. WebP's RIFF size and BMP's file size must fit the bytes. A file
  cut short that a full decode would reject is always rejected; a file that lost only its end
  marker (which Pillow may still decode) is rejected too. A JPEG cut inside its image data and
  then given an end marker again (as some repair tools do) passes: only ``"decode"`` sees that
  a progressive one misses scans.
* ``"decode"``: a full Pillow decode (``--check-images decode``), for the exact answer at the
  cost of decoding every pixel.

Image paths are opened non-blocking and must be regular files: a FIFO, a device or a directory
is rejected at once instead of hanging or reading forever.
"""

from __future__ import annotations

import io
import os
import re
import stat
import warnings
from dataclasses import dataclass
from typing import BinaryIO

from PIL import Image

from dataprep.errors import SampleRejected
from dataprep.image_orientation import TURNED, displayed_orientation
from equishard.common.errors import describe

__all__ = [
    "CHECKS",
    "SUPPORTED_FORMATS",
    "ImageHeader",
    "open_image_file",
    "probe_image",
    "probe_image_bytes",
    "probe_image_file",
    "read_image_file",
]

SUPPORTED_FORMATS = frozenset({"JPEG", "PNG", "WEBP", "GIF", "BMP"})
CHECKS = ("header", "decode")
_TAIL = 4096  # bytes read from the end of a file for its end marker
# a JPEG marker inside entropy-coded data: FF followed by anything but a stuffed zero, a
# restart marker (D0-D7) or another fill byte
_JPEG_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


@dataclass(frozen=True, slots=True)
class ImageHeader:
    width: int
    height: int
    format: str
    nbytes: int
    # EXIF orientation (1-8); width and height are the displayed size, after it
    orientation: int = 1


def _jpeg_complete(data: bytes) -> bool:
    n, pos = len(data), 2  # after SOI
    while pos + 2 <= n:
        if data[pos] != 0xFF:
            return False  # not a marker where one is due: damaged, or cut inside a segment
        code = data[pos + 1]
        if code == 0xFF:  # fill byte
            pos += 1
            continue
        if code == 0xD9:  # EOI
            return True
        if 0xD0 <= code <= 0xD7 or code == 0x01:  # markers without a length
            pos += 2
            continue
        if pos + 4 > n:
            return False
        end = pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
        if end > n:
            return False
        if code == 0xDA:  # start of scan: entropy-coded data runs to the next marker
            m = _JPEG_MARKER.search(data, end)
            if m is None:
                return False
            end = m.start()
        pos = end
    return False


def _png_complete(data: bytes) -> bool:
    n, pos = len(data), 8  # after the signature
    while pos + 8 <= n:
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        end = pos + 12 + length  # length, type, data, CRC
        if end > n:
            return False
        if kind == b"IEND":
            return True
        pos = end
    return False


def _gif_subblocks(data: bytes, pos: int) -> int:
    """Position after a run of data sub-blocks (ending with a zero-size block), or -1."""
    n = len(data)
    while pos < n:
        size = data[pos]
        pos += 1 + size
        if size == 0:
            return pos
    return -1


def _gif_complete(data: bytes) -> bool:
    n = len(data)
    if n < 13:
        return False
    flags = data[10]
    pos = 13 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)
    while pos < n:
        block = data[pos]
        if block == 0x3B:  # trailer
            return True
        if block == 0x21:  # extension: label, then sub-blocks
            pos = _gif_subblocks(data, pos + 2)
        elif block == 0x2C:  # image: descriptor, local colour table, LZW code size, sub-blocks
            if pos + 10 > n:
                return False
            local = data[pos + 9]
            pos += 10 + (3 * 2 ** ((local & 7) + 1) if local & 0x80 else 0)
            pos = _gif_subblocks(data, pos + 1)
        else:
            return False
        if pos < 0:
            return False
    return False


_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk: length, type, CRC


def _jpeg_header_to_scan(f: BinaryIO, nbytes: int) -> bool:
    """Walk the marker segments from SOI to the first SOS by their lengths (a few small reads:
    an embedded thumbnail is skipped whole); True when the scan header lies inside the file and
    data follows it."""
    pos = 2
    while True:
        f.seek(pos)
        hdr = f.read(4)
        if len(hdr) < 2 or hdr[0] != 0xFF:
            return False
        code = hdr[1]
        if code == 0xFF:
            pos += 1
            continue
        if 0xD0 <= code <= 0xD7 or code == 0x01:
            pos += 2
            continue
        if code == 0xD9 or len(hdr) < 4:  # an EOI before any scan: no image data
            return False
        end = pos + 2 + int.from_bytes(hdr[2:4], "big")
        if end >= nbytes:
            return False
        if code == 0xDA:
            return True
        pos = end


def _complete(fmt: str, fileobj: BinaryIO, nbytes: int, head: bytes) -> bool:
    if fmt == "WEBP":
        return len(head) >= 8 and int.from_bytes(head[4:8], "little") + 8 <= nbytes
    if fmt == "BMP":
        return len(head) >= 6 and int.from_bytes(head[2:6], "little") <= nbytes
    fileobj.seek(max(0, nbytes - _TAIL))
    tail = fileobj.read(_TAIL).rstrip(b"\x00")
    # The usual case, cheaply: the file ends with its end marker. For JPEG that is the real
    # EOI when the segments up to the first scan are whole (an EOI of a thumbnail or comment
    # sits inside a segment; entropy-coded data never holds FF D9).
    if fmt == "JPEG" and tail.endswith(b"\xff\xd9"):
        return _jpeg_header_to_scan(fileobj, nbytes)
    if fmt == "PNG" and tail.endswith(_PNG_END):
        return True
    # Otherwise (trailing bytes after the end marker, or a cut file): walk the whole structure.
    fileobj.seek(0)
    data = fileobj.read(nbytes)
    return {"JPEG": _jpeg_complete, "PNG": _png_complete, "GIF": _gif_complete}[fmt](data)


def probe_image(fileobj: BinaryIO, nbytes: int, where: str, check: str = "header") -> ImageHeader:
    """Read size and format of the image in ``fileobj`` (its start at position 0, ``nbytes`` long)
    and check that it is complete (``check``: ``"header"`` or ``"decode"``, module docstring).
    The size is the displayed one: width and height swap under an EXIF orientation that turns
    the image (:mod:`dataprep.image_orientation`).

    Raises :class:`SampleRejected` naming ``where`` when the image is empty, unreadable, truncated,
    too large or in an unsupported format.
    """
    if nbytes == 0:
        raise SampleRejected("empty_image", f"{where}: zero bytes")
    fileobj.seek(0)
    head = fileobj.read(16)
    fileobj.seek(0)
    if (
        head[:4] == b"RIFF"
        and head[8:12] == b"WEBP"
        and not _complete("WEBP", fileobj, nbytes, head)
    ):
        # Pillow parses WebP whole: check its size first
        raise SampleRejected("truncated_image", f"{where}: WEBP data ends before its RIFF size")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(fileobj)
            width, height = im.size  # as stored; turned below for the displayed size
            fmt = im.format or "unknown"
            if fmt == "MPO":  # a camera's multi-picture JPEG: its first picture is the image,
                fmt = "JPEG"  # which every JPEG decoder (Pillow, transformers) gives
            if check == "decode" and fmt in SUPPORTED_FORMATS:
                im.load()
    except Image.DecompressionBombError as exc:
        raise SampleRejected("image_too_large", f"{where}: {describe(exc)}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        if check == "decode" and "truncated" in str(exc):
            raise SampleRejected("truncated_image", f"{where}: {describe(exc)}") from None
        raise SampleRejected("corrupt_image", f"{where}: cannot parse ({describe(exc)})") from None
    with im:
        if fmt not in SUPPORTED_FORMATS:
            raise SampleRejected(
                "unsupported_format",
                f"{where}: {fmt} (accepted: {', '.join(sorted(SUPPORTED_FORMATS))})",
            )
        if width <= 0 or height <= 0:
            raise SampleRejected("empty_image", f"{where}: {width}x{height} pixels")
        if check == "header" and not _complete(fmt, fileobj, nbytes, head):
            raise SampleRejected(
                "truncated_image", f"{where}: {fmt} data ends before its end marker"
            )
        try:
            orientation = displayed_orientation(im, fileobj, nbytes)
        except Exception as exc:  # Pillow's EXIF parser on hostile bytes: exif_transpose fails too
            raise SampleRejected(
                "corrupt_image", f"{where}: unreadable EXIF metadata ({exc!r})"
            ) from None
    if orientation in TURNED:  # counted as displayed (image_orientation)
        width, height = height, width
    return ImageHeader(
        width=width, height=height, format=fmt, nbytes=nbytes, orientation=orientation
    )


def _opened_path(fd: int, path: str | os.PathLike) -> str:
    """The real path of the file ``fd`` is open on (Linux's ``/proc/self/fd``: the file itself,
    whatever links its path went through); the path resolved now where there is no /proc."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)


def _check_inside(fd: int, path: str | os.PathLike, root: str) -> None:
    real, top = _opened_path(fd, path), os.path.realpath(root)
    if real != top and not real.startswith(top.rstrip(os.sep) + os.sep):
        os.close(fd)
        raise SampleRejected(
            "unsafe_path",
            f"{path}: the file opened is {real!r:.200}, outside the image root {root!r} (a "
            "link put in its place since its path was checked); pass --allow-outside-image-root "
            "at prep to read such files",
        )


def _open_regular(path: str | os.PathLike, root: str | None = None) -> int:
    """A descriptor of ``path``, which must be a regular file (see :func:`open_image_file`)
    and, with ``root``, lie inside it as opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SampleRejected("missing_image", f"{path}: no such file") from None
    except IsADirectoryError:
        raise SampleRejected("not_a_file", f"{path}: a directory, not an image file") from None
    except OSError as exc:
        raise SampleRejected("missing_image", f"{path}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a directory"
            if stat.S_ISDIR(mode)
            else "not a regular file"
        )
        raise SampleRejected("not_a_file", f"{path}: {kind}, not an image file")
    if root is not None:
        _check_inside(fd, path, root)
    return fd


def open_image_file(path: str | os.PathLike, root: str | None = None) -> BinaryIO:
    """Open an image file for reading; it must be a regular file. Opened non-blocking, so a FIFO
    never hangs; a missing file is ``missing_image``, anything not a regular file
    ``not_a_file``; with ``root``, a file that is not inside it as opened ``unsafe_path``."""
    fd = _open_regular(path, root)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_image_file(
    path: str | os.PathLike, root: str | None = None
) -> tuple[bytes, os.stat_result]:
    """The whole of an image file, under :func:`open_image_file`'s rules, in as few reads as
    the kernel allows (no buffered file object: the shard writer reads every image this way),
    and the file's status taken after the read (a write during the read shows in its mtime)."""
    fd = _open_regular(path, root)
    try:
        parts = []
        # a regular file: O_NONBLOCK changes nothing; read to the end, however long it is now
        size = os.fstat(fd).st_size
        while part := os.read(fd, size + 1 if not parts else 1 << 20):
            parts.append(part)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return (parts[0] if len(parts) == 1 else b"".join(parts)), st


def probe_image_file(path: str | os.PathLike, check: str = "header") -> ImageHeader:
    """Probe an image file on disk (see :func:`open_image_file` for what it must be)."""
    with open_image_file(path) as f:
        return probe_image(f, os.fstat(f.fileno()).st_size, str(path), check)


def probe_image_bytes(data: bytes, where: str, check: str = "header") -> ImageHeader:
    """Probe an image held in memory (an embedded Parquet/HF image column, a shard member)."""
    return probe_image(io.BytesIO(data), len(data), where, check)
