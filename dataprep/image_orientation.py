"""EXIF orientation: every image is counted and decoded as it is displayed.

A camera stores a portrait photo as landscape pixels plus an EXIF ``Orientation`` tag (5 to 8:
turned a quarter). transformers' ``load_image`` and ``datasets.Image`` apply the tag
(``PIL.ImageOps.exif_transpose``), so a model trained through them sees the turned image, and
for the families whose token count is not symmetric in width and height (LLaVA-NeXT's and
LLaVA-OneVision's newline per row of patches, Pixtral's ``[IMG_BREAK]`` per row) its count
differs from the stored pixels'. equishard follows them everywhere: prep measures the displayed
size (:func:`displayed_orientation`, read from the headers without decoding pixels), and the
collators decode with :func:`decode_image`. Whoever decodes shard images itself should apply
``ImageOps.exif_transpose`` too (or use :func:`decode_image`).

Pillow reads the tag from EXIF (JPEG's APP1, WebP's EXIF chunk, PNG's ``eXIf`` or an
ImageMagick "Raw profile type exif" text chunk) and, failing that, from XMP's
``tiff:Orientation``. All of these sit in the headers except a PNG's metadata chunks after its
image data, which Pillow reads only when it decodes: only such a PNG is decoded here.
"""

from __future__ import annotations

import io
from typing import BinaryIO

from PIL import Image, ImageOps

__all__ = ["IMAGE_SIZES", "TURNED", "decode_image", "displayed_orientation"]

# a cost table's metadata says its image sizes (and counts) are the displayed ones; a prep
# --cache from a table without it measures its samples with images again
IMAGE_SIZES = "displayed"

# Orientations that swap width and height (exif_transpose's TRANSPOSE, ROTATE_270, TRANSVERSE,
# ROTATE_90); 2, 3 and 4 mirror or turn half-way and keep the size.
TURNED = frozenset({5, 6, 7, 8})
_ORIENTATION = 0x0112
_BY_VALUE = {o: o for o in range(2, 9)}
_PNG_METADATA = frozenset({b"eXIf", b"tEXt", b"zTXt", b"iTXt"})


def _png_metadata_after_data(fileobj: BinaryIO, nbytes: int) -> bool:
    """Whether a PNG has an EXIF or text chunk after its first ``IDAT`` (chunk headers only:
    8 bytes read per chunk). A chunk running past the end stops the walk: the completeness
    check rejects such a file."""
    pos, seen_data = 8, False
    while pos + 8 <= nbytes:
        fileobj.seek(pos)
        hdr = fileobj.read(8)
        if len(hdr) < 8:
            return False
        kind = hdr[4:8]
        if kind == b"IEND":
            return False
        if kind == b"IDAT":
            seen_data = True
        elif seen_data and kind in _PNG_METADATA:
            return True
        pos += 12 + int.from_bytes(hdr[:4], "big")  # length, type, data, CRC
    return False


def displayed_orientation(im: Image.Image, fileobj: BinaryIO, nbytes: int) -> int:
    """The orientation ``ImageOps.exif_transpose`` would apply to ``im`` (opened by Pillow from
    ``fileobj``, ``nbytes`` long): an int 1-8, 1 when there is none or the tag holds something
    else. Raises what Pillow raises on unreadable EXIF (``ImageOps.exif_transpose`` fails on it
    too)."""
    if (
        im.format == "PNG"
        and "exif" not in im.info
        and not _png_metadata_after_data(fileobj, nbytes)
    ):
        exif = Image.Image.getexif(im)  # what the headers gave, without the plugin's decode
    else:
        exif = im.getexif()  # a PNG's trailing chunks: the plugin decodes, then reads them
    # looked up as exif_transpose looks it up (an IFDRational 6/1 counts as 6; an unhashable
    # value raises there and here)
    return _BY_VALUE.get(exif.get(_ORIENTATION, 1), 1)


def decode_image(data: bytes) -> Image.Image:
    """An encoded image as the model sees it: decoded, EXIF orientation applied (as
    transformers' ``load_image`` does), RGB."""
    im = Image.open(io.BytesIO(data))
    ImageOps.exif_transpose(im, in_place=True)
    return im.convert("RGB")
