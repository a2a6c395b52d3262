"""prep's image check against an independent judge, a full Pillow decode, on a corpus of files
truncated at many offsets in each format; and paths that are not regular files."""

from __future__ import annotations

import io
import os
import threading

import numpy as np
import pytest
from PIL import Image

from dataprep.errors import SampleRejected
from dataprep.image_header import probe_image_bytes, probe_image_file
from tests.dataprep.helpers import llava, run, write_jsonl

# a file that lost only its end marker (JPEG EOI, PNG's last IDAT checksum + IEND, GIF's
# trailer, BMP padding) may still decode; the header check rejects it as truncated anyway
END_MARKER_BYTES = 32


def _picture(w: int, h: int) -> Image.Image:
    rng = np.random.default_rng(w * 7919 + h)
    a = (rng.random((h, w, 3)) * 255).astype(np.uint8)
    a[: h // 3] = (30, 90, 160)  # flat areas compress differently from noise
    return Image.fromarray(a)


def _encode(fmt: str, w: int = 97, h: int = 61, **kw) -> bytes:
    buf = io.BytesIO()
    _picture(w, h).save(buf, format=fmt, **kw)
    return buf.getvalue()


def _corpus() -> dict[str, bytes]:
    thumb = _encode("JPEG", 40, 30, quality=30)
    return {
        "jpeg": _encode("JPEG", quality=90),
        "jpeg-large": _encode("JPEG", 640, 420, quality=85),  # bigger than any tail window
        "jpeg-progressive": _encode("JPEG", quality=80, progressive=True),
        # end-of-image markers that are not the end: in a comment and an EXIF thumbnail
        "jpeg-comment": _encode("JPEG", comment=b"x\xff\xd9y" * 4),
        "jpeg-exif-thumbnail": _encode("JPEG", exif=b"Exif\x00\x00" + thumb),
        "png": _encode("PNG"),
        "png-palette": _encode("PNG", 120, 80, optimize=True),
        "gif": _encode("GIF"),
        "webp": _encode("WEBP", quality=80),
        "webp-lossless": _encode("WEBP", lossless=True),
        "bmp": _encode("BMP"),
    }


def _decodes(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            im.convert("RGB")
    except Exception:
        return False
    return True


def _passes(data: bytes, check: str) -> bool:
    try:
        probe_image_bytes(data, "mem", check)
    except SampleRejected:
        return False
    return True


def _cuts(data: bytes) -> list[int]:
    """Offsets to cut at: the first and last 48 bytes, 250 in between, and around where each
    JPEG scan header ends (a file cut there has its header whole and no image data)."""
    n = len(data)
    cuts = set(range(1, min(n, 48))) | set(range(0, n, max(1, n // 250))) | set(range(n - 48, n))
    if data[:2] == b"\xff\xd8":
        for pos in range(2, n - 3):
            if data[pos : pos + 2] == b"\xff\xda":  # SOS, then its 2-byte length
                end = pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
                cuts |= {end - 1, end, end + 1}
    return sorted(c for c in cuts if 0 < c < n)


@pytest.mark.parametrize("name", sorted(_corpus()))
def test_header_check_never_passes_what_a_decode_rejects(name):
    data = _corpus()[name]
    assert _passes(data, "header") and _decodes(data)
    stricter = []
    for cut in _cuts(data):
        piece = data[:cut]
        decodes, passes = _decodes(piece), _passes(piece, "header")
        assert not (passes and not decodes), f"{name} cut at {cut} of {len(data)} passes"
        if decodes and not passes:
            stricter.append(len(data) - cut)
    # where the two differ, the file lost only bytes of its end marker
    assert all(lost <= END_MARKER_BYTES for lost in stricter), (name, stricter)


@pytest.mark.parametrize("name", [n for n in sorted(_corpus()) if n.startswith("jpeg")])
def test_header_check_never_passes_a_jpeg_with_a_damaged_segment_marker(name):
    """Each segment marker before the first scan with its 0xFF byte damaged (a bit flip on a
    disk or in a transfer): the header walk must stop there, never read on from the code byte
    as if the marker were whole. Judge: a full Pillow decode (which skips some junk bytes and
    then decodes: the check may be stricter, never more lenient)."""
    data = _corpus()[name]
    pos, damaged = 2, 0
    while data[pos] == 0xFF:
        code = data[pos + 1]
        bad = data[:pos] + b"\x00" + data[pos + 1 :]
        assert not (_passes(bad, "header") and not _decodes(bad)), (name, hex(code), pos)
        damaged += 1
        if code == 0xDA:  # the first scan's header: image data follows
            break
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    assert damaged >= 5


@pytest.mark.parametrize("name", ["jpeg-comment", "jpeg-exif-thumbnail", "png", "gif", "webp"])
def test_decode_check_agrees_with_a_decode_exactly(name):
    data = _corpus()[name]
    for cut in _cuts(data)[::3]:
        assert _passes(data[:cut], "decode") == _decodes(data[:cut]), (name, cut)


def test_truncated_jpeg_with_an_end_marker_in_its_tail_is_rejected_by_prep(
    tmp_path, tokenizer_path
):
    """The red team's case: the last bytes of a cut JPEG hold an EOI (its EXIF thumbnail's)."""
    data = _corpus()["jpeg-exif-thumbnail"]
    cut = data[: len(data) // 2]
    assert b"\xff\xd9" in cut and not _decodes(cut)
    (tmp_path / "cut.jpg").write_bytes(cut)
    jl = write_jsonl(tmp_path / "d.jsonl", [llava("a", "cut.jpg")])
    _res, rows, errors = run(tmp_path, [jl], tokenizer_path)
    assert rows == [] and errors[0]["reason"] == "truncated_image"
    assert "cut.jpg" in errors[0]["detail"]


def test_fifo_device_and_directory_are_rejected_at_once(tmp_path, tokenizer_path):
    os.mkfifo(tmp_path / "pipe.jpg")  # nobody ever writes to it: opening it blocking would hang
    (tmp_path / "dir.jpg").mkdir()
    os.symlink("/dev/zero", tmp_path / "zero.jpg")  # a device: reading it would never end
    recs = [llava("p", "pipe.jpg"), llava("d", "dir.jpg"), llava("z", "zero.jpg")]
    jl = write_jsonl(tmp_path / "d.jsonl", recs)
    out: dict = {}
    t = threading.Thread(
        target=lambda: out.update(
            r=run(tmp_path, [jl], tokenizer_path, allow_outside_image_root=True)
        ),
        daemon=True,
    )
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "prep hangs on a FIFO"
    _res, rows, errors = out["r"]
    assert rows == []
    assert {e["sample_id"]: e["reason"] for e in errors} == {
        "p": "not_a_file",
        "d": "not_a_file",
        "z": "not_a_file",
    }
    assert all(e["detail"].startswith(str(tmp_path)) for e in errors)


def test_probe_file_refuses_a_fifo_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "f.png")
    with pytest.raises(SampleRejected) as e:
        probe_image_file(tmp_path / "f.png")
    assert e.value.reason == "not_a_file" and "FIFO" in e.value.detail
