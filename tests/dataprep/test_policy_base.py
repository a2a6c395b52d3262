"""What every vision policy inherits (dataprep/policies/base.py), value by value.

Bugs these catch: an image's encoder tokens not the sum of its tiles' lengths; a cost or a
policy that can be changed after it is made (a cached cost edited under a later sample); a
default ``sample_costs`` that reorders, drops or repeats a sample's images; a default
``prompt`` that rewrites the text; ``describe`` (what the generation records of the policy)
without its spec, kind or options; the base class usable as a policy; the closest-grid rule
taking a later, equally close grid for an image of half its tiles' area or less."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from dataprep.policies.base import (
    ImageCost,
    VisionPolicy,
    check_field_types,
    closest_aspect_grid,
    tile_grids,
)


def test_an_images_encoder_tokens_are_its_tiles_summed():
    cost = ImageCost(vit_seq_lens=(256, 256, 64), llm_tokens=600)
    assert cost.vit_tokens == 576
    assert ImageCost(vit_seq_lens=(), llm_tokens=0).vit_tokens == 0
    assert (cost.text, cost.after, cost.before) == ("", "", "")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cost.llm_tokens = 1
    assert not hasattr(cost, "__dict__")  # slotted: costs are cached by the thousand


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Tiles(VisionPolicy):
    """A policy for the base's defaults: one tile of ``side`` tokens per 100 px of width."""

    side: int = 4
    name: str = "tiles"

    def image_cost(self, width, height):
        tiles = max(1, width // 100)
        return ImageCost(vit_seq_lens=(self.side,) * tiles, llm_tokens=tiles * self.side + height)

    def spec(self):
        return f"{self.name}:side={self.side}"


def test_sample_costs_are_each_images_own_in_order():
    policy = _Tiles()
    sizes = [(300, 1), (100, 2), (300, 1), (250, 7)]
    got = policy.sample_costs(sizes)
    assert got == [policy.image_cost(w, h) for w, h in sizes]
    assert [c.llm_tokens for c in got] == [13, 6, 13, 15]
    assert policy.sample_costs([]) == []


def test_the_default_prompt_is_the_text_unchanged():
    text = "<image>\nDescribe <image> twice.  "
    assert _Tiles().prompt(text) is text


def test_describe_records_the_spec_the_kind_and_every_option():
    assert _Tiles(side=9).describe() == {
        "spec": "tiles:side=9",
        "kind": "_Tiles",
        "side": 9,
        "name": "tiles",
    }


def test_the_base_is_no_policy_and_checks_its_subclasses_options():
    base = VisionPolicy()
    with pytest.raises(NotImplementedError):
        base.image_cost(10, 10)
    with pytest.raises(NotImplementedError):
        base.spec()
    with pytest.raises(ValueError, match=r"_Tiles\.side"):
        _Tiles(side=2.5)
    with pytest.raises(ValueError, match=r"_Tiles\.name must be a string, got 3"):
        _Tiles(name=3)
    with pytest.raises(TypeError):
        _Tiles(4)  # keyword-only
    with pytest.raises(dataclasses.FrozenInstanceError):
        _Tiles().side = 5


def test_a_field_without_a_checked_type_is_left_as_it_is():
    @dataclasses.dataclass(frozen=True)
    class Rule:
        grids: tuple = (1, "x")
        extra: Any = None  # a name before "bool" in sort order: still no switch
        sizes: Sequence[int] = ()
        n: int = 3

    check_field_types(Rule())  # these are the family's own to check


def test_tile_grids_count_then_columns_then_rows():
    """By hand: 1..4 tiles of at most 4 a side, by tile count (stable), columns first."""
    assert tile_grids(1, 4, 4) == ((1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (1, 4), (2, 2), (4, 1))
    assert tile_grids(2, 2, 1) == ()
    assert tile_grids(3, 3, 3) == ((1, 3), (3, 1))
    assert tile_grids(0, 2, 2) == tile_grids(1, 2, 2)  # a side of 0 tiles is no grid


def test_the_later_grid_needs_more_than_half_its_tiles_area_at_below_and_above():
    """3..4 tiles of 448 px, an image of aspect 2: 3 x 1 (aspect 3) and 2 x 2 (aspect 1) are
    equally close, 2 x 2 comes later. 896 x 448 is exactly half of 2 x 2's area (4 tiles of
    448^2 = 802,816 px^2): not more, so 3 x 1 stays; one pixel row more and 2 x 2 wins. The
    same as transformers' GOT-OCR2 (InternVL -hf) image processor."""
    grids = tile_grids(3, 4, 4)
    for (w, h), want in (((894, 447), (3, 1)), ((896, 448), (3, 1)), ((898, 449), (2, 2))):
        assert closest_aspect_grid(w, h, grids, 448) == want, (w, h)
    got = pytest.importorskip("transformers.models.got_ocr2.image_processing_pil_got_ocr2")
    for w, h in ((894, 447), (896, 448), (898, 449)):
        assert closest_aspect_grid(w, h, grids, 448) == tuple(
            got.get_optimal_tiled_canvas((h, w), (448, 448), 3, 4)
        )


def test_the_closest_grid_by_aspect_then_the_later_one_only_for_a_large_image():
    """Grids (1, 1) and (2, 2) are equally close for a square image: the later one wins only
    while the image's area is more than half of its 4 tiles' (tile 10: 200 px^2)."""
    grids = [(1, 1), (2, 2), (2, 1)]
    assert closest_aspect_grid(14, 14, grids, 10) == (1, 1)  # 196 px^2: not more than half
    assert closest_aspect_grid(15, 15, grids, 10) == (2, 2)  # 225 px^2
    assert closest_aspect_grid(20, 10, grids, 10) == (2, 1)  # exactly 2:1
    assert closest_aspect_grid(31, 10, grids, 10) == (2, 1)  # 3.1: 2 is nearer than 1
    # no grid: the single tile; an earlier grid is kept over an equally close later one that
    # is farther than the best so far
    assert closest_aspect_grid(30, 10, [], 10) == (1, 1)
    assert closest_aspect_grid(30, 10, [(2, 1), (1, 1)], 10) == (2, 1)
