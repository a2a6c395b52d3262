"""Granite Docling's policy at its limits: the spread rule's aspect and scale thresholds at,
below and above them, the later grid's half-area rule at it, against the image processor's own
``get_tile_grid`` and ``get_number_of_image_patches``; each setting's limits with its message;
the prompt text by hand; the spec.

Bugs these catch: a threshold that takes the page exactly at it (``>=`` for ``>``, ``<=`` for
``<``), the scale measured on rows instead of columns, a grid side past the tokenizer's 16
markers, a single tile given a thumbnail, the spread rule's settings taken below their limits."""

from __future__ import annotations

import itertools

import pytest

from dataprep.policies import parse_vision_policy
from dataprep.policies.granite_docling import GraniteDoclingPolicy
from dataprep.records import IMAGE_PLACEHOLDER as P
from tests.conftest import built_or_refused

F = "<fake_token_around_image>"

RULES = [
    ("granite-docling", {}),
    (
        "granite-docling:dense_max_tiles=48,dense_max_scale=1.0,dense_min_aspect=1.5",
        {"dense_max_patches": 48, "dense_max_scale": 1.0, "dense_min_aspect": 1.5},
    ),
    (
        "granite-docling:dense_max_tiles=48,dense_min_aspect=1.25,dense_max_aspect=4.0",
        {"dense_max_patches": 48, "dense_min_aspect": 1.25, "dense_max_aspect": 4.0},
    ),
    ("granite-docling:max_tiles=4,min_tiles=3", {"max_patches": 4, "min_patches": 3}),
    # 7 x 5 (35 tiles, aspect 1.4) only within the rule's 48: a page at the thresholds gets it
    # or not
    (
        "granite-docling:dense_max_tiles=48,dense_max_scale=1.0,dense_min_aspect=1.4",
        {"dense_max_patches": 48, "dense_max_scale": 1.0, "dense_min_aspect": 1.4},
    ),
]


def _sizes():
    """Pages exactly at the aspects 1.25, 1.4, 1.5 and 4 (and a pixel either side), whose columns
    times 512 are exactly their width (scale 1), and at the half-area tie of 3..4 tiles."""
    out = set()
    for k in (400, 800, 1200, 2000):
        for num, den in ((5, 4), (3, 2), (4, 1), (2, 1)):
            w, h = k * num // den, k
            out.update((w + e, h) for e in (-1, 0, 1))
    for cols in range(1, 9):
        out.update((cols * 512 + e, h) for e in (-1, 0, 1) for h in (300, 512, 700))
    out.update({(1024, 512), (1026, 513), (1022, 511)})  # 0.5 x 512^2 x 4 tiles exactly
    # aspect exactly 1.4 (4 columns of 512 under its 2800 px: scale 0.73); 4 columns exactly
    # 2048 px wide (scale 1.0), aspect just past 1.4
    out.update((2800 + e, 2000) for e in (-1, 0, 1))
    out.update((2048 + e, 1460) for e in (-1, 0, 1))
    return sorted(out)


@pytest.mark.parametrize(("spec", "kwargs"), RULES)
def test_grids_at_every_threshold_equal_the_image_processors(spec, kwargs):
    pytest.importorskip("transformers")
    from transformers.models.granite_docling import GraniteDoclingImageProcessorPil

    policy = parse_vision_policy(spec)
    ip = GraniteDoclingImageProcessorPil(**kwargs)
    wrong = []
    for w, h in itertools.chain(_sizes(), ((h, w) for w, h in _sizes())):
        want = (ip.get_tile_grid(h, w), ip.get_number_of_image_patches(h, w))
        if (policy.grid(w, h), len(policy.image_cost(w, h).vit_seq_lens)) != want:
            wrong.append(((w, h), want, policy.grid(w, h)))
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"


@pytest.mark.parametrize(
    ("kw", "bad"),
    [
        ({"min_tiles": 1, "max_tiles": 1}, None),
        ({"min_tiles": 0}, "1 <= min_tiles <= max_tiles, got 0..32"),
        ({"min_tiles": 33}, "got 33..32"),
        ({"patch_size": 16, "tile_size": 16}, None),
        ({"patch_size": 0}, "tile_size a multiple of patch_size and tokens_per_tile >= 1"),
        ({"tile_size": 15}, "got 15, 16, 64"),
        ({"tile_size": 520}, "got 520, 16, 64"),
        ({"tokens_per_tile": 0}, "got 512, 16, 0"),
        ({"tokens_per_tile": 1}, None),
        ({"dense_max_tiles": 0}, None),  # off
        ({"dense_max_tiles": -1}, "dense_max_tiles must be a whole number in 0.."),
        ({"dense_max_tiles": 2, "min_tiles": 2}, None),  # at min_tiles
        ({"dense_max_tiles": 1, "min_tiles": 2}, "got 1 and"),
        ({"dense_max_scale": 0.0, "dense_min_aspect": 0.0, "dense_max_aspect": 0.0}, None),
        ({"dense_max_scale": -0.5}, "thresholds >= 0"),
        ({"dense_min_aspect": -0.5}, "thresholds >= 0"),
        ({"dense_max_aspect": -0.5}, "thresholds >= 0"),
    ],
)
def test_settings_at_below_and_above_their_limits(kw, bad):
    p = built_or_refused(GraniteDoclingPolicy, kw, bad)
    if p is None:
        return
    rows, cols = p.grid(1000, 700)
    n = len(p.image_cost(1000, 700).vit_seq_lens)
    assert n == (1 if rows * cols == 1 else rows * cols + 1)


def test_the_prompt_by_hand():
    """2 x 2 tiles: each tile's fake token and position marker before its tokens, a newline a
    row, a blank line and the global tile's markers; its tokens the template's placeholder,
    a fake token after. One tile: its marker, the newline after."""
    p = GraniteDoclingPolicy()
    assert p.grid(1024, 1024) == (2, 2)
    c = p.image_cost(1024, 1024)
    grid = f"{F}<row_1_col_1>{P}{F}<row_1_col_2>{P}\n{F}<row_2_col_1>{P}{F}<row_2_col_2>{P}\n"
    assert c.text == grid + f"\n{F}<global-img>" and c.after == F
    assert c.vit_seq_lens == (1024,) * 5 and c.llm_tokens == 64 * 5
    one = GraniteDoclingPolicy(split=False).image_cost(1024, 1024)
    assert (one.text, one.after, one.vit_seq_lens) == (f"{F}<row_1_col_1>", "\n", (1024,))
    assert GraniteDoclingPolicy(fine=True).image_cost(100, 100).llm_tokens == 256


def test_a_grid_side_stays_within_the_tokenizers_16_markers():
    p = GraniteDoclingPolicy(max_tiles=64)
    rows, cols = p.grid(40000, 100)
    assert cols == 16 and rows == 1


def test_the_spec_names_the_spread_rule_only_where_it_is_set():
    assert GraniteDoclingPolicy().spec() == (
        "granite-docling:max_tiles=32,min_tiles=1,tile_size=512,patch_size=16,"
        "tokens_per_tile=64,fine=0,split=1"
    )
    p = GraniteDoclingPolicy(dense_max_tiles=48, dense_min_aspect=1.5)
    assert p.spec().endswith(
        ",dense_max_tiles=48,dense_max_scale=0.0,dense_min_aspect=1.5,dense_max_aspect=0.0"
    )
    assert parse_vision_policy(p.spec()) == p
    q = GraniteDoclingPolicy(dense_max_aspect=2.0)
    assert "dense_max_aspect=2.0" in q.spec() and parse_vision_policy(q.spec()) == q
