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
