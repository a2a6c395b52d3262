"""The reference trainer's audio encoder against transformers' own towers, given the same
weights: Qwen2.5-Omni's (unpadded chunks) and Qwen2-Audio's (padded windows, the padding's
keys masked), recordings of every length around the chunk and window limits."""

from __future__ import annotations

import pytest
import torch

from dataprep.media_rules.whisper_audio import audio_tokens, chunk_positions
from trainer_adapter.train.audio_encoder import AudioConfig, AudioEncoder, sinusoids

transformers = pytest.importorskip("transformers")

MEL, HIDDEN, HEADS, LAYERS, OUT = 16, 16, 2, 2, 24


def _copy_layers(ours: AudioEncoder, layers) -> None:
    """HF's Whisper-style layers -> our blocks (k_proj has no bias: a zero one here)."""
    for blk, layer in zip(ours.blocks, layers, strict=True):
        a = layer.self_attn
        blk.norm1.load_state_dict(layer.self_attn_layer_norm.state_dict())
        blk.norm2.load_state_dict(layer.final_layer_norm.state_dict())
        blk.qkv.weight.data = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        kb = torch.zeros_like(a.q_proj.bias) if a.k_proj.bias is None else a.k_proj.bias
        blk.qkv.bias.data = torch.cat([a.q_proj.bias, kb, a.v_proj.bias])
        blk.proj.load_state_dict(a.out_proj.state_dict())
        blk.mlp[0].load_state_dict(layer.fc1.state_dict())
        blk.mlp[2].load_state_dict(layer.fc2.state_dict())


def _omni(n_window: int):
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (
        Qwen2_5OmniAudioEncoderConfig,
    )
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioEncoder

    torch.manual_seed(0)
    cfg = Qwen2_5OmniAudioEncoderConfig(
        d_model=HIDDEN,
        encoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        encoder_ffn_dim=4 * HIDDEN,
        output_dim=OUT,
        num_mel_bins=MEL,
        max_source_positions=128,
        n_window=n_window,
    )
    theirs = Qwen2_5OmniAudioEncoder(cfg).double().eval()
    ours = AudioEncoder(
        AudioConfig(
            mel=MEL, hidden=HIDDEN, layers=LAYERS, heads=HEADS, out_dim=OUT, n_window=n_window
        )
    ).double()
    ours.conv1.load_state_dict(theirs.conv1.state_dict())
    ours.conv2.load_state_dict(theirs.conv2.state_dict())
    ours.norm.load_state_dict(theirs.ln_post.state_dict())
    ours.proj.load_state_dict(theirs.proj.state_dict())
    _copy_layers(ours, theirs.layers)
    return ours, theirs


@pytest.mark.parametrize("n_window", [4, 8])
def test_unpadded_equals_qwen25_omnis_audio_encoder(n_window):
    """Recordings from 1 frame to several chunks (a chunk's exact multiple, one frame either
    side), in one call: the same tokens, to float64 rounding, and the same gradients."""
    ours, theirs = _omni(n_window)
    size = 2 * n_window
    lengths = [1, 2, 3, 4, 5, size - 1, size, size + 1, 2 * size, 3 * size + 3, 7]
    x = torch.randn(sum(lengths), MEL, dtype=torch.float64)
    got = ours(x, lengths)
    want = theirs(x.T.contiguous(), torch.tensor(lengths), None).last_hidden_state
    assert got.shape == (sum(audio_tokens(n) for n in lengths), OUT)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    got.square().sum().backward()
    want.square().sum().backward()
    torch.testing.assert_close(ours.conv1.weight.grad, theirs.conv1.weight.grad)
    torch.testing.assert_close(ours.blocks[0].mlp[0].weight.grad, theirs.layers[0].fc1.weight.grad)


def test_sequences_are_the_chunks_the_runtime_balances():
    ours, _ = _omni(8)
    for n in (1, 15, 16, 17, 40):
        assert ours.sequences(n) == chunk_positions(n, 8)
    padded = AudioEncoder(AudioConfig(mel=MEL, hidden=HIDDEN, n_window=0, window_frames=32))
    assert padded.sequences(3) == padded.sequences(32) == (16,)


