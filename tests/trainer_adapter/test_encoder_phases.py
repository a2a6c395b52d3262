"""Encoder phases beyond vision in the runtime core (:func:`trainer_adapter.redistribute` with
``phases=``): an audio encoder's recordings planned with their own cost, moved to their encoder
rank, and their outputs routed to the LLM rank of the sample that owns them, on real gloo
process groups; a rank without recordings, or without anything, still joins every exchange.
The plan is checked against an independent computation of each sample's audio cost (the
rule's chunks or window, priced by the cost model) planned by ``post_balance`` alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.dist_helper import run_ranks
from tests.trainer_adapter.synthetic import batch_of

AUDIO_TOKEN, MEL = 8, 3
# per rank: samples as (image units, text tokens, recordings' frames)
LAYOUT = [
    [(1, 20, (37,)), (0, 9, (250, 17)), (2, 5, ()), (0, 30, (401,))],
    [],  # an empty rank
    [(1, 12, ())],  # images only: no recording
    [(0, 40, (90,)), (0, 8, (3, 5, 1200)), (0, 15, ())],
]


def tokens_of(frames: int) -> int:
    return (((frames - 1) // 2 + 1) - 2) // 2 + 1


def audio_batch(rank: int, samples) -> dict:
    """A synthetic batch (vision as ``batch_of``) with recordings: each recording's feature
    rows carry (rank, sample, recording, frame) so arrivals can be told apart, and its audio
    tokens come before the sample's text (which they then condition)."""
    batch = batch_of(rank, [(k, text) for k, text, _ in samples])
    ids, cu = batch["input_ids"].tolist(), batch["cu_seqlens"].tolist()
    labels = batch["labels"].tolist()
    new_ids, new_labels, new_pos, new_cu, feats, lens, frames, count = (
        [],
        [],
        [],
        [0],
        [],
        [],
        [],
        [],
    )
    for i, (_, _, recs) in enumerate(samples):
        extra = sum(tokens_of(f) for f in recs)
        s = slice(cu[i], cu[i + 1])
        new_ids += [AUDIO_TOKEN] * extra + ids[s]
        new_labels += [-100] * extra + labels[s]
        new_pos += list(range(extra + cu[i + 1] - cu[i]))
        new_cu.append(len(new_ids))
        for j, f in enumerate(recs):
            tag = rank * 1000 + i * 10 + j
            rows = np.stack([np.full(f, tag, float), np.arange(f, dtype=float), np.zeros(f)], 1)
            feats.append(rows)
            lens.append(f)
        frames.append(sum(recs))
        count.append(len(recs))
    batch.update(
        input_ids=torch.tensor(new_ids, dtype=torch.long),
        labels=torch.tensor(new_labels, dtype=torch.long),
        position_ids=torch.tensor(new_pos, dtype=torch.long),
        cu_seqlens=torch.tensor(new_cu, dtype=torch.int32),
        llm_lens=torch.tensor(np.diff(new_cu), dtype=torch.long),
        audio_features=torch.from_numpy(np.concatenate(feats)).float()
        if feats
        else torch.zeros(0, MEL),
        audio_frames=torch.tensor(frames, dtype=torch.long),
        audio_lens=torch.tensor(lens, dtype=torch.long).reshape(-1, 1),
        num_audios=torch.tensor(count, dtype=torch.long),
        audio_token_id=AUDIO_TOKEN,
    )
    return batch


