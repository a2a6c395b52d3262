"""Vision policies against hand-worked cases of the published formulas."""

import pytest

from dataprep.errors import SampleRejected
from dataprep.vision_policy import (
    FixedPolicy,
    InternVLPolicy,
    Qwen2VLPolicy,
    internvl_grid,
    parse_vision_policy,
    qwen2vl_smart_resize,
)


def test_fixed_llava15_is_576_for_any_size():
    p = parse_vision_policy("fixed:336/14")
    assert isinstance(p, FixedPolicy)
    for w, h in [(1, 1), (336, 336), (4000, 100)]:
        c = p.image_cost(w, h)
        assert c.vit_seq_lens == (576,) and c.llm_tokens == 576 and c.vit_tokens == 576


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
    ],
)
def test_bad_specs_raise_value_error_with_fix(spec):
    with pytest.raises(ValueError):
        parse_vision_policy(spec)