def _qwen2_audio(window: int):
    from transformers import Qwen2AudioEncoderConfig
    from transformers.models.qwen2_audio.modeling_qwen2_audio import Qwen2AudioEncoder

    torch.manual_seed(1)
    cfg = Qwen2AudioEncoderConfig(
        d_model=HIDDEN,
        encoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        encoder_ffn_dim=4 * HIDDEN,
        num_mel_bins=MEL,
        max_source_positions=window // 2,
    )
    theirs = Qwen2AudioEncoder(cfg).double().eval()
    ours = AudioEncoder(
        AudioConfig(
            mel=MEL, hidden=HIDDEN, layers=LAYERS, heads=HEADS, out_dim=OUT, n_window=0,
            window_frames=window,
        )
    ).double()  # fmt: skip
    ours.conv1.load_state_dict(theirs.conv1.state_dict())
    ours.conv2.load_state_dict(theirs.conv2.state_dict())
    ours.norm.load_state_dict(theirs.layer_norm.state_dict())
    _copy_layers(ours, theirs.layers)
    # Whisper's positions are sinusoids at init; ours are those, fixed
    theirs.embed_positions.weight.data = sinusoids(window // 2, HIDDEN).double()
    return ours, theirs


def test_padded_equals_qwen2_audios_encoder():
    """Each recording zero-padded to the window and run whole, its padding's keys masked as
    Qwen2-Audio's model masks them; the recording's own tokens kept, as the model keeps them."""
    from transformers.masking_utils import create_bidirectional_mask

    window = 32
    ours, theirs = _qwen2_audio(window)
    lengths = [1, 4, 5, 17, 31, 32]
    x = torch.randn(sum(lengths), MEL, dtype=torch.float64)
    got = ours.encode(x, lengths)
    feats = torch.zeros(len(lengths), MEL, window, dtype=torch.float64)
    for i, r in enumerate(x.split(lengths)):
        feats[i, :, : r.shape[0]] = r.T
    positions = window // 2
    valid = torch.tensor([(n - 1) // 2 + 1 for n in lengths])
    mask2d = (torch.arange(positions)[None] < valid[:, None]).long()
    mask = create_bidirectional_mask(
        config=theirs.config,
        inputs_embeds=torch.zeros(len(lengths), positions, 1, dtype=torch.float64),
        attention_mask=mask2d,
    )
    out = theirs(feats, attention_mask=mask).last_hidden_state
    want = torch.cat([out[i, : audio_tokens(n)] for i, n in enumerate(lengths)])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"hidden": 15, "heads": 3}, "even"),
        ({"hidden": 16, "heads": 3}, "multiple of heads"),
        ({"n_window": 0, "window_frames": 3}, "window_frames >= 4"),
        ({"n_window": -1}, "n_window"),
        ({"mel": 0}, "mel"),
    ],
)
def test_settings_refused_with_their_reason(kw, message):
    with pytest.raises(ValueError, match=message):
        AudioConfig(**kw)


def test_limits_accepted_at_them():
    AudioConfig(n_window=0, window_frames=4)
    AudioConfig(n_window=1)
    AudioConfig(hidden=2, heads=1)


def test_bad_lengths_and_long_recordings_are_refused():
    enc = AudioEncoder(AudioConfig(mel=MEL, hidden=HIDDEN, n_window=0, window_frames=32))
    with pytest.raises(ValueError, match="frames given"):
        enc(torch.zeros(10, MEL), [4, 5])
    with pytest.raises(ValueError, match="longer than the padded window of 32"):
        enc(torch.zeros(33, MEL), [33])
    enc(torch.zeros(32, MEL), [32])  # exactly the window


def test_no_recording_keeps_every_parameter_in_the_graph():
    enc = AudioEncoder(AudioConfig(mel=MEL, hidden=HIDDEN, n_window=4))
    out = enc(torch.zeros(0, MEL), [])
    assert out.shape == (0, enc.cfg.out_dim)
    out.sum().backward()
    assert all(p.grad is not None for p in enc.parameters())
