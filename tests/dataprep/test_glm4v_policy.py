"""GLM-4V's resize at, below and above every limit, against transformers' own ``smart_resize``
(``image_processing_pil_glm4v``, the function its image and video processors call).

Bugs these catch: the pixel bounds applied past or short of them by one (``>`` for ``>=``),
the temporal frames rounded another way (3 frames of 2 are 4: Python's round halves to even),
the short-side upscaling started at the factor instead of below it, the aspect limit of 200
refusing 200 itself, a setting's limit off by one, a spec that leaves a setting out."""

from __future__ import annotations

import itertools
import math

import pytest

from dataprep.errors import SampleRejected
from dataprep.policies.glm4v import Glm4vPolicy, glm4v_smart_resize, glm4v_video_resize
from tests.conftest import built_or_refused

hf = pytest.importorskip("transformers.models.glm4v.image_processing_pil_glm4v")

FACTOR = 28


def _sides(limit_px: int) -> list[int]:
    """Sides around the factor, around sqrt(limit) (so that h x w lands on, under and over
    it), and the aspect limit's."""
    root = math.isqrt(limit_px)
    near = [root + e for e in (-FACTOR, -1, 0, 1, FACTOR)]
    return sorted({1, 2, 13, 14, 27, 28, 29, 55, 56, 57, 200, *near, 5599, 5600, 5601})


def _theirs(frames, h, w, temporal, min_px, max_px):
    try:
        return hf.smart_resize(frames, h, w, temporal, FACTOR, min_px, max_px)
    except ValueError:
        return "refused"


def _ours(frames, h, w, temporal, min_px, max_px):
    try:
        return glm4v_video_resize(frames, h, w, FACTOR, temporal, min_px, max_px)
    except SampleRejected:
        return "refused"


@pytest.mark.parametrize(
    ("min_px", "max_px"),
    [
        (112 * 112, 2 * 28 * 28 * 100),  # a small max so the shrinking branch is cheap to reach
        (2 * 28 * 28 * 40, 2 * 28 * 28 * 40),  # equal bounds: every size is on one of them
        (112 * 112, 28 * 28 * 15000),  # the image processor's defaults
    ],
)
@pytest.mark.parametrize("frames", [1, 2, 3, 4, 5, 8])
def test_resize_equals_the_processors_around_every_limit(min_px, max_px, frames):
    temporal = 2
    sides = _sides(max_px // temporal) + _sides(min_px // temporal)
    wrong = [
        (h, w)
        for h, w in itertools.product(sorted(set(sides)), repeat=2)
        if _ours(frames, h, w, temporal, min_px, max_px)
        != _theirs(frames, h, w, temporal, min_px, max_px)
    ]
    assert not wrong, wrong[:5]


def test_the_bounds_hold_exactly_at_them():
    """2 frames of 280 x 280 are exactly max_pixels = 2 x 280^2: kept as they are; one step of
    28 px wider is over and shrinks; exactly min_pixels is kept too."""
    top = 2 * 280 * 280
    assert glm4v_smart_resize(280, 280, FACTOR, 112 * 112, top) == (280, 280)
    assert glm4v_smart_resize(280, 308, FACTOR, 112 * 112, top) != (280, 308)
    low = 2 * 112 * 112
    assert glm4v_smart_resize(112, 112, FACTOR, low, top) == (112, 112)
    assert glm4v_smart_resize(112, 84, FACTOR, low, top) != (112, 84)


def test_aspect_200_is_taken_and_past_it_refused():
    assert glm4v_smart_resize(28, 5600)[0] == 28  # exactly 200
    with pytest.raises(SampleRejected) as e:
        glm4v_smart_resize(28, 5601)
    assert e.value.reason == "aspect_ratio_out_of_range"
    assert "5601x28: glm4v accepts aspect ratios up to 200" in str(e.value)


def test_too_few_frames_is_refused_naming_the_model():
    with pytest.raises(SampleRejected) as e:
        glm4v_video_resize(1, 280, 280, FACTOR, 2, 1, 10**9, model="qwen3vl")
    assert e.value.reason == "video_too_short"
    assert "1 frame(s) sampled: the qwen3vl video processor needs at least 2" in str(e.value)
    assert glm4v_video_resize(2, 280, 280, FACTOR, 2, 1, 10**9) == (280, 280)


@pytest.mark.parametrize(
    ("kw", "bad"),
    [
        ({"min_pixels": 1}, None),
        ({"min_pixels": 0}, "0 < min_pixels <= max_pixels, got 0, 11760000"),
        ({"min_pixels": 5000, "max_pixels": 5000}, None),
        ({"min_pixels": 5001, "max_pixels": 5000}, "got 5001, 5000"),
        ({"patch_size": 1, "merge_size": 1, "temporal_patch_size": 1}, None),
        ({"patch_size": 0}, "patch_size, merge_size and temporal_patch_size >= 1, got 0, 2, 2"),
        ({"merge_size": 0}, "got 14, 0, 2"),
        ({"temporal_patch_size": 0}, "got 14, 2, 0"),
    ],
)
def test_settings_at_below_and_above_their_limits(kw, bad):
    p = built_or_refused(Glm4vPolicy, kw, bad)
    if p is None:
        return
    h, w = glm4v_smart_resize(
        600,
        900,
        p.patch_size * p.merge_size,
        p.min_pixels,
        p.max_pixels,
        p.temporal_patch_size,
    )
    patches = (h // p.patch_size) * (w // p.patch_size)
    c = p.image_cost(900, 600)
    assert c.vit_seq_lens == (patches,)
    assert c.llm_tokens == patches // (p.merge_size * p.merge_size)


def test_the_spec_names_every_setting():
    p = Glm4vPolicy(min_pixels=3136, max_pixels=1003520, patch_size=16, merge_size=3)
    assert p.spec() == (
        "glm4v:min_pixels=3136,max_pixels=1003520,patch_size=16,merge_size=3,temporal_patch_size=2"
    )
    assert Glm4vPolicy().spec() == (
        "glm4v:min_pixels=12544,max_pixels=11760000,patch_size=14,merge_size=2,"
        "temporal_patch_size=2"
    )
