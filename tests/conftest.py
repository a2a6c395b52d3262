"""Shared fixtures: real image bytes, the demo tokenizer, and small helpers."""

from __future__ import annotations

import io
from importlib import resources
from pathlib import Path

import pytest
from PIL import Image


def image_bytes(width: int, height: int, fmt: str = "JPEG", orientation: int = 1) -> bytes:
    """A real encoded image of the given stored size; ``orientation`` != 1 adds that EXIF
    Orientation tag (5-8: displayed turned, ``height`` x ``width``)."""
    buf = io.BytesIO()
    img = Image.new("RGB", (width, height), (40, 120, 200))
    if orientation == 1:
        img.save(buf, format=fmt)
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        img.save(buf, format=fmt, exif=exif)
    return buf.getvalue()


def write_image(
    path: Path, width: int, height: int, fmt: str = "JPEG", orientation: int = 1
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image_bytes(width, height, fmt, orientation))
    return path


@pytest.fixture(scope="session")
def tokenizer_path() -> str:
    with resources.as_file(resources.files("dataprep") / "assets" / "demo_tokenizer.json") as p:
        return str(p)
