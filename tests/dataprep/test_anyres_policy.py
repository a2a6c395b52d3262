"""LLaVA-NeXT's and LLaVA-OneVision's anyres policies at their limits: each setting at, below
and above it with its message, the grid list's parsing, ``best_resolution``'s rule and ties by
hand, a sample of several images, the specs.

Bugs these catch: a tile equal to the patch refused, a limit of 1 taken as 0, a grid of 0
tiles or a malformed grid taken, the later of two equal grids chosen (the first wins ties), a
grid that keeps as many pixels chosen over one that wastes less, scaling up past the image's
own pixels counted as kept, OneVision's multi-image samples cut anyres (each is one tile and a
newline), LLaVA-NeXT's not."""

from __future__ import annotations

import pytest

from dataprep.policies import parse_vision_policy
from dataprep.policies.anyres import (
    LlavaNextPolicy,
    OneVisionPolicy,
    best_resolution,
    parse_grids,
    square_grids,
)
from tests.conftest import built_or_refused


@pytest.mark.parametrize(
    ("cls", "kw", "bad"),
    [
        (OneVisionPolicy, {"patch_size": 14, "tile_size": 14, "max_grid": 1, "max_tiles": 1}, None),
        (OneVisionPolicy, {"patch_size": 0}, "patch_size >= 1 and tile_size >= patch_size"),
        (OneVisionPolicy, {"tile_size": 13}, "got tile_size=13, patch_size=14"),
        (OneVisionPolicy, {"max_grid": 0}, "max_grid >= 1 and max_tiles >= 1, got 0 and 9"),
        (OneVisionPolicy, {"max_tiles": 0}, "got 6 and 0"),
        (LlavaNextPolicy, {"patch_size": 14, "tile_size": 14, "grids": "1x1"}, None),
        (LlavaNextPolicy, {"patch_size": 0}, "llava-next needs patch_size >= 1"),
        (LlavaNextPolicy, {"tile_size": 13}, "got tile_size=13, patch_size=14"),
        (LlavaNextPolicy, {"grids": "0x1"}, "bad grids '0x1'"),
    ],
)
def test_settings_at_below_and_above_their_limits(cls, kw, bad):
    p = built_or_refused(cls, kw, bad)
    if p is None:
        return
    c = p.image_cost(100, 100)
    side = p.tile_size // p.patch_size
    assert set(c.vit_seq_lens) == {side * side}


@pytest.mark.parametrize(
    ("text", "grids"),
    [("1x1", ((1, 1),)), ("1x2.2x1", ((1, 2), (2, 1))), ("12x3", ((12, 3),))],
)
def test_grids_parse_in_order(text, grids):
    assert parse_grids(text) == grids


@pytest.mark.parametrize("text", ["", "1x", "x1", "1-2", "1x0", "0x0", "1x2.", "ax1", "1x2x3"])
def test_a_malformed_grid_list_is_refused_with_the_form_to_write(text):
    with pytest.raises(ValueError, match=r"height x width, joined by '\.'"):
        parse_grids(text)


def test_best_resolution_by_hand():
    """Most pixels kept once scaled to fit, never more than the image has; then the least
    area left empty; the first of equals."""
    grids = ((336, 672), (672, 336), (672, 672))
    # a 300 x 600 (h x w) image: 336 x 672 keeps all its pixels and wastes the least
    assert best_resolution(300, 600, grids) == (336, 672)
    # 600 x 600: 672 x 672 keeps all, the others half
    assert best_resolution(600, 600, grids) == (672, 672)
    # a tiny image keeps all its pixels in each: the least waste wins (336 x 672 first)
    assert best_resolution(10, 10, grids) == (336, 672)
    # equal in both: the first listed wins
    assert best_resolution(10, 10, ((336, 672), (672, 336))) == (336, 672)
    assert best_resolution(10, 10, ((672, 336), (336, 672))) == (672, 336)
    assert square_grids(2, 2) == ((2, 2), (2, 4), (4, 2), (4, 4))


def test_onevision_several_images_are_one_tile_and_a_newline_each():
    p = OneVisionPolicy()
    one = p.sample_costs([(2000, 1000)])
    assert one == [p.image_cost(2000, 1000)] and len(one[0].vit_seq_lens) > 1
    several = p.sample_costs([(2000, 1000), (10, 10), (640, 480)])
    assert several == [several[0]] * 3
    assert several[0].vit_seq_lens == (729,) and several[0].llm_tokens == 730
    assert p.sample_costs([]) == []


def test_llava_next_cuts_every_image_of_a_sample_anyres():
    p = LlavaNextPolicy()
    sizes = [(2000, 1000), (10, 10)]
    assert p.sample_costs(sizes) == [p.image_cost(w, h) for w, h in sizes]
    assert len(p.image_cost(2000, 1000).vit_seq_lens) == 3  # 1 x 2 tiles and the base


def test_the_specs_name_every_setting():
    o = OneVisionPolicy(tile_size=336, max_grid=4, max_tiles=6)
    assert o.spec() == "llava-onevision:tile_size=336,patch_size=14,max_grid=4,max_tiles=6"
    assert parse_vision_policy(o.spec()) == o
    n = LlavaNextPolicy(grids="1x1.2x2")
    assert n.spec() == "llava-next:tile_size=336,patch_size=14,grids=1x1.2x2"
    assert parse_vision_policy(n.spec()) == n
    assert n.pinpoints == ((336, 336), (672, 672))
    with pytest.raises(TypeError):
        OneVisionPolicy(384)  # keyword-only
