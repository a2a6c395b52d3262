"""The VLM's pieces: image tokens match the vision policy, attention stays inside samples."""

from __future__ import annotations

import pytest
import torch

from trainer_adapter.train.model import (
    Block,
    VisionLanguageModel,
    VLMConfig,
    grid_positions,
    merge_for_policy,
    shifted_labels,
)


def _cfg(**kw):
    return VLMConfig.preset("tiny", vocab_size=64, patch_dim=12, **kw)


def test_image_tokens_per_unit_follow_the_merge():
    torch.manual_seed(0)
    m = VisionLanguageModel(_cfg(merge=2))
    hw = torch.tensor([[4, 4], [2, 6], [4, 4]])
    patches = torch.randn(int((hw[:, 0] * hw[:, 1]).sum()), 12)
    out = m.encode_images(patches, hw)
    assert out.shape == (4 + 3 + 4, m.cfg.llm_hidden)
    # a unit's tokens depend on that unit only
    alone = m.encode_images(patches[16:28], hw[1:2])
    torch.testing.assert_close(out[4:7], alone, rtol=1e-5, atol=1e-6)
    empty = m.encode_images(torch.zeros(0, 12), torch.zeros(0, 2, dtype=torch.long))
    assert empty.shape == (0, m.cfg.llm_hidden) and empty.requires_grad


def test_grid_positions_equal_the_sine_cosine_formula_by_hand():
    """Anchor: MAE's 2-D form written out element by element (rows in the first half)."""
    import math

    h, w, dim = 3, 5, 8
    pos = grid_positions(h, w, dim)
    for r in range(h):
        for c in range(w):
            want = []
            for p in (r, c):
                f = [1 / 10000 ** (k / 2) for k in range(2)]
                want += [math.sin(p * x) for x in f] + [math.cos(p * x) for x in f]
            torch.testing.assert_close(pos[r * w + c], torch.tensor(want), rtol=0, atol=1e-6)


def test_a_grid_wider_than_any_table_encodes_and_rows_differ_from_columns():
    """Bug: a learned table of 128 positions a side made `equishard train` fail mid-run on a
    native-resolution image wider than 128 patches (qwen2vl keeps aspect ratios up to 200)."""
    torch.manual_seed(0)
    m = VisionLanguageModel(_cfg(merge=2))
    hw = torch.tensor([[2, 600]])
    out = m.encode_images(torch.randn(1200, 12), hw)
    assert out.shape == (300, m.cfg.llm_hidden) and torch.isfinite(out).all()
    pos = grid_positions(600, 600, 32)
    assert not torch.allclose(pos[1 * 600 + 2], pos[2 * 600 + 1])  # (1, 2) is not (2, 1)
    assert len({tuple(r) for r in pos[:: 599 * 7].tolist()}) == len(pos[:: 599 * 7])


def test_vit_hidden_must_split_into_row_and_column_sines_and_cosines():
    with pytest.raises(ValueError, match="multiple of 4"):
        VLMConfig(vocab_size=8, vit_hidden=6, vit_heads=2)
    VLMConfig(vocab_size=8, vit_hidden=8, vit_heads=2)


@pytest.mark.parametrize(
    "spec,merge",
    [("internvl", 2), ("fixed:336/14", 1), ("qwen2vl", 2)],
)
def test_merge_matches_the_policy_token_count(spec, merge):
    from dataprep.policies import parse_vision_policy

    pol = parse_vision_policy(spec)
    assert merge_for_policy(pol) == merge
    cost = pol.image_cost(1000, 700)
    assert cost.llm_tokens == sum(n // merge**2 for n in cost.vit_seq_lens)


def test_packed_causal_attention_equals_per_sample():
    torch.manual_seed(0)
    blk = Block(16, 2, 2, causal=True)
    a, b = torch.randn(5, 16), torch.randn(9, 16)
    packed = blk(torch.cat([a, b]), [5, 9])
    torch.testing.assert_close(packed[:5], blk(a, [5]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(packed[5:], blk(b, [9]), rtol=1e-5, atol=1e-6)
    # causal: the first token does not see the second
    b2 = b.clone()
    b2[1:] += 1.0
    torch.testing.assert_close(blk(b2, [9])[0], blk(b, [9])[0])


def test_embed_places_image_embeddings_in_order():
    torch.manual_seed(0)
    m = VisionLanguageModel(_cfg())
    ids = torch.tensor([3, 7, 7, 4, 7])
    img = torch.arange(3 * m.cfg.llm_hidden, dtype=torch.float32).view(3, -1)
    x = m.llm.embed(ids, torch.zeros(5, dtype=torch.long), img, image_token_id=7)
    pos0 = m.llm.pos(torch.zeros(1, dtype=torch.long))[0]
    torch.testing.assert_close(x[1] - pos0, img[0])
    torch.testing.assert_close(x[4] - pos0, img[2])
    with pytest.raises(ValueError, match="image tokens"):
        m.llm.embed(ids, torch.zeros(5, dtype=torch.long), img[:2], image_token_id=7)


def test_shifted_labels_stay_inside_samples():
    labels = torch.tensor([-100, 5, 6, -100, 8, 9])
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    assert shifted_labels(labels, cu).tolist() == [5, 6, -100, 8, 9, -100]


def test_config_validation():
    with pytest.raises(ValueError, match="multiple"):
        VLMConfig(vocab_size=10, llm_hidden=10, llm_heads=3)
    with pytest.raises(ValueError, match="unknown model size"):
        VLMConfig.preset("huge", vocab_size=10)


def test_a_pipeline_rank_builds_only_its_layers_with_the_whole_models_values():
    """Parts a rank keeps equal the whole model's from the same seed; the rest are never kept
    (dropped as built), so the rank's parameters are its share only."""
    import torch
    from torch import nn

    from trainer_adapter.train.model import VisionLanguageModel, VLMConfig

    cfg = VLMConfig.preset("tiny", vocab_size=97)
    torch.manual_seed(3)
    whole = VisionLanguageModel(cfg)
    keep = {"block1", "block2", "norm", "head"}
    torch.manual_seed(3)
    part = VisionLanguageModel(cfg, keep_llm=keep.__contains__)
    mine = dict(part.named_parameters())
    for name, p in whole.named_parameters():
        kept = not name.startswith("llm.") or any(
            name.startswith(f"llm.{k}.") for k in ("blocks.1", "blocks.2", "norm", "head")
        )
        assert (name in mine) == kept, name
        if kept:
            assert torch.equal(mine[name], p), name
    assert isinstance(part.llm.tok, nn.Identity) and isinstance(part.llm.blocks[0], nn.Identity)
    assert sum(p.numel() for p in part.parameters()) < sum(p.numel() for p in whole.parameters())


def test_the_vision_encoder_batching_units_by_shape_equals_encoding_each_unit_alone():
    """Units of one grid shape run as one batch; interleaved shapes must land back in place.
    Reference: each unit encoded on its own (a batch of one), concatenated in order."""
    torch.manual_seed(0)
    model = VisionLanguageModel(_cfg(merge=1))
    hw = torch.tensor([[2, 2], [4, 2], [2, 2], [3, 3], [4, 2], [1, 5]])
    n = int(hw.prod(dim=1).sum())
    patches = torch.randn(n, 12)
    got = model.vision(patches, hw)
    parts, start = [], 0
    for h, w in hw.tolist():
        parts.append(model.vision(patches[start : start + h * w], torch.tensor([[h, w]])))
        start += h * w
    torch.testing.assert_close(got, torch.cat(parts), rtol=1e-5, atol=1e-5)
