"""The balanced audio tower (:mod:`trainer_adapter.hf.audio`) against transformers' own code:
its chunks and output tokens are the tower's, its cost is the one prep plans with, the
model's tower order is read from the model's forward, and what it cannot move is refused on
every rank at the same point."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.dist_helper import run_ranks

transformers = pytest.importorskip("transformers")
omni = pytest.importorskip("transformers.models.qwen2_5_omni.modeling_qwen2_5_omni")

from tests.trainer_adapter.test_hf_audio_parity import build  # noqa: E402


@pytest.mark.parametrize("n_window", [1, 8, 50, 100])
def test_chunks_are_the_towers_own(n_window):
    """The attention sequences of a recording: what Qwen2.5-Omni's tower builds (its chunking
    and its stem's cu_seqlens) for every length from 1 frame to past several chunks, the
    exact multiples of a chunk and one frame either side of them included."""
    from dataprep.media_rules.whisper_audio import chunk_positions

    size = 2 * n_window
    lengths = sorted(
        {*range(1, 3 * size + 2), *(k * size + d for k in (1, 2, 5) for d in (-1, 0, 1))}
    )
    lengths = [f for f in lengths if f >= 1]
    feats = torch.zeros(1, sum(lengths))
    lens = torch.tensor(lengths)
    _, chunk_lengths = omni.chunk_and_pad_features(feats, lens, n_window)
    cu = omni.get_audio_cu_seqlens(chunk_lengths).numpy()
    theirs = np.diff(cu).tolist()
    ours = [p for f in lengths for p in chunk_positions(f, n_window)]
    assert ours == theirs


def test_output_tokens_are_the_processors():
    """A recording's LLM tokens, as prep counts them, are the tower's output rows."""
    from dataprep.media_rules.whisper_audio import audio_tokens

    model = build("qwen25omni")
    tower = model.model.audio_tower
    for frames in (1, 2, 3, 4, 5, 15, 16, 17, 37, 70):
        x = torch.randn(16, frames, dtype=torch.float64)
        out = tower(x, torch.tensor([frames]), None).last_hidden_state
        assert out.shape[0] == audio_tokens(frames), frames


def test_the_omni_thinker_runs_its_audio_tower_first():
    from trainer_adapter.hf.balance import _calls_audio_first

    assert _calls_audio_first(build("qwen25omni").model) is True


def test_tower_order_read_from_the_forward():
    from trainer_adapter.hf.balance import _calls_audio_first

    class VisionFirst(torch.nn.Module):
        def forward(self, x):
            a = self.get_image_features(x)
            return a + self.get_audio_features(x)

    class Neither(torch.nn.Module):
        def forward(self, x):
            return self.audio_tower(x)

    assert _calls_audio_first(VisionFirst()) is False
    with pytest.raises(ValueError, match="order of its towers is unknown"):
        _calls_audio_first(Neither())


def test_an_unknown_audio_tower_is_refused():
    from trainer_adapter.hf.audio import balance_audio

    class Tower(torch.nn.Module):
        def forward(self, input_values):
            return input_values

    with pytest.raises(ValueError, match="not a Whisper-style audio tower"):
        balance_audio(Tower())


def test_a_packed_tower_without_its_chunk_size_is_refused():
    from trainer_adapter.hf.audio import balance_audio

    tower = build("qwen25omni").model.audio_tower
    tower.config.n_window = 0
    with pytest.raises(ValueError, match="no n_window"):
        balance_audio(tower)


def _refusal(rank, world, case):
    from trainer_adapter.group_errors import StepRefused
    from trainer_adapter.hf.audio import balance_audio

    tower = build("qwen25omni").model.audio_tower
    balance_audio(tower)
    frames = [5, 9] if rank == 0 else [7]
    x = torch.randn(16, sum(frames), dtype=torch.float64)
    lens = torch.tensor(frames)
    kw = {}
    if rank == 1 and case == "lengths":
        lens = torch.tensor([8])  # one frame more than the features hold
    if rank == 1 and case == "per_layer":
        kw = {"output_hidden_states": True}
    if rank == 1 and case == "empty_recording":
        lens, x = torch.tensor([0, 7]), x
    try:
        tower(x, lens, None, **kw)
    except StepRefused as e:
        return str(e)
    return None


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("lengths", "feature_lens make 8 frames"),
        ("per_layer", "output_hidden_states"),
        ("empty_recording", "recording 0 has 0 frames"),
    ],
)
def test_what_a_rank_cannot_move_is_refused_on_every_rank(case, message):
    """One rank's bad input: both ranks raise StepRefused naming it, nobody hangs."""
    got = run_ranks(_refusal, 2, case, timeout=120)
    assert all(g is not None and message in g for g in got), got