def _rank(rank, world, n_window, ranks_per_node):
    from trainer_adapter import RedistributePolicy, Topology, redistribute
    from trainer_adapter.encoder_phases import audio_phase

    phase = audio_phase(n_window=n_window, window_frames=3000)
    batch = audio_batch(rank, LAYOUT[rank])
    local, route = redistribute(
        batch, None, Topology(ranks_per_node=ranks_per_node), RedistributePolicy(), (phase,)
    )
    enc = local.encoders["audio"]
    # each recording's output tokens carry its (rank, sample, recording) tag; sent to the LLM
    tags, starts = [], np.concatenate([[0], np.cumsum(enc.units[:, 0].numpy())])
    for u in range(len(enc.units)):
        tags += [float(enc.payload[starts[u], 0])] * tokens_of(int(enc.units[u, 0]))
    emb = torch.tensor(tags, dtype=torch.float32).reshape(-1, 1).repeat(1, 2).requires_grad_()
    got = route.send_embeddings("audio", emb)
    (got * 2).sum().backward()
    cu = local.cu_seqlens.tolist()
    slots = [
        int((local.input_ids[cu[i] : cu[i + 1]] == AUDIO_TOKEN).sum()) for i in range(len(cu) - 1)
    ]
    return {
        "audio_index": enc.index.tolist(),
        "units": enc.units[:, 0].tolist(),
        "payload": enc.payload.tolist(),
        "llm_index": local.llm_index.tolist(),
        "slots": slots,
        "arrived": got.detach()[:, 0].tolist(),
        "grad_ok": bool(torch.equal(emb.grad, torch.full_like(emb, 2.0))),
        "dest": route.encoders["audio"][0].tolist(),
        "loads": {k: np.asarray(v).tolist() for k, v in route.loads.items()},
        "method": route.methods["audio"],
        "bytes": route.bytes.get("audio"),
    }


def _global_samples():
    return [(r, i, s) for r in range(len(LAYOUT)) for i, s in enumerate(LAYOUT[r])]


@pytest.mark.parametrize(("n_window", "ranks_per_node"), [(100, 1), (0, 1), (8, 2)])
def test_recordings_reach_their_encoder_rank_and_their_tokens_the_llm_rank(
    n_window, ranks_per_node
):
    got = run_ranks(_rank, 4, n_window, ranks_per_node, timeout=120)
    samples = _global_samples()
    dest = got[0]["dest"]
    assert all(g["dest"] == dest for g in got)  # the same plan on every rank
    for r, g in enumerate(got):
        mine = [k for k, d in enumerate(dest) if d == r]
        assert g["audio_index"] == mine
        # every recording of those samples, in order, with its own frames
        want_units = [f for k in mine for f in samples[k][2][2]]
        assert g["units"] == want_units
        want_rows = [
            [float(samples[k][0] * 1000 + samples[k][1] * 10 + j), float(t), 0.0]
            for k in mine
            for j, f in enumerate(samples[k][2][2])
            for t in range(f)
        ]
        assert g["payload"] == want_rows
        # the LLM rank's audio slots get the owning sample's recordings' tokens, in order
        want = [
            float(samples[k][0] * 1000 + samples[k][1] * 10 + j)
            for k in g["llm_index"]
            for j, f in enumerate(samples[k][2][2])
            for _ in range(tokens_of(f))
        ]
        assert g["arrived"] == want and sum(g["slots"]) == len(want)
        assert g["grad_ok"]
    # samples without recordings take no part in the phase
    assert [d < 0 for d in dest] == [not s[2][2] for s in samples]
    assert got[0]["loads"]["audio_after"] != got[0]["loads"]["audio_before"]


def test_the_plan_equals_post_balance_over_the_rules_costs():
    """Each sample's audio cost computed here from the rule (chunks of 2 x n_window frames
    or the padded window), priced by the default cost model's audio coefficients and planned
    by ``post_balance`` alone (identity placement): the route's loads are that plan's."""
    from balancing import CostModel, post_balance
    from dataprep.media_rules.whisper_audio import chunk_positions

    got = run_ranks(_rank, 4, 100, 1, timeout=120)
    audio = CostModel().audio
    costs = []
    for _, _, (_, _, recs) in _global_samples():
        if recs:
            seqs = [p for f in recs for p in chunk_positions(f, 100)]
            costs.append(audio.of(sum(seqs), sum(x * x for x in seqs), len(seqs)))
    pb = post_balance(np.array(costs), 4, method="auto")
    assert sorted(got[0]["loads"]["audio_after"]) == pytest.approx(sorted(pb.loads), rel=1e-12)
    src = [r for r, _, (_, _, recs) in _global_samples() if recs]
    before = np.bincount(src, weights=costs, minlength=4)
    np.testing.assert_allclose(got[0]["loads"]["audio_before"], before, rtol=1e-12)


