"""In which order an image's tiles reach the encoder: InternVL's ``dynamic_preprocess`` cuts the
resized image row by row (tile ``i`` at column ``i % cols``, row ``i // cols``) and puts the
thumbnail last; each tile's patches are row-major too. A non-square grid tells row-major from
column-major (a held-out bug swapping the two passed every test: the square grids and the
counts never showed it). The reference is the image itself: every tile is painted with its own
colour before the collator cuts it, and each tile's patches must carry the colour of the
region the reference order puts there."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from dataprep.policies import internvl_grid
from shards.read.collate import Collator
from shards.read.image_units import image_units


def _painted(cols: int, rows: int, tile: int) -> Image.Image:
    """An image of exactly cols x rows tiles, tile (r, c) filled with a colour of its own."""
    a = np.zeros((rows * tile, cols * tile, 3), dtype=np.uint8)
    for r in range(rows):
        for c in range(cols):
            a[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile] = (40 * r + 20, 40 * c + 20, 99)
    return Image.fromarray(a)


@pytest.mark.parametrize(("cols", "rows"), [(3, 1), (1, 3), (3, 2), (2, 3), (4, 1), (2, 2)])
def test_internvl_tiles_reach_the_encoder_row_by_row(tokenizer_path, cols, rows):
    tile = 56
    spec = f"internvl:max_tiles=6,tile_size={tile},patch_size=14"
    col = Collator(tokenizer=tokenizer_path, vision_policy=spec, pixels="uint8")
    img = _painted(cols, rows, tile)
    assert internvl_grid(img.width, img.height, 1, 6, tile) == (cols, rows)
    units = image_units(col._policy, img, raw=True)
    assert len(units) == cols * rows + (cols * rows != 1)  # the thumbnail last
    for i, (patches, hw) in enumerate(units[: cols * rows]):
        r, c = i // cols, i % cols  # dynamic_preprocess's order
        assert hw == (tile // 14, tile // 14)
        px = patches.reshape(-1, 3)
        want = np.array([40 * r + 20, 40 * c + 20, 99])
        assert np.abs(px.astype(int) - want).max() <= 2, (i, (r, c), px[:1])


def test_patches_of_a_non_square_tile_are_row_major():
    """A 2 x 3 patch image (each patch its own colour): patch k is row k // 3, column k % 3."""
    from shards.read.image_units import patches as _patches

    p = 4
    a = np.zeros((2 * p, 3 * p, 3), dtype=np.uint8)
    for r in range(2):
        for c in range(3):
            a[r * p : (r + 1) * p, c * p : (c + 1) * p] = (10 * r, 10 * c, 7)
    rows, hw = _patches(Image.fromarray(a), (3 * p, 2 * p), p, raw=True)
    assert hw == (2, 3)
    for k in range(6):
        assert (rows[k].reshape(-1, 3) == (10 * (k // 3), 10 * (k % 3), 7)).all(), k
