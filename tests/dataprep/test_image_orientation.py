"""Images are counted and decoded as displayed: EXIF orientation applied, as transformers'
``load_image`` and ``datasets.Image`` apply it (the references here)."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from dataprep.image_header import probe_image_bytes
from dataprep.image_orientation import decode_image
from tests.conftest import image_bytes

W, H = 30, 10
XMP = (
    '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF '
    'xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
    'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="{o}"/></rdf:RDF></x:xmpmeta>'
)


def _picture() -> Image.Image:
    """Not symmetric under any flip or turn, so a wrong transpose shows in the pixels."""
    a = np.zeros((H, W, 3), np.uint8)
    a[:, :, 0] = np.arange(W)[None, :] * 8
    a[:, :, 1] = np.arange(H)[:, None] * 20
    return Image.fromarray(a)


def _exif(o) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = o
    return exif.tobytes()


def _saved(fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    _picture().save(buf, format=fmt, **kw)
    return buf.getvalue()


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(4, "big")
        + kind
        + payload
        + zlib.crc32(kind + payload).to_bytes(4, "big")
    )


def _png_late_exif(o: int) -> bytes:
    """A PNG whose eXIf chunk follows its image data (Pillow reads it only when decoding)."""
    data = _saved("PNG")
    end = data.index(b"IEND") - 4
    return data[:end] + _png_chunk(b"eXIf", _exif(o)[6:]) + data[end:]  # without "Exif\0\0"


def _raw_profile(o: int) -> bytes:
    """ImageMagick's way: the EXIF block hex-coded in a text chunk."""
    info = PngImagePlugin.PngInfo()
    data = _exif(o)
    info.add_text("Raw profile type exif", f"\nexif\n{len(data):8}\n{data.hex()}\n")
    return _saved("PNG", pnginfo=info)


def _png_xmp(o: int) -> bytes:
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", XMP.format(o=o))
    return _saved("PNG", pnginfo=info)


CASES = {
    "jpeg-exif": lambda o: _saved("JPEG", exif=_exif(o)),
    "png-exif": lambda o: _saved("PNG", exif=_exif(o)),
    "webp-exif": lambda o: _saved("WEBP", exif=_exif(o), lossless=True),
    "png-exif-after-data": _png_late_exif,
    "png-raw-profile": _raw_profile,
    "jpeg-xmp": lambda o: _saved("JPEG", xmp=XMP.format(o=o).encode()),
    "png-xmp": _png_xmp,
}


def _references(data: bytes, tmp_path) -> list[tuple[int, int]]:
    """The displayed size by transformers' load_image and by datasets' Image feature."""
    import datasets
    from transformers.image_utils import load_image

    path = tmp_path / "image.bin"
    path.write_bytes(data)
    by_datasets = datasets.Image().decode_example({"path": None, "bytes": data})
    return [load_image(str(path)).size, by_datasets.size]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("orientation", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
def test_probe_reports_the_displayed_size(case, orientation, tmp_path):
    data = CASES[case](orientation)
    for check in ("header", "decode"):
        head = probe_image_bytes(data, "x", check)
        assert [(head.width, head.height)] * 2 == _references(data, tmp_path), (case, check)
        assert head.orientation == (orientation if 1 <= orientation <= 8 else 1)
    turned = orientation in (5, 6, 7, 8)
    assert (head.width, head.height) == ((H, W) if turned else (W, H))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
def test_decode_image_equals_transformers_load_image(case, orientation, tmp_path):
    from transformers.image_utils import load_image

    data = CASES[case](orientation)
    (tmp_path / "image.bin").write_bytes(data)
    want = np.asarray(load_image(str(tmp_path / "image.bin")))
    got = decode_image(data)
    assert got.mode == "RGB"
    np.testing.assert_array_equal(np.asarray(got), want)


def test_header_probe_decodes_no_pixels_without_trailing_metadata():
    """A PNG whose image data is damaged but whose chunks are whole passes the header check:
    the orientation is read from the headers, never by decoding (a plain PNG has no EXIF)."""
    data = bytearray(_saved("PNG", exif=_exif(6)))
    start = data.index(b"IDAT") + 4
    length = int.from_bytes(data[start - 8 : start - 4], "big")
    data[start : start + length] = b"\x00" * length  # not zlib: a decode fails
    data[start + length : start + length + 4] = zlib.crc32(
        bytes(data[start - 4 : start + length])
    ).to_bytes(4, "big")
    head = probe_image_bytes(bytes(data), "x", "header")
    assert (head.width, head.height, head.orientation) == (H, W, 6)
    plain = bytearray(_saved("PNG"))
    at = plain.index(b"IDAT") + 4
    n = int.from_bytes(plain[at - 8 : at - 4], "big")
    plain[at : at + n] = b"\x00" * n
    plain[at + n : at + n + 4] = zlib.crc32(bytes(plain[at - 4 : at + n])).to_bytes(4, "big")
    assert probe_image_bytes(bytes(plain), "x", "header").orientation == 1


def test_unparseable_exif_is_read_as_transformers_reads_it(tmp_path):
    """EXIF bytes Pillow cannot parse: no orientation, for transformers as for prep."""
    data = _saved("JPEG", exif=b"Exif\x00\x00garbage-not-tiff")
    head = probe_image_bytes(data, "x")
    assert [(head.width, head.height)] * 2 == _references(data, tmp_path)


def test_turned_photo_costs_what_the_model_sees(tmp_path):
    """A 600 x 200 photo stored sideways (orientation 6): Pixtral and LLaVA-NeXT count rows of
    patches with a break / newline token each, so the turned image costs other tokens; prep
    counts the displayed 200 x 600, which equals the stored-upright image's count."""
    from dataprep.policies import parse_vision_policy

    sideways = probe_image_bytes(image_bytes(600, 200, "JPEG", orientation=6), "x")
    upright = probe_image_bytes(image_bytes(200, 600, "JPEG"), "x")
    assert (sideways.width, sideways.height) == (upright.width, upright.height) == (200, 600)
    for spec in ("pixtral", "llava-next"):
        policy = parse_vision_policy(spec)
        stored = policy.sample_costs([(600, 200)])
        shown = policy.sample_costs([(sideways.width, sideways.height)])
        assert shown == policy.sample_costs([(200, 600)])
        assert shown != stored, spec
