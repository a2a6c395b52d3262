"""Tiles padded to a larger size and their outputs cut back (trainer_adapter.hf.tile_sizes),
against the tower run on the tiles as they are: a tiny Idefics2 vision tower (patch masks) gives
the same last hidden state, every layer's hidden states and attention maps on the rank's own
patch grid either way."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer_adapter.hf.tile_sizes import crop_patch_outputs, pad_tiles, tile_table

pytest.importorskip("transformers")


def _tower():
    from transformers import Idefics2VisionConfig
    from transformers.models.idefics2.modeling_idefics2 import Idefics2VisionTransformer

    cfg = Idefics2VisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        image_size=28, patch_size=7,
    )  # fmt: skip
    cfg._attn_implementation = "eager"  # attention maps out
    torch.manual_seed(0)
    return Idefics2VisionTransformer(cfg).double().eval()


@pytest.mark.parametrize("grow", [(0, 0), (7, 0), (9, 21)])
def test_padded_then_cut_equals_the_tiles_as_they_are(grow):
    tower = _tower()
    rng = np.random.default_rng(3)
    h, w = 28, 35  # the rank's tiles; the first one's right part padding, as its processor pads
    pixels = torch.from_numpy(rng.normal(size=(3, 3, h, w)))
    mask = torch.ones(3, h // 7, w // 7, dtype=torch.bool)
    mask[0, :, 3:] = False
    pixels[0, :, :, 21:] = 0
    kw = dict(output_hidden_states=True, output_attentions=True, return_dict=True)
    with torch.no_grad():
        want = tower(pixel_values=pixels, patch_attention_mask=mask, **kw)
        size = (h + grow[0], w + grow[1])
        big, big_mask = pad_tiles(pixels, mask, size, 7)
        assert big.shape[-2:] == size and big_mask.shape[-2:] == (size[0] // 7, size[1] // 7)
        assert not big_mask[:, h // 7 :].any() and not big_mask[:, :, w // 7 :].any()
        got = tower(pixel_values=big, patch_attention_mask=big_mask, **kw)
        got = crop_patch_outputs(got, big_mask.shape[-2:], mask.shape[-2:])
    assert got.last_hidden_state.shape == want.last_hidden_state.shape
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)
    assert len(got.hidden_states) == len(want.hidden_states) == 3
    for a, b in zip(got.hidden_states, want.hidden_states, strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(got.attentions, want.attentions, strict=True):
        torch.testing.assert_close(a, b)


def test_tile_table_and_an_empty_rank():
    pixels = torch.zeros(4, 3, 21, 35)
    # one tile, its size, then its dims before H x W: 1 of them, 3 channels (0-padded to 4)
    assert tile_table(pixels).tolist() == [[1, 21, 35, 1, 3, 0, 0, 0]] * 4
    assert tile_table(pixels[:0]).shape == (0, 8) == tile_table(None).shape
    # Molmo2's crops: [patches, p*p*C] rows, no dims before them
    assert tile_table(torch.zeros(2, 729, 588)).tolist() == [[1, 729, 588, 0, 0, 0, 0, 0]] * 2
    # a rank joining the round: its empty block takes the round's size, whatever its own
    empty, mask = pad_tiles(torch.zeros(0, 3, 980, 980), torch.ones(0, 140, 140), (28, 35), 7)
    assert empty.shape == (0, 3, 28, 35) and mask.shape == (0, 4, 5)


def test_the_round_takes_the_largest_height_and_width_of_any_rank():
    """Reference: each side's maximum over every tile of the round, whichever tile (or rank)
    has it; a size smaller on either side than one rank's tiles would cut them."""
    from types import SimpleNamespace

    from trainer_adapter.hf.tile_sizes import group_tile_size

    rng = np.random.default_rng(1)
    for _ in range(50):
        sizes = [(int(rng.integers(1, 9)) * 7, int(rng.integers(1, 9)) * 7) for _ in range(4)]
        table = np.vstack([tile_table(torch.zeros(1, 3, h, w)) for h, w in sizes])
        route = SimpleNamespace(table=table)
        want = (max(h for h, _ in sizes), max(w for _, w in sizes))
        assert group_tile_size(route, masked=True, where="test") == want
