"""Vision policies against hand-worked cases of the published formulas."""

import numpy as np
import pytest
from PIL import Image

from dataprep.errors import SampleRejected
from dataprep.policies import (
    POLICIES,
    FixedPolicy,
    InternVLPolicy,
    Qwen2VLPolicy,
    internvl_grid,
    parse_vision_policy,
    qwen2vl_smart_resize,
)
from tests.dataprep.processor_output import image_tokens, sizes


def test_fixed_llava15_is_576_for_any_size():
    p = parse_vision_policy("fixed:336/14")
    assert isinstance(p, FixedPolicy)
    for w, h in [(1, 1), (336, 336), (4000, 100)]:
        c = p.image_cost(w, h)
        assert c.vit_seq_lens == (576,) and c.llm_tokens == 576 and c.vit_tokens == 576


def test_fixed_default_is_llava15():
    """``FixedPolicy()`` (the reference trainer's vision tower) is LLaVA-1.5's 336 / 14."""
    p = FixedPolicy()
    assert p.spec() == "fixed:336/14" and p.image_cost(7, 9).llm_tokens == 576


@pytest.mark.parametrize(
    ("spec", "tokens"),
    [
        ("fixed:1/1", 1),  # the smallest size and patch
        ("fixed:28/14", 4),  # divisible, whatever their bits (28 & 14 is not 0)
        ("fixed:14/14", 1),  # one patch
    ],
)
def test_fixed_sizes_at_the_limits_are_taken(spec, tokens):
    assert parse_vision_policy(spec).image_cost(500, 300).llm_tokens == tokens


@pytest.mark.parametrize(
    "spec",
    [
        "fixed:0/14",  # no image size
        "fixed:336/0",  # no patch: refused, not a ZeroDivisionError
        "fixed:17/14",  # not divisible (17 & 14 is 0: a bit test would let it through)
        "fixed:13/14",  # a patch larger than the image
    ],
)
def test_fixed_sizes_that_are_no_policy_are_refused_naming_the_fix(spec):
    with pytest.raises(ValueError, match=r"divisible by patch_size.*fixed:336/14"):
        parse_vision_policy(spec)


@pytest.mark.parametrize("name", [*sorted(POLICIES), "fixed:336/14"])
def test_every_policy_is_an_immutable_hashable_value(name):
    """A policy is a setting prep records and the packer compares: equal specs give equal,
    hashable policies (cached and compared by value), none can be changed after it is checked
    (a field set later would skip ``__post_init__``'s checks), and each is keyword-only."""
    import dataclasses

    policy = parse_vision_policy(name)
    assert policy == parse_vision_policy(name) and hash(policy) == hash(parse_vision_policy(name))
    field = dataclasses.fields(policy)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(policy, field, getattr(policy, field))
    for f in dataclasses.fields(policy):  # keyword-only: no value is taken for another field
        with pytest.raises(TypeError):
            type(policy)(getattr(policy, f.name))


def test_fixed_policy_is_keyword_only():
    with pytest.raises(TypeError):
        FixedPolicy(336, 14)


@pytest.mark.parametrize(
    ("w", "h", "grid", "tiles"),
    [
        (448, 448, (1, 1), 1),  # one tile, no thumbnail
        (896, 448, (2, 1), 3),  # aspect 2; (4, 2) ties but the image is under half its area
        (1792, 896, (4, 2), 9),  # aspect 2 and large: the tie goes to (4, 2); 8 tiles + thumbnail
        (800, 600, (4, 3), 13),  # exact 4:3 grid is allowed with 12 tiles
        (10, 10, (1, 1), 1),  # tiny
        (4000, 10, (12, 1), 13),  # extreme aspect ratio: the widest grid
        (10, 4000, (1, 12), 13),
    ],
)
def test_internvl_hand_worked(w, h, grid, tiles):
    p = InternVLPolicy()
    assert internvl_grid(w, h, 1, 12, 448) == grid
    c = p.image_cost(w, h)
    assert c.vit_seq_lens == (1024,) * tiles
    assert c.llm_tokens == 256 * tiles


def _tie_sizes(lo=1, hi=12):
    """Images whose aspect is exactly halfway between two neighbouring grids' of lo..hi tiles
    (ties the rule must break as the reference does, small and past half the tiles' area), and
    a spread of ordinary and extreme sizes."""
    import itertools
    from fractions import Fraction

    ratios = sorted(
        {Fraction(i, j) for i in range(1, hi + 1) for j in range(1, hi + 1) if lo <= i * j <= hi}
    )
    mids = [(a + b) / 2 for a, b in itertools.pairwise(ratios)]
    ties = [(m.numerator * k, m.denominator * k) for m in mids for k in (1, 7, 50, 300)]
    sides = [1, 10, 223, 224, 447, 448, 449, 896, 1344, 2000, 4000]
    return ties + [(w, h) for w in sides for h in sides]


def _model_card_grid(width, height, min_num, max_num, image_size):
    """InternVL's ``dynamic_preprocess`` grid, transcribed from the InternVL 1.5-3.5 model
    cards (the code their ``trust_remote_code`` checkpoints run): the grids of min..max tiles
    built as a set, sorted stably by tile count, then ``find_closest_aspect_ratio``."""
    target_ratios = {
        (i, j)
        for n in range(min_num, max_num + 1)
        for i in range(1, n + 1)
        for j in range(1, n + 1)
        if min_num <= i * j <= max_num
    }
    target_ratios = sorted(target_ratios, key=lambda x: x[0] * x[1])
    aspect_ratio = width / height
    best_ratio_diff = float("inf")
    best_ratio = (1, 1)
    area = width * height
    for ratio in target_ratios:
        ratio_diff = abs(aspect_ratio - ratio[0] / ratio[1])
        if ratio_diff < best_ratio_diff:
            best_ratio_diff = ratio_diff
            best_ratio = ratio
        elif ratio_diff == best_ratio_diff and area > 0.5 * image_size**2 * ratio[0] * ratio[1]:
            best_ratio = ratio
    return best_ratio


_TILE_RANGES = [(1, 12), (1, 6), (2, 12), (1, 1), (3, 9), (12, 12), (4, 4), (5, 6), (6, 6)]


@pytest.mark.parametrize("lo,hi", _TILE_RANGES)
def test_internvl_grid_equals_the_model_cards_dynamic_preprocess(lo, hi):
    """Anchor: the grid InternVL's own ``dynamic_preprocess`` picks, for every size, ties
    between grids included (with 4 tiles a 5:8 image is as close to 1 x 4 as to 2 x 2, with 6
    a square one to 2 x 3 and 3 x 2: the order the grids are tried in decides)."""
    diff = [
        (w, h)
        for w, h in _tie_sizes(lo, hi)
        if internvl_grid(w, h, lo, hi, 448) != _model_card_grid(w, h, lo, hi, 448)
    ]
    assert not diff, diff[:5]


@pytest.mark.parametrize("lo,hi", _TILE_RANGES)
def test_internvl_grid_equals_the_hf_image_processors_canvas(lo, hi):
    """Anchor: transformers' InternVL image processor (GotOcr2's ``get_optimal_tiled_canvas``,
    the ``-hf`` checkpoints) takes as many tiles for every size, ties included. It tries grids
    of one tile count in another order than the model cards' set does, so where two grids of
    the same count are equally close (4 tiles: 2 x 2 and 4 x 1 for a 5:2 image) the two may
    cut the image differently; the count, and so the cost, is the same. With 1..12, 2..12 and
    the other ranges of this list that have no such tie, the grid itself is the same."""
    got = pytest.importorskip("transformers.models.got_ocr2.image_processing_pil_got_ocr2")
    same_grid = (lo, hi) not in {(4, 4), (5, 6), (6, 6)}
    diff = []
    for w, h in _tie_sizes(lo, hi):
        ours = internvl_grid(w, h, lo, hi, 448)
        theirs = tuple(got.get_optimal_tiled_canvas((h, w), (448, 448), lo, hi))
        if (ours if same_grid else ours[0] * ours[1]) != (
            theirs if same_grid else theirs[0] * theirs[1]
        ):
            diff.append((w, h, ours, theirs))
    assert not diff, diff[:5]


