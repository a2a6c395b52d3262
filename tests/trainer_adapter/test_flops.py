"""Model FLOPs (trainer_adapter.train.flops) against torch's own FlopCounterMode on the real model."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from trainer_adapter.train.flops import block_forward_flops, training_flops
from trainer_adapter.train.model import VisionLanguageModel, VLMConfig

CFG = VLMConfig(
    vocab_size=300,
    patch_dim=12,
    merge=2,
    vit_hidden=32,
    vit_layers=2,
    vit_heads=2,
    llm_hidden=48,
    llm_layers=3,
    llm_heads=2,
)


def _counted(fc: FlopCounterMode) -> tuple[int, int]:
    """(matrix-product FLOPs, attention FLOPs) the counter saw (it counts no attention on
    builds whose CPU attention kernel it does not know)."""
    counts = fc.get_flop_counts()
    total = sum(counts["Global"].values())
    attn = sum(v for op, v in counts["Global"].items() if "scaled_dot_product" in str(op))
    return total - attn, attn


def _attention(cfg_layers: int, hidden: int, lens, causal: bool) -> float:
    return (
        3 * cfg_layers * block_forward_flops(0, sum(n * n for n in lens), hidden, 4, causal=causal)
    )


def test_llm_flops_equal_torchs_count_of_the_real_forward_and_backward():
    torch.manual_seed(0)
    model = VisionLanguageModel(CFG)
    lens = [7, 13, 5]
    x = torch.randn(sum(lens), CFG.llm_hidden, requires_grad=True)
    with FlopCounterMode(display=False) as fc:
        model.llm.logits(model.llm.forward_blocks(x, lens)).sum().backward()
    products, _ = _counted(fc)
    ours = training_flops(CFG, lens)
    assert ours - _attention(CFG.llm_layers, CFG.llm_hidden, lens, True) == products
    # causal attention: half the scores of the same samples without the mask
    assert _attention(1, 48, lens, True) * 2 == _attention(1, 48, lens, False) > 0


def test_encoder_flops_equal_torchs_count():
    torch.manual_seed(0)
    model = VisionLanguageModel(CFG)
    units = torch.tensor([[4, 6], [2, 2], [8, 4]])
    patches = torch.randn(int(units.prod(1).sum()), CFG.patch_dim, requires_grad=True)
    with FlopCounterMode(display=False) as fc:
        model.encode_images(patches, units).sum().backward()
    products, _ = _counted(fc)
    patches_per_unit = units.prod(1).tolist()
    ours = training_flops(CFG, [], patches_per_unit)
    attn = _attention(CFG.vit_layers, CFG.vit_hidden, patches_per_unit, False)
    assert ours - attn == products


def test_flops_grow_with_the_square_of_a_sample_only_through_attention():
    one = training_flops(CFG, [100])
    two = training_flops(CFG, [50, 50])
    assert one > two  # same tokens, longer attention segments
    assert one - two == 3 * CFG.llm_layers * 2 * CFG.llm_hidden * (100**2 - 2 * 50**2)


def test_the_lm_head_is_counted_at_the_target_positions_the_loss_runs_it_on():
    """The trainer's loss (``chunked_lm_loss``) runs the LM head only where a position has a
    next-token target: torch's count of the real forward and backward of blocks, head and
    loss over samples whose prompts, image tokens and last tokens have none equals
    ``training_flops`` with ``targets`` (the loss's own cross entropy aside). The bug named:
    the head counted over every token (MFU overstated by the untrained positions' share,
    11 % or more at a 151k vocabulary)."""
    from trainer_adapter.train.loss import chunked_lm_loss

    torch.manual_seed(0)
    model = VisionLanguageModel(CFG)
    lens = [7, 13, 5]
    target = torch.randint(0, CFG.vocab_size, (sum(lens),))
    target[[0, 1, 2, 6, 7, 8, 9, 19, 20, 24]] = -100  # prompts and each sample's last token
    kept = int((target != -100).sum())
    x = torch.randn(sum(lens), CFG.llm_hidden, requires_grad=True)
    with FlopCounterMode(display=False) as fc:
        h = model.llm.forward_blocks(x, lens)
        loss = chunked_lm_loss(h, target, model.llm.logits, normalizer=1.0, chunk_tokens=4)
        loss.backward()
    products, _ = _counted(fc)
    attention = _attention(CFG.llm_layers, CFG.llm_hidden, lens, True)
    head_forward = 2 * CFG.llm_hidden * CFG.vocab_size * kept
    ours = training_flops(CFG, lens, targets=kept)
    # the chunk's forward is recomputed once in the backward (checkpointing): not model FLOPs
    assert ours - attention == products - head_forward
    every = training_flops(CFG, lens)  # None: every token
    assert every - ours == 3 * 2 * CFG.llm_hidden * CFG.vocab_size * (sum(lens) - kept) > 0
    assert training_flops(CFG, lens, targets=0) < ours < every


def test_audio_encoder_flops_equal_torchs_count():
    """Chunked (every chunk whole, so the stem's batch has no padding to count) and padded
    windows (the whole window runs, however short the recording)."""
    from trainer_adapter.train.audio_encoder import AudioConfig, AudioEncoder
    from trainer_adapter.train.flops import audio_forward_flops

    for cfg, frames in (
        (AudioConfig(mel=5, hidden=16, layers=2, heads=2, out_dim=24, n_window=4), [8, 16, 24]),
        (
            AudioConfig(
                mel=5, hidden=16, layers=2, heads=2, out_dim=24, n_window=0, window_frames=32
            ),
            [3, 32, 17],
        ),
    ):
        torch.manual_seed(0)
        enc = AudioEncoder(cfg)
        x = torch.randn(sum(frames), cfg.mel, requires_grad=True)
        with FlopCounterMode(display=False) as fc:
            enc(x, frames).sum().backward()
        products, _ = _counted(fc)
        seqs = [enc.sequences(f) for f in frames]
        lens = [n for s in seqs for n in s]
        attn = _attention(cfg.layers, cfg.hidden, lens, False)
        assert 3 * audio_forward_flops(cfg, frames) - attn == products
        model_cfg = VLMConfig(
            vocab_size=300, patch_dim=12, merge=2, vit_hidden=32, vit_layers=1, vit_heads=2,
            llm_hidden=24, llm_layers=1, llm_heads=2, audio=cfg,
        )  # fmt: skip
        assert training_flops(model_cfg, [], audio_frames=frames) == 3 * audio_forward_flops(
            cfg, frames
        )


def test_recordings_for_a_model_without_an_audio_encoder_are_refused():
    import pytest

    with pytest.raises(ValueError, match="no audio encoder"):
        training_flops(CFG, [4], audio_frames=[10])
    assert training_flops(CFG, [4], audio_frames=[]) == training_flops(CFG, [4])
