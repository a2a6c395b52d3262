"""How a sample becomes tar members: its WebDataset key, its JSON document, its image names,
and the member headers themselves.

Members are regular files with a fixed owner, mode and mtime, so the tars are byte-for-byte
deterministic. Their headers are what ``tarfile.TarInfo.tobuf`` writes for the PAX format; for
the common case (an ASCII name of at most 100 bytes and a size below 8 GiB: plain ustar, no
extended header) :func:`add_member` fills a cached ustar header instead of building a
``TarInfo`` (a test checks both give the same bytes), and it falls back to ``tarfile`` otherwise.
"""

from __future__ import annotations

import tarfile

from dataprep.errors import SampleRejected
from shards.format.sample_doc import sample_doc, sample_key  # re-exported: how a sample is named

__all__ = ["add_member", "add_member_stream", "image_ext", "sample_doc", "sample_key"]

STREAM_CHUNK = 1 << 20  # a streamed member is copied this many bytes at a time

_MAGIC = ((b"\xff\xd8", "jpg"), (b"\x89PNG", "png"), (b"GIF8", "gif"), (b"BM", "bmp"))


def image_ext(data: bytes) -> str:
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    raise SampleRejected("unsupported_format", "image bytes are not JPEG, PNG, GIF, WebP or BMP")


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mtime = 0
    ti.mode = 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


# A ustar header with an empty name and size 0; name (0:100), size (124:136) and checksum
# (148:156) are filled per member. The checksum is the byte sum with its own field as spaces.
_TEMPLATE = bytearray(_tarinfo("", 0).tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
_TEMPLATE[148:156] = b" " * 8
_TEMPLATE_SUM = sum(_TEMPLATE) - sum(_TEMPLATE[124:136])  # the name field is all NULs
_MAX_SIZE = 8**11  # sizes from here on need a PAX header


def ustar_header(name: str, size: int) -> bytes | None:
    """The header ``tarfile`` writes for a regular member (PAX format), or None when the name
    or size needs more than plain ustar (then use ``tarfile``)."""
    if size >= _MAX_SIZE or len(name) > 100 or not name.isascii():
        return None
    raw = name.encode("ascii")
    size_field = b"%011o\0" % size
    header = bytearray(_TEMPLATE)
    header[: len(raw)] = raw
    header[124:136] = size_field
    chksum = _TEMPLATE_SUM + sum(raw) + sum(size_field)
    header[148:156] = b"%06o\0 " % chksum
    return bytes(header)


def add_member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    """Append one regular member: what ``TarFile.addfile`` writes, without its 16 KiB copy loop
    (small members go out in one write, with their header and padding)."""
    header = ustar_header(name, len(data))
    if header is None:
        header = _tarinfo(name, len(data)).tobuf(tf.format, tf.encoding, tf.errors)
    pad = -len(data) % tarfile.BLOCKSIZE
    if len(data) < 1 << 16:
        tf.fileobj.write(header + data + b"\0" * pad)
    else:
        tf.fileobj.write(header)
        tf.fileobj.write(data)
        tf.fileobj.write(b"\0" * pad)
    tf.offset += len(header) + len(data) + pad


def add_member_stream(tf: tarfile.TarFile, name: str, f, size: int) -> None:
    """Append one regular member of ``size`` bytes read from the open file ``f`` (from its
    current position) a chunk at a time: a video of hundreds of MB is never held whole. A file
    that ends before ``size`` bytes is an ``OSError`` (the shard is not finished)."""
    header = ustar_header(name, size)
    if header is None:
        header = _tarinfo(name, size).tobuf(tf.format, tf.encoding, tf.errors)
    tf.fileobj.write(header)
    left = size
    while left:
        chunk = f.read(min(STREAM_CHUNK, left))
        if not chunk:
            raise OSError(f"{name}: the file ended {left} bytes before its {size} bytes")
        tf.fileobj.write(chunk)
        left -= len(chunk)
    pad = -size % tarfile.BLOCKSIZE
    tf.fileobj.write(b"\0" * pad)
    tf.offset += len(header) + size + pad