def test_padded_windows_cost_the_same_whatever_their_length():
    """Qwen2-Audio's padded encoder: a 3-frame and a 1,200-frame recording each cost the
    whole window, so the loads count windows."""
    got = run_ranks(_rank, 4, 0, 1, timeout=120)
    loads = np.array(got[0]["loads"]["audio_before"])
    windows = np.bincount(
        [r for r, _, (_, _, recs) in _global_samples() for _ in recs], minlength=4
    )
    np.testing.assert_allclose(loads / loads.max(), windows / windows.max(), rtol=1e-12)


def _missing_keys(rank, world):
    from trainer_adapter import RedistributePolicy, Topology, redistribute
    from trainer_adapter.encoder_phases import audio_phase

    batch = batch_of(0, [(1, 5)])
    try:
        redistribute(batch, None, Topology(), RedistributePolicy(), (audio_phase(n_window=100),))
    except KeyError as e:
        return str(e)
    return None


def test_a_batch_without_the_phases_keys_is_refused_naming_them():
    got = run_ranks(_missing_keys, 1, timeout=60)[0]
    assert got is not None and "no 'audio_frames', which the audio phase reads" in got


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"n_window": 0, "window_frames": 3}, "window_frames"),
        ({"n_window": -1}, "n_window"),
    ],
)
def test_phase_settings_refused(kw, message):
    from trainer_adapter.encoder_phases import audio_phase

    with pytest.raises(ValueError, match=message):
        audio_phase(**kw)
    audio_phase(n_window=0, window_frames=4)  # at the limit
    audio_phase(n_window=1)


def test_each_kind_runs_the_sequences_prep_measures():
    """Per unit, the sequences each kind's encoder runs, against prep's own rules for the
    same recording (the cost table's ``audio_seq_lens``) and the ViT's patch grid."""
    from dataprep.audio_header import AudioHeader
    from dataprep.media_rules.registry import parse_audio_rule
    from trainer_adapter.encoder_phases import VISION, audio_phase

    assert VISION.sequences(np.array([[2, 3], [4, 4]])) == [(6,), (16,)]
    for spec, phase in (
        ("qwen2audio", audio_phase(n_window=0, window_frames=3000)),
        ("qwen2_5_omni", audio_phase(n_window=100)),
    ):
        rule = parse_audio_rule(spec)
        for seconds in (0.5, 2.0, 4.0, 29.9):
            header = AudioHeader(
                nbytes=1, sample_rate=16000, frames=round(seconds * 16000), channels=1,
                format="FLAC",
            )  # fmt: skip
            frames = rule.frames(header)
            assert phase.sequences(np.array([[frames]])) == [rule.cost(header).seq_lens]


def test_features_sum_each_samples_units():
    """(tokens, squared lengths, sequences) per sample, its units' in order; a sample with no
    unit has none."""
    from trainer_adapter.encoder_phases import audio_phase

    phase = audio_phase(n_window=8)
    tok, sq, n = phase.features(np.array([[20], [3], [16]]), np.array([2, 0, 1]))
    # 20 frames: chunks of 16 and 4 -> 8 and 2 positions; 3 frames: 2; 16 frames: 8
    np.testing.assert_array_equal(tok, [12, 0, 8])
    np.testing.assert_array_equal(sq, [64 + 4 + 4, 0, 64])
    np.testing.assert_array_equal(n, [3, 0, 1])


def test_a_phase_is_an_immutable_hashable_value():
    import dataclasses

    from trainer_adapter.encoder_phases import VISION, audio_phase

    assert hash(audio_phase(n_window=8)) == hash(audio_phase(n_window=8))
    with pytest.raises(dataclasses.FrozenInstanceError):
        VISION.width = 3  # type: ignore[misc]
    assert not hasattr(VISION, "__dict__")  # slots: no attribute can be added either


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"kind": "frames"}, "kind must be one of"),
        ({"cost": "video"}, "cost must be 'vision' or 'audio'"),
        ({"width": 0}, "width"),
        ({"width": 5}, "width"),
    ],
)
def test_an_encoder_phase_refuses_what_it_cannot_run(kw, message):
    import dataclasses

    from trainer_adapter.encoder_phases import VISION

    with pytest.raises(ValueError, match=message):
        dataclasses.replace(VISION, **kw)
    dataclasses.replace(VISION, width=4)  # the widest unit row a phase takes
    dataclasses.replace(VISION, width=1)


