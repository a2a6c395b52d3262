"""Ovis2's policy: each setting at, below and above its limit with its message, the prompt's
markers by hand, the covering rule's 90 % threshold at and around it, and the spec.

Bugs these catch: a limit of 1 taken as 0 (or refused), a tile equal to the patch refused,
the merge's padding dropped (``floor`` for ``ceil``: 121 atoms become 100 with stride 3), the
markers of a row and of a column swapped, a thumbnail on a one-tile image, a grid that covers
exactly 90 % taken as covering enough, one tile where ``max_tiles=1`` has the processor not
crop at all."""

from __future__ import annotations

import math

import pytest

from dataprep.policies import parse_vision_policy
from dataprep.policies.ovis2 import Ovis2Policy, ovis2_covering_grid
from dataprep.records import IMAGE_PLACEHOLDER as P
from tests.conftest import built_or_refused


@pytest.mark.parametrize(
    ("kw", "bad"),
    [
        ({"min_tiles": 1, "max_tiles": 1}, None),
        ({"min_tiles": 0}, "1 <= min_tiles <= max_tiles, got 0..12"),
        ({"min_tiles": 12}, None),
        ({"min_tiles": 13}, "got 13..12"),
        ({"patch_size": 14, "tile_size": 14, "hidden_stride": 1}, None),  # one patch a tile
        ({"patch_size": 0}, "tile_size a multiple of patch_size and hidden_stride >= 1"),
        ({"hidden_stride": 0}, "hidden_stride=0"),
        ({"tile_size": 13}, "tile_size=13, patch_size=14"),
        ({"tile_size": 450}, "tile_size=450, patch_size=14"),
    ],
)
def test_settings_at_below_and_above_their_limits(kw, bad):
    p = built_or_refused(Ovis2Policy, kw, bad)
    if p is None:
        return
    side = p.tile_size // p.patch_size
    assert p.patches_per_tile == side * side
    assert p.llm_tokens_per_tile == math.ceil(side / p.hidden_stride) ** 2


@pytest.mark.parametrize(("stride", "atoms"), [(1, 1024), (2, 256), (3, 121), (32, 1), (33, 1)])
def test_atoms_pad_the_patch_grid_up_to_the_stride(stride, atoms):
    assert Ovis2Policy(hidden_stride=stride).llm_tokens_per_tile == atoms


def test_the_markers_by_hand():
    """A wide 1344 x 896 image: the covering grid is 2 x 3 (2 rows of the height, 3 columns),
    which transformers writes as 3 rows of 2 tiles (it reads the grid's rows as columns). The
    thumbnail's atoms after the start, the grid marker, a column marker between the tiles of a
    row, a row marker between rows; one tile: the grid marker and no thumbnail."""
    p = Ovis2Policy()
    assert ovis2_covering_grid(1344, 896, 448, 12) == (2, 3)
    assert p.grid(1344, 896) == (3, 2)
    c = p.image_cost(1344, 896)
    row = f"{P}<IMG_COL>{P}"
    assert c.text == f"<IMG_START>{P}<IMG_GRID>{row}<IMG_ROW>{row}<IMG_ROW>{row}<IMG_END>"
    assert c.vit_seq_lens == (1024,) * 7 and c.llm_tokens == 256 * 7
    one = p.image_cost(448, 448)
    assert one.text == f"<IMG_START>{P}<IMG_GRID><IMG_END>"
    assert one.vit_seq_lens == (1024,) and one.llm_tokens == 256


def test_max_tiles_1_is_one_tile_whatever_the_image():
    p = Ovis2Policy(max_tiles=1)
    assert p.grid(4000, 100) == (1, 1)
    assert p.image_cost(4000, 100).vit_seq_lens == (1024,)


def test_the_covering_threshold_is_strictly_more_than_it():
    """896 x 448 in one tile: the cell shrinks to 448 x 224, a quarter of the image covered;
    in 1 x 2 tiles all of it. With the threshold at exactly a quarter, one tile is not enough;
    just under it, it is."""
    assert ovis2_covering_grid(448, 448, 448, 12) == (1, 1)
    assert ovis2_covering_grid(896, 448, 448, 12) == (1, 2)
    assert ovis2_covering_grid(896, 448, 448, 12, threshold=0.25) == (1, 2)
    assert ovis2_covering_grid(896, 448, 448, 12, threshold=0.2499) == (1, 1)
    # no grid covers enough: the most covering one
    assert ovis2_covering_grid(100000, 10, 448, 2, threshold=0.9) == (1, 2)


def test_the_spec_names_every_setting():
    p = Ovis2Policy(max_tiles=9, tile_size=392, patch_size=14, hidden_stride=3, covering=False)
    assert p.spec() == (
        "ovis2:max_tiles=9,tile_size=392,patch_size=14,hidden_stride=3,covering=0,min_tiles=1"
    )
    assert parse_vision_policy(p.spec()) == p
    with pytest.raises(TypeError):
        Ovis2Policy(12)  # keyword-only