@pytest.mark.parametrize(
    "kw,bad",
    [
        ({"min_tiles": 0}, "1 <= min_tiles <= max_tiles, got 0..12"),
        ({"min_tiles": 1, "max_tiles": 1}, None),
        ({"min_tiles": 12, "max_tiles": 12}, None),  # equal: at the limit
        ({"min_tiles": 13, "max_tiles": 12}, "1 <= min_tiles <= max_tiles, got 13..12"),
        ({"downsample_ratio": 0.0}, "0 < downsample_ratio <= 1"),
        ({"downsample_ratio": -0.5}, "0 < downsample_ratio <= 1"),  # its square is 0.25
        ({"downsample_ratio": 1.0}, None),
        ({"downsample_ratio": 1.01}, "0 < downsample_ratio <= 1"),
        ({"patch_size": 0}, "patch_size >= 1"),
        ({"patch_size": 1, "tile_size": 2}, None),
        ({"patch_size": 14, "tile_size": 28}, None),  # 2 patches a side: the least that shuffles
        ({"patch_size": 14, "tile_size": 14}, "tile_size 14 / patch_size 14 is 1$"),  # odd
        ({"patch_size": 14, "tile_size": 13}, "tile_size >= patch_size, got tile_size=13"),
        ({"patch_size": 28, "tile_size": 14}, "tile_size >= patch_size, got tile_size=14"),
        ({"patch_size": 14, "tile_size": 42}, "tile_size 42 / patch_size 14 is 3$"),  # odd
        ({"patch_size": 14, "tile_size": 449}, "tile_size 449 must be a multiple of 14"),
        # 2 x 2 patches shuffled at a quarter: no token (a quarter of a token)
        ({"tile_size": 28, "downsample_ratio": 0.25}, "downsample_ratio 0.25 leaves no LLM token"),
        ({"tile_size": 28, "downsample_ratio": 0.5}, None),  # one token
    ],
)
def test_internvl_settings_at_and_around_their_limits(kw, bad):
    if bad is not None:
        with pytest.raises(ValueError, match=bad):
            InternVLPolicy(**kw)
        return
    p = InternVLPolicy(**kw)
    side = p.tile_size // p.patch_size
    assert p.patches_per_tile == side * side
    cost = p.image_cost(900, 450)
    assert all(type(n) is int for n in (*cost.vit_seq_lens, cost.llm_tokens))
    with pytest.raises(TypeError):
        InternVLPolicy(1)  # keyword-only
    assert p.llm_tokens_per_tile == int(side * side * p.downsample_ratio**2)
    assert p.image_cost(900, 450).llm_tokens == p.llm_tokens_per_tile * p.num_tiles(900, 450)


@pytest.mark.parametrize(
    "kw,spec",
    [
        ({}, "internvl:min_tiles=1,max_tiles=12,tile_size=448,thumbnail=1"),
        (
            {"patch_size": 16, "max_tiles": 6, "thumbnail": False},
            "internvl:min_tiles=1,max_tiles=6,tile_size=448,thumbnail=0,patch_size=16",
        ),
        (
            {"patch_size": 15, "tile_size": 450},
            "internvl:min_tiles=1,max_tiles=12,tile_size=450,thumbnail=1,patch_size=15",
        ),
    ],
)
def test_internvl_spec_names_the_patch_only_where_it_is_not_14(kw, spec):
    p = InternVLPolicy(**kw)
    assert p.spec() == spec
    assert parse_vision_policy(spec) == p


@pytest.mark.parametrize("thumbnail", [True, False])
def test_internvl_thumbnail_only_beside_more_than_one_tile(thumbnail):
    p = InternVLPolicy(thumbnail=thumbnail)
    assert p.num_tiles(448, 448) == 1  # one tile: never a thumbnail
    assert p.num_tiles(896, 448) == 2 + thumbnail
    assert InternVLPolicy(max_tiles=1, thumbnail=thumbnail).num_tiles(4000, 10) == 1
    # at least 2 tiles: a square image takes the square 2 x 2 grid
    assert InternVLPolicy(min_tiles=2, thumbnail=thumbnail).num_tiles(448, 448) == 4 + thumbnail


def test_internvl_max_tiles_option():
    p = parse_vision_policy("internvl:max_tiles=6")
    # 800x600 (1.333): allowed grids up to 6 tiles, closest is (3, 2) at 1.5 -> 6 tiles + thumbnail
    assert p.image_cost(800, 600).llm_tokens == 256 * 7
    no_thumb = parse_vision_policy("internvl:max_tiles=6,thumbnail=0")
    assert no_thumb.image_cost(800, 600).llm_tokens == 256 * 6


@pytest.mark.parametrize(
    ("h", "w", "expected"),
    [
        (500, 1000, (504, 1008)),  # round to multiples of 28, within bounds
        (20, 20, (56, 56)),  # tiny: 28x28 is under min_pixels, scaled up by sqrt(3136/400)=2.8
        (
            3000,
            4000,
            (840, 1148),
        ),  # huge: beta = sqrt(12e6/1003520) -> floor(30.98)*28, floor(41.3)*28
    ],
)
@pytest.mark.parametrize("resize", ["transformers", "qwen-vl-utils"])
def test_qwen2vl_smart_resize_hand_worked(h, w, expected, resize):
    assert qwen2vl_smart_resize(h, w, resize=resize) == expected


