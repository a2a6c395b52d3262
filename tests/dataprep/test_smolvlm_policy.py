"""SmolVLM's / Idefics3's policy: each setting at, below and above its limit with its message,
the prompt text of a split image by hand, the spec, and tile counts at the tile boundaries.

Bugs these catch: a tile equal to the patch refused (or one under it taken), a limit of 1 taken
as 0, the rows' and columns' markers transposed or numbered from 0, a newline missing after a
row or before the global tile, a spec that drops a setting, an image exactly one tile wide cut
in two, a side past the processors' 4096-px cap kept (or a cap of another size)."""

from __future__ import annotations

import pytest

from dataprep.policies import parse_vision_policy
from dataprep.policies.smolvlm import IDEFICS3_DEFAULTS, SmolVLMPolicy, smolvlm_grid
from tests.conftest import built_or_refused

F, G = "<fake_token_around_image>", "<global-img>"


@pytest.mark.parametrize(
    ("kw", "bad"),
    [
        ({"patch_size": 1, "tile": 1}, None),
        ({"patch_size": 0}, "patch_size >= 1 and tile >= patch_size, got tile=384, patch_size=0"),
        ({"patch_size": 14, "tile": 14}, None),  # one patch a tile
        ({"patch_size": 14, "tile": 13}, "got tile=13, patch_size=14"),
        ({"longest_edge": 1}, None),
        ({"longest_edge": 0}, "longest_edge >= 1 and tokens_per_tile >= 1, got 0 and 81"),
        ({"tokens_per_tile": 1}, None),
        ({"tokens_per_tile": 0}, "got 1536 and 0"),
    ],
)
def test_settings_at_below_and_above_their_limits(kw, bad):
    p = built_or_refused(SmolVLMPolicy, kw, bad)
    if p is None:
        return
    c = p.image_cost(10, 10)
    side = p.tile // p.patch_size
    assert c.vit_seq_lens[0] == side * side and c.llm_tokens == p.tokens_per_tile * len(
        c.vit_seq_lens
    )


def test_the_prompt_of_a_split_image_by_hand():
    """2 rows x 3 columns: each row's tiles marked row by row from 1, a newline after each row,
    then a newline, the global tile's markers; 7 tiles of 729 patches and 81 tokens."""
    p = SmolVLMPolicy(longest_edge=1152, tile=384)
    assert smolvlm_grid(1152, 768, 1152, 384) == (2, 3)
    c = p.image_cost(1152, 768)
    row1 = f"{F}<row_1_col_1>{F}<row_1_col_2>{F}<row_1_col_3>\n"
    row2 = f"{F}<row_2_col_1>{F}<row_2_col_2>{F}<row_2_col_3>\n"
    assert c.text == row1 + row2 + f"\n{F}{G}{F}"
    assert c.vit_seq_lens == (729,) * 7 and c.llm_tokens == 81 * 7
    # an odd number of split tiles (1 x 3) and the global one
    assert smolvlm_grid(1152, 384, 1152, 384) == (1, 3)
    odd = p.image_cost(1152, 384)
    assert odd.vit_seq_lens == (729,) * 4 and odd.llm_tokens == 81 * 4
    one = SmolVLMPolicy(split=False).image_cost(1152, 768)
    assert one.text == f"{F}{G}{F}" and one.vit_seq_lens == (729,)


@pytest.mark.parametrize(
    ("w", "h", "grid"),
    [
        (384, 384, (0, 0)),  # exactly one tile after scaling to 384: not split
        (384, 100, (0, 0)),
        (385, 385, (0, 0)),  # scaled down to the 384 longest edge
    ],
)
def test_one_tile_wide_is_not_split(w, h, grid):
    assert smolvlm_grid(w, h, 384, 384) == grid


def test_the_spec_names_every_setting_and_idefics3_is_its_defaults():
    p = SmolVLMPolicy(longest_edge=2048, tile=512, patch_size=16, tokens_per_tile=64, split=False)
    assert p.spec() == (
        "smolvlm:longest_edge=2048,tile=512,patch_size=16,tokens_per_tile=64,split=0"
    )
    assert parse_vision_policy(p.spec()) == p
    assert parse_vision_policy("idefics3") == SmolVLMPolicy(**IDEFICS3_DEFAULTS)
    with pytest.raises(TypeError):
        SmolVLMPolicy(1536)  # keyword-only


