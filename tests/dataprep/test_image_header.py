"""Header probing: sizes without decoding, and every kind of bad image named precisely."""

import io

import pytest
from PIL import Image

from dataprep.errors import SampleRejected
from dataprep.image_header import probe_image_bytes, probe_image_file
from tests.conftest import image_bytes, write_image


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "WEBP", "BMP"])
def test_sizes_of_supported_formats(tmp_path, fmt):
    path = write_image(tmp_path / f"x.{fmt.lower()}", 317, 59, fmt)
    h = probe_image_file(path)
    assert (h.width, h.height, h.format) == (317, 59, fmt)
    assert h.nbytes == path.stat().st_size


def _reason(fn, *args):
    with pytest.raises(SampleRejected) as e:
        fn(*args)
    return e.value


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "WEBP"])
def test_truncated_image_is_rejected(fmt):
    data = image_bytes(640, 480, fmt)
    err = _reason(probe_image_bytes, data[: len(data) * 2 // 3], "mem.img")
    assert err.reason == "truncated_image" and "mem.img" in err.detail


def test_missing_empty_corrupt_unsupported(tmp_path):
    assert _reason(probe_image_file, tmp_path / "nope.jpg").reason == "missing_image"
    (tmp_path / "empty.jpg").write_bytes(b"")
    assert _reason(probe_image_file, tmp_path / "empty.jpg").reason == "empty_image"
    (tmp_path / "junk.jpg").write_bytes(b"this is not an image at all" * 10)
    err = _reason(probe_image_file, tmp_path / "junk.jpg")
    assert err.reason == "corrupt_image" and "junk.jpg" in err.detail
    buf = io.BytesIO()
    Image.new("RGB", (20, 20)).save(buf, format="TIFF")
    assert _reason(probe_image_bytes, buf.getvalue(), "t.tiff").reason == "unsupported_format"


def test_probe_reads_header_not_pixels(tmp_path, monkeypatch):
    path = write_image(tmp_path / "big.jpg", 3000, 2000)
    monkeypatch.setattr(
        Image.Image, "load", lambda self: (_ for _ in ()).throw(AssertionError("decoded"))
    )
    assert probe_image_file(path).width == 3000


@pytest.mark.parametrize("orientation", [1, 6])
def test_camera_multi_picture_jpeg_is_its_first_picture(tmp_path, orientation):
    """An MPO file (a camera's JPEG with a second picture after the first: a preview, a depth
    map) is a JPEG to every decoder: measured as its first picture, as transformers loads it;
    cut inside the first picture it is truncated."""
    from transformers.image_utils import load_image

    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "camera.jpg"
    Image.new("RGB", (300, 100), (9, 80, 160)).save(
        path, format="MPO", save_all=True, append_images=[Image.new("RGB", (60, 20))], exif=exif
    )
    assert Image.open(path).format == "MPO"  # what Pillow calls it
    for check in ("header", "decode"):
        h = probe_image_file(path, check)
        assert h.format == "JPEG"
        assert (h.width, h.height) == load_image(str(path)).size
    assert (h.width, h.height) == ((100, 300) if orientation == 6 else (300, 100))
    data = path.read_bytes()
    first_end = data.index(b"\xff\xd9") + 2  # the first picture's EOI
    cut = data[: first_end - 8]  # inside its scan data
    assert _reason(probe_image_bytes, cut, "c.jpg").reason == "truncated_image"