@pytest.mark.parametrize(
    ("h", "w", "resize", "expected"),
    [
        # qwen-vl-utils rounds 10 up to 28 first: 28 x 504 is over min_pixels, kept (72 patches)
        (10, 500, "qwen-vl-utils", (28, 504)),
        # transformers rounds 10 to 0: 0 < min_pixels, so beta = sqrt(3136/5000) = 0.792 scales
        # both sides: ceil(7.9/28)*28 = 28, ceil(396/28)*28 = 420 (60 patches)
        (10, 500, "transformers", (28, 420)),
        (10, 1000, "qwen-vl-utils", (28, 1008)),
        (10, 1000, "transformers", (28, 560)),  # beta = 0.56: ceil(560/28) = 20 -> 560
    ],
)
def test_qwen2vl_resize_forms_differ_on_thin_images(h, w, resize, expected):
    assert qwen2vl_smart_resize(h, w, resize=resize) == expected
    p = parse_vision_policy(f"qwen2vl:resize={resize}")
    patches = (expected[0] // 14) * (expected[1] // 14)
    assert p.image_cost(w, h).vit_seq_lens == (patches,)
    assert parse_vision_policy(p.spec()) == p  # the spec round-trips, resize included


def test_qwen2vl_default_is_the_transformers_processor():
    assert parse_vision_policy("qwen2vl").resize == "transformers"


def test_qwen2vl_cost_and_rejection():
    p = Qwen2VLPolicy()
    c = p.image_cost(1000, 500)  # width, height
    assert c.vit_seq_lens == (36 * 72,) and c.llm_tokens == 36 * 72 // 4
    with pytest.raises(SampleRejected) as e:
        p.image_cost(5000, 20)
    assert e.value.reason == "aspect_ratio_out_of_range"


@pytest.mark.parametrize("resize", ["transformers", "qwen-vl-utils"])
def test_qwen2vl_aspect_limit_at_below_and_above_200(resize):
    """The documented limit, 200, is accepted; just above it is refused (either orientation)."""
    p = Qwen2VLPolicy(resize=resize)
    assert p.image_cost(4000, 20).vit_seq_lens  # exactly 200
    assert p.image_cost(20, 3980).vit_seq_lens  # 199
    for w, h in [(4001, 20), (20, 4001)]:  # 200.05
        with pytest.raises(SampleRejected, match="aspect ratios up to 200"):
            p.image_cost(w, h)


@pytest.mark.parametrize(
    "kw,ok",
    [
        ({"min_pixels": 0}, False),
        ({"min_pixels": 1}, True),
        ({"min_pixels": 5000, "max_pixels": 5000}, True),  # equal bounds: at the limit
        ({"min_pixels": 5001, "max_pixels": 5000}, False),
        ({"patch_size": 0}, False),
        ({"patch_size": 1}, True),
        ({"merge_size": 0}, False),
        ({"merge_size": 1}, True),
    ],
)
def test_qwen2vl_settings_at_and_around_their_limits(kw, ok):
    if ok:
        p = Qwen2VLPolicy(**kw)
        assert p.image_cost(640, 480).llm_tokens > 0
        return
    with pytest.raises(ValueError, match="qwen2vl needs"):
        Qwen2VLPolicy(**kw)


@pytest.mark.parametrize("resize", ["abc", "Transformers", "", None])
def test_qwen2vl_smart_resize_refuses_a_form_it_does_not_know(resize):
    with pytest.raises(ValueError, match="resize must be one of transformers, qwen-vl-utils"):
        qwen2vl_smart_resize(100, 100, resize=resize)


def test_qwen2vl_policy_is_keyword_only():
    with pytest.raises(TypeError):
        Qwen2VLPolicy(3136)


def test_qwen2vl_smart_resize_defaults_are_the_processors_bounds():
    """Without bounds given, 56*56 and 28*28*1280 pixels (Qwen2VLImageProcessor's defaults; the
    values are what transformers' smart_resize gives):
    images exactly at them are kept, one 28-px step past them is scaled."""
    assert qwen2vl_smart_resize(896, 1120) == (896, 1120)  # 28*28*1280 exactly
    assert qwen2vl_smart_resize(588, 1708) == (560, 1680)  # 28*28*1281: over
    assert qwen2vl_smart_resize(588, 1680) == (588, 1680)  # 28*28*1260: under
    assert qwen2vl_smart_resize(56, 56) == (56, 56)  # min exactly
    assert qwen2vl_smart_resize(28, 84) == (56, 112)  # 28*28*3 < 56*56: scaled up
    assert qwen2vl_smart_resize(1, 43) == (28, 392)  # scaled up by sqrt(3136 / 43) exactly


def test_qwen2vl_pixel_bounds_hold_exactly_at_them():
    """An image already at max_pixels (or min_pixels) after rounding is kept as is; one pixel
    row past them is scaled: the bounds are inclusive."""
    hi = 28 * 28 * 16
    assert qwen2vl_smart_resize(112, 112, 28, 3136, hi) == (112, 112)  # 12,544 = max
    assert qwen2vl_smart_resize(140, 112, 28, 3136, hi) == (112, 84)  # over: scaled down
    assert qwen2vl_smart_resize(56, 56, 28, 3136, hi) == (56, 56)  # 3,136 = min
    assert qwen2vl_smart_resize(56, 28, 28, 3136, hi) == (84, 56)  # under: scaled up


@pytest.mark.parametrize(
    "spec",
    [
        "fixed:336",
        "fixed:335/14",
        "nope",
        "internvl:max_tiles=x",
        "internvl:foo=1",
        "qwen2vl:min_pixels=9,max_pixels=1",
        "qwen2vl:resize=qwen",
        "qwen2vl:resize=1",
        "llava-onevision:max_grid=0",
        "llava-onevision:tile_size=10",
        "llava-onevision:resize=1",
    ],
)
def test_bad_specs_raise_value_error_with_fix(spec):
    with pytest.raises(ValueError):
        parse_vision_policy(spec)


@pytest.mark.parametrize(
    ("w", "h", "tiles", "tokens"),
    [
        # 3x3 grid of 384 px (1152 keeps every pixel and wastes least): 81x81 features, no
        # padding to cut, under 9 tiles' worth: 729 base + 6561 + 81 newlines
        (1000, 1000, 10, 729 + 81 * 81 + 81),
        # 6x6 grid: 162x162 features are 4x the 9 tiles' worth, pooled by 2 to 81x81
        (2304, 2304, 37, 729 + 81 * 81 + 81),
        # 2 wide x 1 high: 27x54 features; the image fills it, nothing cut
        (768, 384, 3, 729 + 27 * 54 + 27),
        # a 384x200 image in one 384 tile: the feature rows of the padding are cut (27 -> 15)
        (384, 200, 2, 729 + 15 * 27 + 15),
    ],
)
def test_onevision_hand_worked(w, h, tiles, tokens):
    p = parse_vision_policy("llava-onevision")
    c = p.image_cost(w, h)
    assert c.vit_seq_lens == (729,) * tiles and c.llm_tokens == tokens
    assert p.sample_costs([(w, h)]) == [c]
    # in a sample with several images, none is cut: one padded tile and a newline each
    assert [x.llm_tokens for x in p.sample_costs([(w, h), (w, h)])] == [730, 730]
    assert p.sample_costs([(w, h), (9, 9)])[0].vit_seq_lens == (729,)


def _onevision_check(tokenizer_path, size_list):
    """Tiles (the model's ``image_size_to_num_patches``) and LLM tokens (the ``<image>`` tokens
    ``LlavaOnevisionProcessor`` writes for a real image) of single images."""
    pytest.importorskip("transformers")
    from transformers import LlavaOnevisionProcessor, PreTrainedTokenizerFast
    from transformers.models.llava_onevision import LlavaOnevisionImageProcessorPil
    from transformers.models.llava_onevision.modeling_llava_onevision import (
        image_size_to_num_patches,
    )

    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": ["<image>", "<video>"]})
    ip = LlavaOnevisionImageProcessorPil()
    images_only = classmethod(lambda c: ["image_processor", "tokenizer"])
    proc = type("P", (LlavaOnevisionProcessor,), {"get_attributes": images_only})(
        image_processor=ip,
        tokenizer=tok,
        num_image_tokens=729,
        vision_feature_select_strategy="full",
    )
    image_id = tok.convert_tokens_to_ids("<image>")
    policy = parse_vision_policy("llava-onevision")
    wrong = []
    for w, h in size_list:
        tokens, out = image_tokens(proc, "<image>", image_id, w, h)
        tiles = image_size_to_num_patches(
            image_size=(h, w), grid_pinpoints=ip.image_grid_pinpoints, patch_size=384
        )
        assert out["pixel_values"].shape[1] == tiles  # the anchor's two halves agree
        c = policy.image_cost(w, h)
        if (len(c.vit_seq_lens), c.llm_tokens) != (tiles, tokens):
            wrong.append((w, h, len(c.vit_seq_lens), tiles, c.llm_tokens, tokens))
    assert not wrong, wrong[:5]


def test_onevision_equals_transformers_on_many_sizes(tokenizer_path):
    """Sizes up to 2,500 a side (every grid of the pinpoints), thin ones to 5,000 and a few
    large pooled ones; ``make test-all`` runs the wide sweep below."""
    big = [(2304, 2304), (4000, 1200)]
    _onevision_check(
        tokenizer_path, sizes(0, regular=28, side=2500, thin=16, long_side=5000, big=big)
    )


@pytest.mark.slow
def test_onevision_equals_transformers_wide_sweep(tokenizer_path):
    _onevision_check(tokenizer_path, sizes(10, regular=600, side=5000, thin=200, long_side=5000))


@pytest.mark.parametrize(
    ("w", "h", "patches"),
    [
        # a side under 28 scales the image up first (20 -> 28), then two frames of 28x28 are
        # under min_pixels: beta = sqrt(12544 / (2 * 784)) = 2.83, ceil(2.83) * 28 = 84 a side
        # (Qwen2-VL's resize gives 56x56: 16 patches)
        (20, 20, 6 * 6),
        (1000, 500, 36 * 72),  # rounded to multiples of 28, inside the bounds
        # two frames of 2800x2800 are over max_pixels: beta = sqrt(2 * 2800^2 / 11760000)
        # = 1.155, floor(2800 / 1.155 / 28) = 86 -> 2408 a side
        (2800, 2800, 172 * 172),
    ],
)
def test_glm4v_hand_worked(w, h, patches):
    p = parse_vision_policy("glm4v")
    c = p.image_cost(w, h)
    assert c.vit_seq_lens == (patches,) and c.llm_tokens == patches // 4
    assert parse_vision_policy(p.spec()) == p
    with pytest.raises(SampleRejected) as e:
        p.image_cost(5000, 20)  # 20 -> 28 and 5000 -> 7000: 250:1
    assert e.value.reason == "aspect_ratio_out_of_range"


def test_glm4v_equals_its_image_processor():
    """The patch grid prep computes from an image's size alone equals the ``image_grid_thw``
    GLM-4V's image processor gives real images (a small max_pixels so that the shrinking branch
    is reached with cheap images), over 500 sizes, 1-px sides and extreme aspects included; an
    aspect it refuses is a rejection here."""
    import random

    from PIL import Image

    transformers = pytest.importorskip("transformers")
    ip = transformers.models.glm4v.Glm4vImageProcessorPil(
        size={"shortest_edge": 112 * 112, "longest_edge": 2 * 28 * 28 * 100}
    )
    policy = parse_vision_policy(f"glm4v:max_pixels={2 * 28 * 28 * 100}")
    rng = random.Random(3)
    sizes = [(w, h) for w in (1, 2, 27, 28, 29, 55, 56) for h in (1, 14, 28, 300, 800)]
    sizes += [(rng.randint(1, 900), rng.randint(1, 900)) for _ in range(400)]
    sizes += [(rng.randint(1, 6), rng.randint(100, 1500)) for _ in range(40)]
    wrong, refused = [], 0
    for w, h in sizes:
        try:
            grid = ip(images=[Image.new("RGB", (w, h))], return_tensors="np")["image_grid_thw"][0]
            want = (int(grid.prod()),)
        except ValueError:
            want, refused = "refused", refused + 1
        try:
            got = policy.image_cost(w, h).vit_seq_lens
        except SampleRejected:
            got = "refused"
        if got != want:
            wrong.append(((w, h), want, got))
    assert not wrong, f"{len(wrong)} of {len(sizes)} differ, e.g. {wrong[:3]}"
    assert refused > 5  # the aspect-ratio bound was reached


@pytest.mark.parametrize(
    ("w", "h", "tiles", "tokens"),
    [
        # 1000x1000 best fits 672x672 (2x2 tiles keep 672^2 px; 1x3 / 3x1 fewer): 48x48
        # features, nothing padded: 576 base + 2304 + 48 newlines
        (1000, 1000, 5, 576 + 48 * 48 + 48),
        # 300x100 (w x h): every grid keeps all its pixels, 336x672 and 672x336 waste the
        # least and the first listed wins: 1 high x 2 wide, a 24x48 feature map; the image is
        # wider (3:1), so 24 - round(100 * 48 / 300) = 8 rows were padding: 16 rows kept
        (300, 100, 3, 576 + 16 * 48 + 16),
        # 600x300 in 336x672: scaled by 1.12 to 672x336, fills it
        (600, 300, 3, 576 + 24 * 48 + 24),
        # 200x300 (taller than wide) goes to the same first-listed 336x672 grid; the 24x48 map
        # is wider than the image, so 48 - round(200 * 24 / 300) = 32 columns were padding
        (200, 300, 3, 576 + 24 * 16 + 24),
    ],
)
def test_llava_next_hand_worked(w, h, tiles, tokens):
    p = parse_vision_policy("llava-next")
    c = p.image_cost(w, h)
    assert c.vit_seq_lens == (576,) * tiles and c.llm_tokens == tokens
    # every image is cut anyres, also in a sample with several (unlike LLaVA-OneVision)
    assert p.sample_costs([(w, h), (w, h)]) == [c, c]
    assert parse_vision_policy(p.spec()) == p


def _llava_next_check(grids, tokenizer_path, size_list):
    """Tiles (the model's ``image_size_to_num_patches``) and LLM tokens (the ``<image>`` tokens
    ``LlavaNextProcessor`` writes for a real image), with llava-v1.6's pinpoints or a list of
    one's own."""
    pytest.importorskip("transformers")
    from transformers import LlavaNextProcessor, PreTrainedTokenizerFast
    from transformers.models.llava_next import LlavaNextImageProcessorPil
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    kw = {}
    if grids:
        kw["image_grid_pinpoints"] = [
            [int(h) * 336, int(w) * 336] for h, w in (g.split("x") for g in grids.split("."))
        ]
    ip = LlavaNextImageProcessorPil(
        size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}, **kw
    )
    images_only = classmethod(lambda c: ["image_processor", "tokenizer"])
    proc = type("P", (LlavaNextProcessor,), {"get_attributes": images_only})(
        image_processor=ip,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    image_id = tok.convert_tokens_to_ids("<image>")
    policy = parse_vision_policy("llava-next" + (f":grids={grids}" if grids else ""))
    wrong = []
    for w, h in size_list:
        tokens, out = image_tokens(proc, "<image>", image_id, w, h)
        tiles = image_size_to_num_patches(
            image_size=(h, w), grid_pinpoints=ip.image_grid_pinpoints, patch_size=336
        )
        assert out["pixel_values"].shape[1] == tiles  # the anchor's two halves agree
        c = policy.image_cost(w, h)
        if (len(c.vit_seq_lens), c.llm_tokens) != (tiles, tokens):
            wrong.append((w, h, len(c.vit_seq_lens), tiles, c.llm_tokens, tokens))
    assert not wrong, wrong[:5]


_GRIDS = pytest.mark.parametrize(
    "grids", [None, "1x1.1x2.2x1.2x2.2x3.3x2"], ids=["llava-v1.6", "own-grids"]
)


@_GRIDS
def test_llava_next_equals_transformers_on_many_sizes(grids, tokenizer_path):
    """Sizes up to 2,000 a side (past every pinpoint), thin ones to 4,000;
    ``make test-all`` runs the wide sweep below."""
    size_list = sizes(1, regular=40, side=2000, thin=16, long_side=4000, big=[(4000, 4000)])
    _llava_next_check(grids, tokenizer_path, size_list)


@pytest.mark.slow
@_GRIDS
def test_llava_next_equals_transformers_wide_sweep(grids, tokenizer_path):
    size_list = sizes(11, regular=600, side=4000, thin=200, long_side=4000)
    _llava_next_check(grids, tokenizer_path, size_list)


@pytest.mark.parametrize("spec", ["llava-next:grids=2", "llava-next:grids=1x0", "llava-next:x=1"])
def test_llava_next_bad_grids(spec):
    with pytest.raises(ValueError, match=r"grids|KEY"):
        parse_vision_policy(spec)


@pytest.mark.parametrize(
    ("spec", "w", "h", "patches", "tokens"),
    [
        # Mistral 3: 1000x500 fits 1540; rounded up to multiples of 28 (1008x504): 72x36
        # patches of 14, 36x18 merged: 18 rows of 36 [IMG] + a break (the last an end)
        ("mistral3", 1000, 500, 72 * 36, 18 * 37),
        # shrunk by 3080/1540 = 2 to 1540x770, rounded up to 1540x784: 110x56 patches
        ("mistral3", 3080, 1540, 110 * 56, 28 * 56),
        # Pixtral-12B: 16-px patches, no merge, 1024 px: 20x20 -> one 16x16 patch, its end
        ("pixtral", 20, 20, 4, 2 * 3),
    ],
)
def test_pixtral_hand_worked(spec, w, h, patches, tokens):
    p = parse_vision_policy(spec)
    c = p.image_cost(w, h)
    assert c.vit_seq_lens == (patches,) and c.llm_tokens == tokens
    assert parse_vision_policy(p.spec()) == p
    with pytest.raises(SampleRejected) as e:
        p.image_cost(5000, 1)  # shrunk to fit, its height floors to 0 px
    assert e.value.reason == "aspect_ratio_out_of_range"


def test_pixtral_settings_at_below_and_above_their_limits():
    """patch and merge sizes of 1 are a policy, 0 is not; the longest edge may equal one merged
    patch (every image then one token and its end) and not be below it. Counts are whole
    numbers (a ``/`` for ``//`` gives equal floats)."""
    from dataprep.policies.pixtral import PixtralPolicy

    tiny = PixtralPolicy(patch_size=1, merge_size=1, longest_edge=2).image_cost(2, 1)
    assert tiny.vit_seq_lens == (2,) and tiny.llm_tokens == 3  # a row of two, its end
    one = PixtralPolicy(patch_size=14, merge_size=2, longest_edge=28, name="mistral3")
    c = one.image_cost(1000, 700)
    assert c.vit_seq_lens == (4,) and c.llm_tokens == 2  # one merged patch, then its end
    for bad in ({"patch_size": 0}, {"merge_size": 0}):
        with pytest.raises(ValueError, match="patch_size >= 1 and merge_size >= 1"):
            PixtralPolicy(**bad)
    with pytest.raises(ValueError, match="longest_edge >= patch_size"):
        PixtralPolicy(patch_size=14, merge_size=2, longest_edge=27)
    PixtralPolicy(patch_size=14, merge_size=2, longest_edge=29)
    c = parse_vision_policy("mistral3").image_cost(1000, 500)
    assert all(type(x) is int for x in (*c.vit_seq_lens, c.llm_tokens))


_PIXTRAL = pytest.mark.parametrize(
    ("spec", "patch", "merge", "longest"), [("pixtral", 16, 1, 1024), ("mistral3", 14, 2, 1540)]
)


@_PIXTRAL
def test_pixtral_equals_its_processor(spec, patch, merge, longest, tokenizer_path):
    """On real images, the resized size ``PixtralProcessor``'s image processor gives (patches =
    its size / patch) and the prompt it writes (rows of [IMG], breaks, the end) equal the
    policy's, thin images it refuses refused here: sizes up to twice the longest edge, thin
    ones and a few far larger; ``make test-all`` runs a wider sweep."""
    _pixtral_check(spec, patch, merge, longest, tokenizer_path, regular=80, thin=20)


@pytest.mark.slow
@_PIXTRAL
def test_pixtral_equals_its_processor_wide_sweep(spec, patch, merge, longest, tokenizer_path):
    _pixtral_check(spec, patch, merge, longest, tokenizer_path, regular=800, thin=200)


def _pixtral_check(spec, patch, merge, longest, tokenizer_path, *, regular, thin):
    pytest.importorskip("transformers")
    from transformers import PreTrainedTokenizerFast
    from transformers.models.pixtral import PixtralImageProcessorPil

    from tests.dataprep.test_jinja_template import pixtral_processor_class

    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]})
    ip = PixtralImageProcessorPil(
        size={"longest_edge": longest}, patch_size={"height": patch, "width": patch}
    )
    images_only = classmethod(lambda c: ["image_processor", "tokenizer"])
    proc = type("P", (pixtral_processor_class(),), {"get_attributes": images_only})(
        image_processor=ip, tokenizer=tok, patch_size=patch, spatial_merge_size=merge
    )
    policy = parse_vision_policy(spec)
    wrong = []
    big = [(longest + 1, 1), (1, 3 * longest), (longest, 2), (5000, 5000), (5000, 37)]
    big += [(longest, longest), (longest + 1, longest), (longest - 1, longest + 1)]
    for w, h in sizes(2, regular=regular, side=2 * longest, thin=thin, long_side=5000, big=big):
        try:
            out = proc(text=["[IMG]"], images=[Image.new("RGB", (w, h))], return_tensors="np")
            rh, rw = out["image_sizes"][0]
            want = ((rh // patch) * (rw // patch),), int(out["input_ids"].shape[1])
        except ValueError:
            want = "refused"
        try:
            c = policy.image_cost(w, h)
            got = c.vit_seq_lens, c.llm_tokens
        except SampleRejected:
            got = "refused"
        if got != want:
            wrong.append(((w, h), want, got))
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"


def _merging_tokenizer(path) -> str:
    """A BPE tokenizer without a pre-tokenizer, trained on runs of Aya's tile markers: its merges
    cross where one marker ends and the next begins (as a SentencePiece-style vocabulary can)."""
    from tokenizers import Tokenizer, models, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"], show_progress=False)
    runs = ["".join(f"TILE_{k}" for k in range(1, n)) + "TILE_GLOBAL" for n in range(2, 14)]
    tok.train_from_iterator(runs * 20, trainer)
    tok.save(str(path))
    return str(path)


@pytest.mark.parametrize("vocab", ["demo", "merging"])
def test_aya_vision_equals_its_processor(vocab, tokenizer_path, tmp_path):
    """Tiles equal ``GotOcr2ImageProcessor``'s over 2000 sizes (crop_to_patches, Aya Vision's
    364-px tiles); the prompt ``AyaVisionProcessor`` writes for each tile count (its TILE_k
    markers plain text between image tokens) has as many tokens as prep's counter finds in the
    policy's text plus the policy's image tokens, with the demo tokenizer and with one whose
    merges cross marker boundaries; a 2:1 image by hand: a 2x1 grid and a global tile."""
    import random

    pytest.importorskip("transformers")
    from transformers import AyaVisionProcessor, PreTrainedTokenizerFast
    from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil

    from dataprep.policies.aya import AYA_MARKERS
    from dataprep.text_tokens import TokenCounter, TokenizerSpec

    if vocab == "merging":
        tokenizer_path = _merging_tokenizer(tmp_path / "merging.json")
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": list(AYA_MARKERS[:3])})
    ip = GotOcr2ImageProcessorPil(
        crop_to_patches=True, min_patches=1, max_patches=12, size={"height": 364, "width": 364}
    )
    proc = AyaVisionProcessor(image_processor=ip, tokenizer=tok, patch_size=28, img_size=364)
    policy = parse_vision_policy("aya-vision")
    c = policy.image_cost(800, 400)
    assert c.vit_seq_lens == (676,) * 3 and c.llm_tokens == 169 * 3
    assert "TILE_2" in c.text and "TILE_3" not in c.text and c.text.count("TILE_GLOBAL") == 1
    assert parse_vision_policy(policy.spec()) == policy
    rng = random.Random(5)
    wrong = []
    kwargs = {"crop_to_patches": True, "min_patches": 1, "max_patches": 12}
    for w, h in [(rng.randint(4, 6000), rng.randint(4, 6000)) for _ in range(2000)]:
        want = ip.get_number_of_image_patches(h, w, kwargs)
        c = policy.image_cost(w, h)
        if len(c.vit_seq_lens) != want:
            wrong.append(((w, h), want, c))
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"
    # prep's counter over the model's tokenizer (the image tokens special in it)
    tok.backend_tokenizer.save(str(tmp_path / "aya.json"))
    counter = TokenCounter(TokenizerSpec.parse(str(tmp_path / "aya.json")))
    # one tile (no global tile), and grids of 2..12 tiles in a row with their global tile
    for n in (1, *range(3, 14)):
        prompt = proc.replace_image_token({"num_patches": [n]}, 0)
        c = policy.image_cost(364 * max(n - 1, 1), 364)
        want = len(tok(prompt, add_special_tokens=False)["input_ids"])
        got = counter.count([c.text])[0] + c.llm_tokens
        assert len(c.vit_seq_lens) == n and got == want, (n, got, want)


@pytest.mark.parametrize(
    ("spec", "w", "h", "tokens", "rows"),
    [
        # budget 280 * 9 = 2520 patches of 16 px: scale sqrt(2520 * 256 / 800^2) = 1.004, each
        # side floored to a multiple of 48: 768 -> 48x48 patches -> 16x16 soft tokens
        ("gemma4", 800, 800, 256, 2520),
        # scale sqrt(645120 / 500000) = 1.136: 500 -> 528 (11 x 48), 1000 -> 1104 (23 x 48):
        # 33 x 69 patches -> 11 x 23 soft tokens
        ("gemma4", 1000, 500, 253, 2520),
        # the short side floors to nothing: one 48-px row of blocks, the long side
        # floor(4000 / 10) x 48 px capped at 280 blocks (13440 px): 1 x 280 soft tokens
        ("gemma4", 4000, 10, 280, 2520),
        # a small image is scaled up: budget 70 * 9 = 630, scale sqrt(630 * 256 / 5000)
        # = 5.68: 50 -> 240, 100 -> 528: 15 x 33 patches -> 5 x 11 soft tokens
        ("gemma4:max_soft_tokens=70", 100, 50, 55, 630),
    ],
)
def test_gemma4_hand_worked(spec, w, h, tokens, rows):
    p = parse_vision_policy(spec)
    c = p.image_cost(w, h)
    assert c.llm_tokens == tokens and c.vit_seq_lens == (rows,)
    assert parse_vision_policy(p.spec()) == p
    with pytest.raises(ValueError, match="max_soft_tokens"):
        parse_vision_policy("gemma4:max_soft_tokens=256")


def test_gemma4_equals_its_image_processor():
    """Soft tokens and encoder rows from an image's size alone equal what Gemma 4's image
    processor makes of real images (``num_soft_tokens_per_image``, the padded rows of
    ``pixel_values``), for every budget it accepts, over 340 sizes: small images scaled up,
    large ones down, 1-px sides and extreme aspects whose short side floors to nothing (the
    edge cases under every budget; 90 random large sizes spread over the budgets, each
    processed in full, as the processor's cost is in its pixels)."""
    import random

    from PIL import Image

    transformers = pytest.importorskip("transformers")
    rng = random.Random(11)
    edges = [(w, h) for w in (1, 2, 47, 48, 49, 95) for h in (1, 16, 48, 300, 1900)]
    wrong = []
    for soft in (70, 140, 280, 560, 1120):
        ip = transformers.models.gemma4.Gemma4ImageProcessorPil(max_soft_tokens=soft)
        policy = parse_vision_policy(f"gemma4:max_soft_tokens={soft}")
        sizes = edges + [(rng.randint(1, 2500), rng.randint(1, 2500)) for _ in range(18)]
        sizes += [(rng.randint(1, 30), rng.randint(200, 9000)) for _ in range(20)]
        for w, h in sizes:
            out = ip(
                images=[Image.new("RGB", (w, h))],
                return_tensors="np",
                input_data_format="channels_last",
                do_rescale=False,  # the sizes alone are compared
                do_normalize=False,
            )
            want = ((int(out["pixel_values"].shape[1]),), int(out["num_soft_tokens_per_image"][0]))
            c = policy.image_cost(w, h)
            if (c.vit_seq_lens, c.llm_tokens) != want:
                wrong.append(((soft, w, h), want, (c.vit_seq_lens, c.llm_tokens)))
            if not all(type(x) is int for x in (*c.vit_seq_lens, c.llm_tokens)):
                wrong.append(((soft, w, h), "not whole numbers", c))
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"


def test_gemma4_defaults_are_the_processors_and_its_limits_hold():
    """The policy's defaults are ``Gemma4ImageProcessor``'s (280 soft tokens of 3 x 3 pools of
    16-px patches), so a plain ``gemma4`` counts as the released models do; a patch or a pool
    of 1 (the smallest) is taken and counts every patch, 0 is refused."""
    transformers = pytest.importorskip("transformers")
    ip = transformers.models.gemma4.Gemma4ImageProcessorPil()
    p = parse_vision_policy("gemma4")
    assert (p.max_soft_tokens, p.patch_size, p.pooling_kernel_size) == (
        ip.max_soft_tokens,
        ip.patch_size,
        ip.pooling_kernel_size,
    )
    one = parse_vision_policy("gemma4:max_soft_tokens=70,patch_size=1,pooling_kernel_size=1")
    c = one.image_cost(10, 7)  # 70 px: scaled to 10 x 7, every 1-px patch a token
    assert c.vit_seq_lens == (70,) and c.llm_tokens == 70
    for bad in ("patch_size=0", "pooling_kernel_size=0"):
        with pytest.raises(ValueError, match=">= 1"):
            parse_vision_policy(f"gemma4:{bad}")


@pytest.mark.parametrize(
    ("w", "h", "grid", "tiles"),
    [
        # one 448-px tile covers a 448 x 448 image whole: no thumbnail
        (448, 448, (1, 1), 1),
        # 500 x 500: one tile covers 448^2 / 500^2 = 80 % (under 90 %), so do a 1x2 or 2x1
        # grid's cells (500 x 250, shrunk to 448 x 224); a 2x2 grid covers it all
        (500, 500, (2, 2), 5),
        # 896 x 448: a 1x2 cut covers it whole; transformers reads it as 2 rows, 1 column
        (896, 448, (2, 1), 3),
        (448, 896, (1, 2), 3),
        # 6000 x 50: no grid of 12 tiles or fewer covers 90 %; the most covered wins: 12 cells
        # of 500 x 50 shrunk to 448 x 44.8 each
        (6000, 50, (12, 1), 13),
    ],
)
def test_ovis2_hand_worked(w, h, grid, tiles):
    p = parse_vision_policy("ovis2")
    assert p.grid(w, h) == grid
    c = p.image_cost(w, h)
    assert c.vit_seq_lens == (1024,) * tiles and c.llm_tokens == 256 * tiles
    assert parse_vision_policy(p.spec()) == p
    rows, cols = grid
    assert c.text.count("<IMG_ROW>") == (rows - 1 if tiles > 1 else 0)
    assert c.text.count("<IMG_COL>") == (rows * (cols - 1) if tiles > 1 else 0)
    with pytest.raises(ValueError, match="min_tiles"):
        parse_vision_policy("ovis2:min_tiles=3,max_tiles=2")


@pytest.mark.parametrize(("lo", "hi"), [(4, 4), (5, 6), (6, 6), (3, 4), (1, 12)])
def test_ovis2_closest_grid_ties_equal_its_processor(lo, hi):
    """Without the covering rule, ties between equally close grids of one tile count (a 5:2
    image with 4 tiles: 2 x 2 or 4 x 1) go as ``Ovis2ImageProcessor``'s own grid function
    breaks them: its rows and columns are the prompt's markers."""
    pytest.importorskip("transformers")
    from transformers.models.ovis2 import image_processing_pil_ovis2 as ovis2

    policy = parse_vision_policy(f"ovis2:covering=0,min_tiles={lo},max_tiles={hi}")
    wrong = []
    for w, h in _tie_sizes(lo, hi):
        cols, rows = ovis2.get_optimal_tiled_canvas((h, w), (448, 448), lo, hi)
        if policy.grid(w, h) != (rows, cols):
            wrong.append(((w, h), (rows, cols), policy.grid(w, h)))
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"


@pytest.mark.parametrize("spec", ["ovis2", "ovis2:covering=0,min_tiles=2,max_tiles=9"])
def test_ovis2_equals_its_processor(spec, tokenizer_path, tmp_path):
    """Grids equal the ones ``Ovis2ImageProcessor`` picks (its own grid functions) over 4000
    sizes and its output on 40 real images (tiles and thumbnail); the prompt ``Ovis2Processor``
    writes for each grid has as many tokens as prep's counter finds in the policy's text plus
    the policy's atoms (hidden stride 2, and 3 with its padding)."""
    import random

    from PIL import Image

    pytest.importorskip("transformers")
    from transformers import Ovis2Processor, PreTrainedTokenizerFast
    from transformers.models.ovis2 import image_processing_pil_ovis2 as ovis2

    from dataprep.policies.ovis2 import OVIS2_MARKERS
    from dataprep.text_tokens import TokenCounter, TokenizerSpec

    policy = parse_vision_policy(spec)
    covering = policy.covering
    kwargs = {"min_patches": policy.min_tiles, "max_patches": policy.max_tiles}
    ip = ovis2.Ovis2ImageProcessorPil(
        crop_to_patches=True, size={"height": 448, "width": 448},
        use_covering_area_grid=covering, **kwargs,
    )  # fmt: skip
    rng = random.Random(3)
    wrong = []
    for w, h in [(rng.randint(1, 7000), rng.randint(1, 7000)) for _ in range(4000)]:
        if covering:
            cols, rows = ovis2.get_min_tile_covering_grid((h, w), 448, policy.max_tiles)
        else:
            cols, rows = ovis2.get_optimal_tiled_canvas((h, w), (448, 448), *kwargs.values())
        if policy.grid(w, h) != (rows, cols):
            wrong.append(((w, h), (rows, cols), policy.grid(w, h)))
    for w, h in [(rng.randint(1, 2000), rng.randint(1, 2000)) for _ in range(40)]:
        out = ip(images=[Image.new("RGB", (w, h))], return_tensors="np")
        want = (tuple(out["grids"][0].tolist()), (1024,) * len(out["pixel_values"]))
        if (policy.grid(w, h), policy.image_cost(w, h).vit_seq_lens) != want:
            wrong.append(((w, h), want, policy.image_cost(w, h)))
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": ["<IMG_ATOM>", *OVIS2_MARKERS]})
    tok.backend_tokenizer.save(str(tmp_path / "ovis2.json"))
    counter = TokenCounter(TokenizerSpec.parse(str(tmp_path / "ovis2.json")))
    for stride, atoms in ((2, 256), (3, 121)):  # 32 patches a side: 16, or 11 padded
        sep = "," if ":" in spec else ":"
        p = parse_vision_policy(f"{spec}{sep}hidden_stride={stride}")
        proc = Ovis2Processor(image_processor=ip, tokenizer=tok, image_seq_length=atoms)
        for w, h in ((448, 448), (896, 448), (500, 500), (1000, 700), (6000, 50), (50, 3000)):
            rows, cols = p.grid(w, h)
            prompt = proc.replace_image_token({"grids": [np.array([rows, cols])]}, 0)
            c = p.image_cost(w, h)
            want = len(tok(prompt, add_special_tokens=False)["input_ids"])
            got = counter.count([c.text])[0] + c.llm_tokens
            assert c.llm_tokens == atoms * len(c.vit_seq_lens) and got == want, (w, h, got, want)


@pytest.mark.parametrize(
    ("spec", "w", "h", "crops", "patches", "tokens"),
    [
        ("aria", 4000, 30, 1, 4900, 256),  # not split: one 980-px crop, whatever the size
        # 1000 x 500 split: of the 490-px grids, 2x3 (980 x 1470 px) keeps all 500000 pixels
        # with the least left empty (2x4 keeps them too, with more empty): 1 x 2 crops of 980
        ("aria:split=1", 1000, 500, 2, 4900, 512),
        # the same grid cut into 490-px crops: 2 x 3, 128 tokens each
        ("aria:split=1,max_image_size=490", 1000, 500, 6, 1225, 768),
    ],
)
def test_aria_hand_worked(spec, w, h, crops, patches, tokens):
    p = parse_vision_policy(spec)
    c = p.image_cost(w, h)
    assert c.vit_seq_lens == (patches,) * crops and c.llm_tokens == tokens
    assert parse_vision_policy(p.spec()) == p
    with pytest.raises(ValueError, match="490 or 980"):
        parse_vision_policy("aria:max_image_size=448")


def test_aria_settings_at_their_limits():
    """tokens 0 (the released counts) and patch_size 1 are taken; tokens -1, patch_size 0 (a
    ZeroDivisionError before) and a patch size the image size is no multiple of are refused
    naming the fix; a crop's patches are whole numbers; the policy is an immutable value."""
    import dataclasses

    from dataprep.policies.aria import AriaPolicy

    assert AriaPolicy(tokens=0).image_cost(980, 980).llm_tokens == 256
    one = AriaPolicy(patch_size=1).image_cost(980, 980)
    assert one.vit_seq_lens == (980 * 980,) and isinstance(one.vit_seq_lens[0], int)
    assert all(isinstance(n, int) for n in AriaPolicy().image_cost(640, 480).vit_seq_lens)
    for bad, match in (
        ({"tokens": -1}, r"AriaPolicy\.tokens must be a whole number"),
        ({"patch_size": 0}, "multiple of patch_size"),
        ({"patch_size": 15}, "multiple of patch_size"),
        ({"patch_size": -14}, r"AriaPolicy\.patch_size must be a whole number"),
    ):
        with pytest.raises(ValueError, match=match):
            AriaPolicy(**bad)
    policy = AriaPolicy()
    assert hash(policy) == hash(AriaPolicy())  # a value: usable as a cache key
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.tokens = 5


@pytest.mark.parametrize("spec", ["aria:split=1", "aria:split=1,max_image_size=490", "aria"])
def test_aria_equals_its_image_processor(spec):
    """Crops equal ``AriaImageProcessor``'s count (``get_number_of_image_patches``) over 3000
    sizes and its crops of 12 real images, every crop padded to ``max_image_size``."""
    import random

    from PIL import Image

    pytest.importorskip("transformers")
    from transformers.models.aria import AriaImageProcessorPil

    policy = parse_vision_policy(spec)
    ip = AriaImageProcessorPil(max_image_size=policy.max_image_size, split_image=policy.split)
    side = policy.max_image_size // 14
    rng = random.Random(4)
    wrong = []
    for w, h in [(rng.randint(1, 9000), rng.randint(1, 9000)) for _ in range(3000)]:
        if ip.get_number_of_image_patches(h, w, {}) != len(policy.image_cost(w, h).vit_seq_lens):
            wrong.append((w, h))
    for w, h in [(rng.randint(1, 2500), rng.randint(1, 2500)) for _ in range(12)]:
        out = ip(images=[Image.new("RGB", (w, h))], return_tensors="np")
        n, _, hh, ww = out["pixel_values"].shape
        if (
            policy.image_cost(w, h).vit_seq_lens != ((hh // 14) * (ww // 14),) * n
            or hh != side * 14
        ):
            wrong.append((w, h, out["pixel_values"].shape))
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"


@pytest.mark.parametrize(
    ("spec", "w", "h", "grid", "tiles"),
    [
        ("granite-docling", 512, 512, (1, 1), 1),  # one tile, no thumbnail
        # aspect 2: 1x2 and 2x4 tie; the page has less than half of 2x4's area: 1x2 + thumbnail
        ("granite-docling", 1000, 500, (1, 2), 3),
        # aspect 2 and large: the tie goes to 2x4 (4x8 has 32 tiles and ties too, the page
        # has less than half its area)
        ("granite-docling", 2000, 1000, (2, 4), 9),
        # aspect 50: the widest grid a side allows, 16 tiles (the markers stop at 16)
        ("granite-docling", 5000, 100, (1, 16), 17),
        ("granite-docling:split=0", 5000, 100, (1, 1), 1),
    ],
)
def test_granite_docling_hand_worked(spec, w, h, grid, tiles):
    p = parse_vision_policy(spec)
    assert p.grid(w, h) == grid
    c = p.image_cost(w, h)
    assert c.vit_seq_lens == (1024,) * tiles and c.llm_tokens == 64 * tiles
    assert parse_vision_policy(p.spec()) == p
    fine = parse_vision_policy(spec + ("," if ":" in spec else ":") + "fine=1")
    assert fine.image_cost(w, h).llm_tokens == 4 * 64 * tiles
    # a one-tile page's newline follows its tokens (it joins the template's text after it)
    if tiles == 1:
        assert c.after == "\n" and not c.text.endswith("\n")
    else:
        assert c.after == "<fake_token_around_image>"


@pytest.mark.parametrize(
    ("spec", "kwargs"),
    [
        ("granite-docling", {}),
        ("granite-docling:min_tiles=2,max_tiles=12", {"min_patches": 2, "max_patches": 12}),
        (  # the spread rule: wide pages its canvas leaves under-resolved get up to 64 tiles
            "granite-docling:dense_max_tiles=64,dense_max_scale=0.8,dense_min_aspect=1.2",
            {"dense_max_patches": 64, "dense_max_scale": 0.8, "dense_min_aspect": 1.2},
        ),
        (  # the aspect tests only, the widest strips kept on max_tiles
            "granite-docling:dense_max_tiles=48,dense_min_aspect=1.3,dense_max_aspect=5.5",
            {"dense_max_patches": 48, "dense_min_aspect": 1.3, "dense_max_aspect": 5.5},
        ),
    ],
)
def test_granite_docling_equals_its_image_processor(spec, kwargs):
    """Grids and tiles equal ``GraniteDoclingImageProcessor``'s (``get_tile_grid``,
    ``get_number_of_image_patches``) over 4000 sizes and its tiles of 10 real pages."""
    import random

    from PIL import Image

    pytest.importorskip("transformers")
    from transformers.models.granite_docling import GraniteDoclingImageProcessorPil

    policy = parse_vision_policy(spec)
    ip = GraniteDoclingImageProcessorPil(**kwargs)
    rng = random.Random(6)
    wrong = []
    sizes = [(rng.randint(1, 9000), rng.randint(1, 9000)) for _ in range(4000)]
    for w, h in sizes:
        want = (ip.get_tile_grid(h, w), ip.get_number_of_image_patches(h, w))
        if (policy.grid(w, h), len(policy.image_cost(w, h).vit_seq_lens)) != want:
            wrong.append(((w, h), want))
    for w, h in [(rng.randint(1, 2000), rng.randint(1, 2000)) for _ in range(10)]:
        out = ip(images=[[Image.new("RGB", (w, h))]], return_tensors="np")
        tiles = int(out["pixel_attention_mask"].sum())
        if (
            len(policy.image_cost(w, h).vit_seq_lens) != tiles
            or out["pixel_values"].shape[-1] != 512
        ):
            wrong.append(((w, h), tiles))
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"
    if kwargs.get("dense_max_patches"):  # the rule changed many pages' grids
        plain = parse_vision_policy("granite-docling")
        changed = sum(policy.grid(w, h) != plain.grid(w, h) for w, h in sizes)
        assert changed > len(sizes) // 20, changed
    assert parse_vision_policy(policy.spec()) == policy


def _newline_tokenizer(path) -> str:
    """A byte-level BPE with Qwen's split pattern, trained on text full of blank lines: ``\\n\\n``
    and ``\\n\\n\\n`` are single tokens, as in Qwen's and Granite's vocabularies."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.dataprep.test_jinja_template import QWEN_PATTERN

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["a page\n\nof text\n\n\nhello world\nhi"] * 50, trainer)
    tok.save(str(path))
    return str(path)


def test_granite_docling_prompt_counts_equal_its_processor(tmp_path):
    """Prep's count of a page (its markers, tokens, newlines, with the template's text around)
    equals the tokens of ``GraniteDoclingProcessor``'s prompt, coarse and fine, with a
    tokenizer where blank lines are one token: a one-tile page's closing newline joins a
    newline the template writes after the image into one token."""
    pytest.importorskip("transformers")
    from transformers import GraniteDoclingProcessor, PreTrainedTokenizerFast
    from transformers.models.granite_docling import GraniteDoclingImageProcessorPil

    from dataprep.measure import with_image_text
    from dataprep.records import IMAGE_PLACEHOLDER
    from dataprep.text_tokens import TokenCounter, TokenizerSpec

    tok = PreTrainedTokenizerFast(tokenizer_file=_newline_tokenizer(tmp_path / "nl.json"))
    markers = ["<fake_token_around_image>", "<global-img>", "<image>"]
    markers += [f"<row_{r}_col_{c}>" for r in range(1, 17) for c in range(1, 17)]
    tok.add_special_tokens({"additional_special_tokens": markers})
    tok.backend_tokenizer.save(str(tmp_path / "granite.json"))
    counter = TokenCounter(TokenizerSpec.parse(str(tmp_path / "granite.json")))
    assert len(tok("\n\n", add_special_tokens=False)["input_ids"]) == 1
    ip = GraniteDoclingImageProcessorPil()
    for fine in (False, True):
        proc = GraniteDoclingProcessor(image_processor=ip, tokenizer=tok, image_seq_len=64)
        policy = parse_vision_policy(f"granite-docling:fine={int(fine)}")
        for w, h in ((512, 512), (300, 200), (1000, 500), (5000, 100), (600, 2000)):
            rows, cols = policy.grid(w, h)
            inputs = {"rows": [[rows]], "cols": [[cols]]}
            if fine:
                inputs["tile_fine_mask"] = None
            page = proc.replace_image_token(inputs, 0)
            cost = policy.image_cost(w, h)
            for before, after in (("hi ", "\nhello"), ("", "\n\nof text"), ("a", "hello")):
                want = len(tok(before + page + after, add_special_tokens=False)["input_ids"])
                text = with_image_text(before + IMAGE_PLACEHOLDER + after, [cost])
                got = counter.count([text])[0] + cost.llm_tokens
                assert got == want, (fine, w, h, before, after, got, want)


@pytest.mark.parametrize(
    ("spec", "w", "h", "crops"),
    [
        # longest side 2000 -> 980, the other 245 raised to 378 on its own: 27 x 70 patches
        ("idefics2", 2000, 500, [1890]),
        # small: both sides raised to 378 (27 x 27 patches)
        ("idefics2", 100, 40, [729]),
        # split: four 250 x 1000 quarters, each to 378 x 980, and the whole image
        ("idefics2:split=1", 2000, 500, [1890] * 5),
        # split, odd sides: quarters of 33/34 x 50/51 px, all raised to 378 x 378
        ("idefics2:split=1", 101, 67, [729] * 5),
    ],
)
def test_idefics2_hand_worked(spec, w, h, crops):
    p = parse_vision_policy(spec)
    c = p.image_cost(w, h)
    assert list(c.vit_seq_lens) == crops and c.llm_tokens == 64 * len(crops)
    assert parse_vision_policy(p.spec()) == p
    fake = "<fake_token_around_image>"
    assert c.after == fake and c.text.count(fake) == len(crops)


@pytest.mark.parametrize("split", [False, True])
def test_idefics2_equals_its_image_processor(split):
    """Each crop's size equals ``Idefics2ImageProcessor``'s resize over 4000 sizes, and its
    patches the cells of the pixel mask the model keeps, for 12 real images."""
    import random

    from PIL import Image

    pytest.importorskip("transformers")
    from transformers.image_utils import SizeDict
    from transformers.models.idefics2 import Idefics2ImageProcessorPil
    from transformers.models.idefics2.image_processing_pil_idefics2 import (
        get_resize_output_image_size,
    )

    from dataprep.policies.idefics2 import idefics2_crops, idefics2_resize
    from tests.dataprep.test_jinja_template import idefics2_patches

    size = SizeDict(shortest_edge=378, longest_edge=980)
    ip = Idefics2ImageProcessorPil(do_image_splitting=split)
    rng = random.Random(8)
    wrong = []
    for w, h in [(rng.randint(1, 9000), rng.randint(1, 9000)) for _ in range(4000)]:
        image = np.broadcast_to(np.zeros(1, dtype=np.uint8), (3, h, w))  # no memory
        crops = ip.split_images(image) if split else [image]  # the processor's own cut
        want = [tuple(get_resize_output_image_size(c, size)) for c in crops]
        got = [idefics2_resize(ch, cw, 378, 980) for ch, cw in idefics2_crops(w, h, split)]
        if got != want or [c.shape[-2:] for c in crops] != idefics2_crops(w, h, split):
            wrong.append(((w, h), want))
    policy = parse_vision_policy(f"idefics2:split={int(split)}")
    for w, h in [(rng.randint(1, 2500), rng.randint(1, 2500)) for _ in range(12)]:
        out = ip(images=[[Image.new("RGB", (w, h), (200, 10, 10))]], return_tensors="np")
        want = idefics2_patches(out["pixel_attention_mask"][0], 14)
        if list(policy.image_cost(w, h).vit_seq_lens) != want:
            wrong.append(((w, h), want))
    assert len(idefics2_crops(10, 10, split)) == (5 if split else 1)
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"


@pytest.mark.parametrize("split", [False, True])
def test_idefics2_prompt_counts_equal_its_processor(split, tmp_path, tokenizer_path):
    """Prep's count of a text with images (the fake tokens around each crop, joined between
    adjacent images; the space the processor puts after one that text follows) equals the
    tokens of ``Idefics2Processor``'s prompt, and HFPacker's image texts are the processor's."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers import Idefics2Processor, PreTrainedTokenizerFast
    from transformers.models.idefics2 import Idefics2ImageProcessorPil

    from dataprep.measure import with_image_text
    from dataprep.policies.idefics2 import FAKE, idefics2_image_texts
    from dataprep.records import IMAGE_PLACEHOLDER
    from dataprep.text_tokens import TokenCounter, TokenizerSpec

    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": [FAKE, "<image>", "<end_of_utterance>"]})
    tok.backend_tokenizer.save(str(tmp_path / "idefics2.json"))
    counter = TokenCounter(TokenizerSpec.parse(str(tmp_path / "idefics2.json")))
    ip = Idefics2ImageProcessorPil(do_image_splitting=split)
    proc = Idefics2Processor(image_processor=ip, tokenizer=tok, image_seq_len=64)
    policy = parse_vision_policy(f"idefics2:split={int(split)}")
    image = Image.new("RGB", (500, 300), (0, 90, 200))
    per_image = (FAKE + "<image>" * 64 + FAKE) * (5 if split else 1)
    per_image = per_image.replace(FAKE + FAKE, FAKE)
    texts = [
        "User:<image>What is it?",
        "User:<image><image>\nand <image> <b>x</b><image>",
        "<image>",
        "<image>a<image>",
        "a photo<image>\n<image>café",
        "<image>x=3;<image>chart",  # a space in front changes these words' token counts
        "<image>2023 <image>{json}",
    ]
    for text in texts:
        n = text.count("<image>")
        want = proc(text=[text], images=[[image] * n])["input_ids"][0]
        costs = [policy.image_cost(*image.size)] * n
        ours = policy.prompt(with_image_text(text.replace("<image>", IMAGE_PLACEHOLDER), costs))
        got = counter.count([ours])[0] + sum(c.llm_tokens for c in costs)
        assert got == len(want), (split, text, got, len(want))
        parts = text.split("<image>")
        filled = idefics2_image_texts(parts, [per_image] * n)
        built = parts[0] + "".join(t + p for t, p in zip(filled, parts[1:], strict=True))
        assert tok(built, add_special_tokens=False)["input_ids"] == list(want), (split, text)


def test_deepseek_vl_hybrid_two_sequences_an_image():
    """DeepSeek-VL 7B: SigLIP's 24 x 24 patches are the image's tokens, SAM's 64 x 64 on the
    1024-px copy a second encoder sequence, whatever the image's size."""
    p = parse_vision_policy("deepseek-vl-hybrid")
    for w, h in [(1, 1), (384, 384), (4000, 90)]:
        c = p.image_cost(w, h)
        assert c.vit_seq_lens == (576, 4096) and c.llm_tokens == 576
    small = parse_vision_policy("deepseek-vl-hybrid:image_size=56,patch_size=7,high_res_size=112")
    assert (
        small.image_cost(9, 9).vit_seq_lens == (64, 49)
        and parse_vision_policy(small.spec()) == small
    )
    with pytest.raises(ValueError, match="divisible"):
        parse_vision_policy("deepseek-vl-hybrid:high_res_size=1000")


def test_deepseek_vl_hybrid_defaults_and_sizes_at_their_limits():
    """The defaults are the image processor's squares (384 and 1024 px) and the towers' patches
    (16 and 16, the high-res config's); a size equal to its patch (one patch) is taken, a size
    one pixel off a multiple, or a size or patch of 0, is refused; every count a whole number."""
    transformers = pytest.importorskip("transformers")
    ip = transformers.models.deepseek_vl_hybrid.DeepseekVLHybridImageProcessorPil()
    sam = transformers.DeepseekVLHybridConfig().high_res_vision_config
    p = parse_vision_policy("deepseek-vl-hybrid")
    assert (p.image_size, p.high_res_size) == (ip.size.height, ip.high_res_size.height)
    assert (p.high_res_size, p.high_res_patch_size) == (sam.image_size, sam.patch_size)
    one = parse_vision_policy(
        "deepseek-vl-hybrid:image_size=16,patch_size=16,high_res_size=1,high_res_patch_size=1"
    )
    c = one.image_cost(5, 5)
    assert c.vit_seq_lens == (1, 1) and c.llm_tokens == 1
    assert all(type(x) is int for x in (*p.image_cost(7, 9).vit_seq_lens, c.llm_tokens))
    for bad in (
        "image_size=0",
        "patch_size=0",
        "high_res_size=0",
        "high_res_patch_size=0",
        "image_size=385",
        "image_size=383",
        "high_res_size=1025",
        "high_res_patch_size=17",
    ):
        with pytest.raises(ValueError, match="divisible"):
            parse_vision_policy(f"deepseek-vl-hybrid:{bad}")
    from dataprep.policies.deepseek_hybrid import DeepseekHybridPolicy

    with pytest.raises(TypeError):  # keyword-only, as every policy
        DeepseekHybridPolicy(384)


# ---------------------------------------------- a recorded spec rebuilds the policy it names
def _other_values(fam, base, opt):
    cur = getattr(base, opt, None)
    if opt in fam.flags:
        return [1 - int(cur)]
    if opt in fam.ints:
        return [v for v in (cur * 2 if cur else 1, cur // 2 if cur else 2, (cur or 0) + 1) if v]
    if opt in fam.floats:
        return [cur * 1.5 if cur else 0.5]
    return [c for c in fam.strings[opt] if c != cur]


SIZES = [(w, h) for w in (17, 224, 448, 640, 1000, 1920, 3000) for h in (31, 336, 512, 1080, 4000)]


def test_every_option_of_every_policy_survives_its_recorded_spec():
    """prep records ``policy.spec()``; rebalance measures new nights with it, and the collators
    rebuild the policy from it. An option the spec leaves out is silently reset to its default
    there (the bug: ``internvl:patch_size=7`` recorded without its patch size, so a night's new
    samples were counted with 14-px patches). Every option of every registered family, moved
    off its default where the policy accepts the value, must give the same counts after its
    spec is parsed back (gemma3's crop options with pan-and-scan on: off, they count nothing)."""
    from dataprep.errors import SampleRejected
    from dataprep.policies.registry import POLICIES, parse_vision_policy

    checked = 0
    for name, fam in POLICIES.items():
        extra = ",pan_and_scan=1" if name == "gemma3" else ""
        base = parse_vision_policy(name + extra.replace(",", ":", 1))
        for opt in sorted(fam.ints | fam.floats | set(fam.strings)):
            for value in _other_values(fam, base, opt):
                spec = f"{name}:{opt}={value}{extra}"
                try:
                    policy = parse_vision_policy(spec)
                except ValueError:
                    continue  # a value this policy refuses: try the next
                again = parse_vision_policy(policy.spec())
                for w, h in SIZES:
                    try:
                        want = policy.image_cost(w, h)
                    except (ValueError, SampleRejected):  # a size this policy rejects
                        continue
                    assert again.image_cost(w, h) == want, (spec, policy.spec(), (w, h))
                checked += 1
                break
    assert checked >= 60