def test_idefics3_defaults_are_transformers_idefics3s():
    """Anchor: the Idefics3 image processor's sizes, the processor's image_seq_len and the
    config's pixel-shuffle scale: 364-px tiles of 14-px patches, 26^2 / 2^2 = 169 tokens."""
    import inspect

    transformers = pytest.importorskip("transformers")
    from transformers.models.idefics3 import Idefics3Config, Idefics3ImageProcessorPil

    ip = Idefics3ImageProcessorPil()
    seq = inspect.signature(transformers.Idefics3Processor.__init__).parameters["image_seq_len"]
    scale = Idefics3Config().scale_factor
    tile = ip.max_image_size["longest_edge"]
    want = {
        "longest_edge": ip.size.longest_edge,
        "tile": tile,
        "patch_size": tile // (round(seq.default**0.5) * scale),
        "tokens_per_tile": seq.default,
    }
    assert (
        want
        == IDEFICS3_DEFAULTS
        == {
            "longest_edge": 1456,
            "tile": 364,
            "patch_size": 14,
            "tokens_per_tile": 169,
        }
    )


def test_a_longest_edge_that_is_no_multiple_of_the_tile_equals_the_image_processor():
    """The longest side scaled to 200 px with 48-px tiles (not a whole number of them): both
    sides are rounded up to whole tiles, as SmolVLM's image processor cuts them."""
    from PIL import Image

    transformers = pytest.importorskip("transformers")
    ip = transformers.models.smolvlm.SmolVLMImageProcessorPil(
        size={"longest_edge": 200}, max_image_size={"longest_edge": 48}
    )
    policy = SmolVLMPolicy(longest_edge=200, tile=48, patch_size=16, tokens_per_tile=9)
    wrong = []
    for w, h in [(200, 200), (300, 100), (100, 300), (199, 50), (50, 199), (97, 201), (1, 80)]:
        out = ip(images=[[Image.new("RGB", (w, h))]], return_row_col_info=True, return_tensors="np")
        want = (int(out["rows"][0][0]), int(out["cols"][0][0]))
        if smolvlm_grid(w, h, 200, 48) != want:
            wrong.append(((w, h), want, smolvlm_grid(w, h, 200, 48)))
        if len(policy.image_cost(w, h).vit_seq_lens) != out["pixel_values"].shape[1]:
            wrong.append(((w, h), "tiles"))
    assert not wrong, wrong


@pytest.mark.parametrize("longest", [4095, 4096, 4097, 6000])
def test_no_side_past_4096_equals_the_image_processor(longest):
    """The 4096-px cap on either side (the image processors' ``MAX_IMAGE_SIZE``) at, below and
    above it, landscape and portrait, the other side from the aspect ratio: a longest edge of
    4097 or 6000 px is cut back to 4 tiles of 1024 px, not 5 or 6."""
    from PIL import Image

    transformers = pytest.importorskip("transformers")
    ip = transformers.models.smolvlm.SmolVLMImageProcessorPil(
        size={"longest_edge": longest}, max_image_size={"longest_edge": 1024}
    )
    policy = SmolVLMPolicy(longest_edge=longest, tile=1024, patch_size=16, tokens_per_tile=64)
    wrong = []
    for w, h in [(800, 10), (10, 800)]:  # thin: the arrays stay small
        out = ip(images=[[Image.new("RGB", (w, h))]], return_row_col_info=True, return_tensors="np")
        want = (int(out["rows"][0][0]), int(out["cols"][0][0]))
        got = smolvlm_grid(w, h, longest, 1024)
        if got != want or len(policy.image_cost(w, h).vit_seq_lens) != out["pixel_values"].shape[1]:
            wrong.append(((w, h), want, got))
    assert not wrong, wrong
    assert smolvlm_grid(800, 10, longest, 1024) == (1, 4)  # 4096 px wide at most