def _costs(rank, world):
    from trainer_adapter.hf.audio import balance_audio
    from trainer_adapter.phase_timer import PhaseTimer

    tower = build("qwen25omni").model.audio_tower
    balance_audio(tower)
    tower.equishard_timer = PhaseTimer()
    frames = [[37, 50], [70, 16]][rank]
    x = torch.randn(16, sum(frames), dtype=torch.float64)
    tower(x, torch.tensor(frames), None)
    route = tower.last_route
    timed = tower.equishard_timer.collect()["phases"]["audio"]
    received = route.table[route.received, 0].tolist()
    return route.loads_before.tolist(), route.table[:, :3].tolist(), timed, received


def test_the_runtime_cost_is_the_one_prep_plans_with():
    """Each rank's load before balancing is the sum of its recordings' audio-phase cost as
    the cost model prices prep's measured sequences (the tower's own dimensions)."""
    from balancing import CostModel
    from dataprep.media_rules.whisper_audio import audio_tokens, chunk_positions

    got = run_ranks(_costs, 2, timeout=120)
    cfg = build("qwen25omni").model.audio_tower.config
    phase = CostModel.from_dims(
        vit_hidden=1,
        vit_layers=1,
        llm_hidden=1,
        llm_layers=1,
        audio_hidden=cfg.d_model,
        audio_layers=cfg.encoder_layers,
    ).audio

    def cost(f):
        c = chunk_positions(f, cfg.n_window)
        return phase.alpha * sum(c) + phase.beta * sum(x * x for x in c) + phase.gamma * len(c)

    want = [cost(37) + cost(50), cost(70) + cost(16)]
    for loads, table, timed, received in got:
        np.testing.assert_allclose(loads, want, rtol=1e-12)
        # timed with the chunks it ran, the cost's terms (equishard calibrate fits them)
        assert timed["items"] == [p for f in received for p in chunk_positions(f, cfg.n_window)]
        assert timed["padded"] is False
        rows = [
            [f, audio_tokens(f), sum(chunk_positions(f, cfg.n_window))] for f in (37, 50, 70, 16)
        ]
        assert table == rows


def test_qwen3_omni_windows_are_refused_not_guessed():
    """Qwen3-Omni's tower runs attention windows of ``n_window_infer`` frames across its
    chunks: neither its cost nor its call is Qwen2.5-Omni's, so it is refused at wrap time."""
    from trainer_adapter.hf.audio import balance_audio

    q3 = pytest.importorskip("transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe")
    cfg = transformers.models.qwen3_omni_moe.Qwen3OmniMoeAudioEncoderConfig(
        d_model=16,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=32,
        output_dim=32,
        num_mel_bins=16,
        max_source_positions=64,
        n_window=8,
        n_window_infer=32,
        downsample_hidden_size=8,
    )
    with pytest.raises(ValueError, match="n_window_infer"):
        balance_audio(q3.Qwen3OmniMoeAudioEncoder(cfg))


def test_an_unknown_audio_tower_beside_a_vision_tower_runs_unbalanced_with_a_warning():
    """balance_model balances the vision tower and the LLM and says why the audio tower stays
    on its rank; with no vision tower, nothing is left to balance: refused."""
    from trainer_adapter.hf.balance import balance_model

    class Tower(torch.nn.Module):
        def forward(self, input_values):
            return input_values

    model = build("qwen25omni")
    model.model.audio_tower = Tower()
    with pytest.warns(UserWarning, match="not a Whisper-style audio tower.*runs unbalanced"):
        balance_model(model)
    assert not hasattr(model.model.audio_tower, "equishard_settled")
    assert hasattr(model.model.visual, "equishard_settled")

    audio_only = build("qwen2audio")
    audio_only.model.audio_tower = Tower()
    with pytest.raises(ValueError, match="not a Whisper-style audio tower"):
        balance_model(audio_only)