def test_a_kind_read_from_a_config_is_taken_by_value():
    """A kind built at run time (read from a file: an equal string, not the same object)
    selects the same sequences as the literal does."""
    import dataclasses

    from trainer_adapter.encoder_phases import audio_phase

    read = "".join(["chu", "nks"])  # equal to "chunks", a string object of its own
    phase = dataclasses.replace(audio_phase(n_window=8), kind=read)
    assert phase.sequences(np.array([[20]])) == [(8, 2)]
    padded = dataclasses.replace(
        audio_phase(n_window=0, window_frames=32), kind="".join(["win", "dow"])
    )
    assert padded.sequences(np.array([[3]])) == [(16,)]
    grid = dataclasses.replace(padded, kind="".join(["gr", "id"]), width=2)
    assert grid.sequences(np.array([[3, 4]])) == [(12,)]


def test_chunks_read_each_units_frames_from_its_first_column():
    """A unit row may carry more than its frames (a phase of width 2): the frames are the
    first column, whatever follows."""
    import dataclasses

    from trainer_adapter.encoder_phases import audio_phase

    wide = dataclasses.replace(audio_phase(n_window=8), width=2)
    assert wide.sequences(np.array([[20, 99], [3, 1]])) == [(8, 2), (2,)]
    vision = dataclasses.replace(audio_phase(n_window=8), kind="grid", width=3)
    assert vision.sequences(np.array([[2, 5, 7]])) == [(10,)]  # h x w, the third column aside


def test_the_default_audio_phase_is_whispers_padded_window():
    """``audio_phase()``: Qwen2-Audio's and Whisper's 30-second window, 1,500 positions a
    recording, however short."""
    from trainer_adapter.encoder_phases import audio_phase

    phase = audio_phase()
    assert (phase.kind, phase.n_window, phase.window_frames) == ("window", 0, 3000)
    assert phase.sequences(np.array([[1], [3000]])) == [(1500,), (1500,)]


def test_a_phase_is_built_by_keyword_only():
    from trainer_adapter.encoder_phases import EncoderPhase

    with pytest.raises(TypeError):
        EncoderPhase("audio", "audio", "f", "r", "u", "c", "t", 1)  # type: ignore[misc]


def test_grid_features_are_each_units_patches():
    """The vision phase's terms per sample, against a sum written out: h x w tokens a unit,
    (h x w)^2 its square, one sequence a unit."""
    from trainer_adapter.encoder_phases import VISION

    units = np.array([[2, 3], [4, 4], [1, 7], [5, 2]])
    count = np.array([1, 0, 3])
    tok, sq, n = VISION.features(units, count)
    np.testing.assert_array_equal(tok, [6, 0, 16 + 7 + 10])
    np.testing.assert_array_equal(sq, [36, 0, 256 + 49 + 100])
    np.testing.assert_array_equal(n, [1, 0, 3])


@pytest.mark.parametrize("window", [4, 5, 32, 33, 3000, 3001])
def test_a_window_runs_the_positions_of_the_stems_stride_two_convolution(window):
    """Whole-window positions, odd windows too, against torch's own convolution of that
    stride, kernel and padding (Whisper's second convolution)."""
    from trainer_adapter.encoder_phases import audio_phase

    conv = torch.nn.Conv1d(1, 1, kernel_size=3, stride=2, padding=1)
    positions = conv(torch.zeros(1, 1, window)).shape[-1]
    phase = audio_phase(n_window=0, window_frames=window)
    assert phase.sequences(np.array([[1]])) == [(positions,)]


def test_a_chunks_kind_read_from_a_config_still_needs_its_chunk_size():
    import dataclasses

    from trainer_adapter.encoder_phases import audio_phase

    with pytest.raises(ValueError, match="n_window"):
        dataclasses.replace(audio_phase(n_window=8), kind="".join(["chu", "nks"]), n_window=0)
    with pytest.raises(ValueError, match="window_frames"):
        dataclasses.replace(audio_phase(), kind="".join(["win", "dow"]), window_frames=3)
