"""The reference trainer with an audio encoder beside the vision one (#67): every DP x PP
layout, with runtime balancing of every phase on and off, computes the loss and the gradient
of a plain single-process forward/backward over the global batch.

The batches are synthetic collated batches (images of 2 x 2-patch units, recordings of
feature frames with their audio tokens: ``tests.trainer_adapter.test_encoder_phases``), uneven
over the ranks, one rank without recordings, one empty. The reference is computed here with
no process group: the same initial parameters (same seed), the modules called in order (the
ViT and projector, the audio encoder, the LLM over each packed sample), next-token targets
inside each sample and a summed cross entropy over the global number of targets. The audio
encoder's gradients must not be zero, and with balancing on, recordings must move."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.dist_helper import run_ranks
from tests.trainer_adapter.test_encoder_phases import LAYOUT, audio_batch

SEED = 7


def _model_cfg():
    from trainer_adapter import VLMConfig
    from trainer_adapter.train.audio_encoder import AudioConfig

    audio = AudioConfig(mel=3, hidden=8, layers=1, heads=2, out_dim=16, n_window=8)
    return VLMConfig(
        vocab_size=200, patch_dim=12, merge=2, vit_hidden=8, vit_layers=1, vit_heads=2,
        llm_hidden=16, llm_layers=2, llm_heads=2, audio=audio,
    )  # fmt: skip


def _concat(batches: list[dict]) -> dict:
    """The ranks' batches as one (the single process's global batch)."""
    out = {}
    for k in ("input_ids", "labels", "position_ids", "patches", "audio_features"):
        out[k] = torch.cat([b[k] for b in batches])
    for k in ("vit_lens", "num_units", "audio_frames", "num_audios", "llm_lens"):
        out[k] = torch.cat([b[k] for b in batches])
    out["units_hw"] = torch.cat([b["units_hw"] for b in batches])
    out["audio_lens"] = torch.cat([b["audio_lens"] for b in batches])
    return out


def reference() -> tuple[float, dict]:
    from trainer_adapter.train.model import VisionLanguageModel

    torch.manual_seed(SEED)
    model = VisionLanguageModel(_model_cfg())
    b = _concat([audio_batch(r, LAYOUT[r]) for r in range(len(LAYOUT))])
    img = model.encode_images(b["patches"], b["units_hw"])
    aud = model.audio(b["audio_features"], b["audio_lens"][:, 0].tolist())
    ids = b["input_ids"]
    x = model.llm.tok(ids)
    x = x.masked_scatter((ids == 7)[:, None], img)
    x = x.masked_scatter((ids == 8)[:, None], aud)
    x = x + model.llm.pos(b["position_ids"])
    lens = b["llm_lens"].tolist()
    h = model.llm.forward_blocks(x, lens)
    logits = model.llm.logits(h)
    loss, n = torch.zeros(()), 0
    start = 0
    for length in lens:  # next-token targets inside each sample
        lab = b["labels"][start + 1 : start + length]
        lg = logits[start : start + length - 1]
        loss = loss + F.cross_entropy(lg, lab, ignore_index=-100, reduction="sum")
        n += int((lab != -100).sum())
        start += length
    loss = loss / n
    loss.backward()
    return float(loss), {k: p.grad.clone().numpy() for k, p in model.named_parameters()}


LAYOUTS = [(1, 1, True), (2, 1, True), (4, 1, True), (4, 1, False), (2, 2, True)]
SPLIT = {1: [[0, 1, 2, 3]], 2: [[0, 1], [2, 3]], 4: [[0], [1], [2], [3]]}


def _distributed(rank, world, layouts):
    from trainer_adapter import TrainConfig, Trainer
    from trainer_adapter.train.trainer import empty_batch

    results = []
    for dp, pp, redistribute in layouts:
        cfg = TrainConfig(
            shards="unused", dp=dp, pp=pp, steps=1, schedule="1f1b", microbatches=2 * pp,
            redistribute=redistribute, method="lpt", seed=SEED, partition_top_k=1,
        )  # fmt: skip
        trainer = Trainer(cfg, _model_cfg(), mb_tokens=512, ranks_per_node=1)
        if trainer.stage == 0:
            parts = [audio_batch(r, LAYOUT[r]) for r in SPLIT[dp][trainer.replica]]
            batch = {**_concat(parts), **_cu(parts), "image_token_id": 7, "audio_token_id": 8}
        else:
            batch = {**empty_batch(12, 7, torch.float32), **_no_audio()}
        out = trainer.forward_backward(batch)
        timed = trainer.timer.collect()["phases"].get("audio", {"items": [], "padded": False})
        names = {id(p): n for n, p in trainer.model.named_parameters()}
        grads = {names[id(p)]: p.grad.detach().clone().numpy() for p in trainer.params}
        moved = out["route"]["bytes"].get("audio", {"intra_node": 0, "inter_node": 0})
        results.append(
            {
                "loss": out["loss"],
                "grads": grads,
                "audio_moved": moved["intra_node"] + moved["inter_node"],
                "timed": timed,
            }
        )
    return results


def _cu(parts) -> dict:
    lens = torch.cat([p["llm_lens"] for p in parts])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lens, 0)]).to(torch.int32)
    return {"cu_seqlens": cu, "sample_ids": [s for p in parts for s in p["sample_ids"]]}


def _no_audio() -> dict:
    z = torch.zeros(0, dtype=torch.long)
    return {
        "audio_features": torch.zeros(0, 3),
        "audio_frames": z,
        "audio_lens": torch.zeros(0, 1, dtype=torch.long),
        "num_audios": z,
        "audio_token_id": 8,
    }


@pytest.fixture(scope="module")
def runs():
    return {
        w: run_ranks(_distributed, w, [x for x in LAYOUTS if x[0] * x[1] == w], timeout=300)
        for w in (1, 2, 4)
    }


@pytest.mark.parametrize(
    "layout", LAYOUTS, ids=lambda x: f"dp{x[0]}pp{x[1]}{'' if x[2] else '-off'}"
)
def test_every_layout_equals_one_process(runs, layout):
    ref_loss, ref = reference()
    world = layout[0] * layout[1]
    k = [x for x in LAYOUTS if x[0] * x[1] == world].index(layout)
    encoders = {n for n in ref if n.startswith(("audio.", "vision.", "projector."))}
    for rank_results in runs[world]:
        r = rank_results[k]
        # every rank holds (and reduces) the encoders; without pipeline stages, everything
        assert encoders <= set(r["grads"])
        assert layout[1] > 1 or set(r["grads"]) == set(ref)
        assert r["loss"] == pytest.approx(ref_loss, rel=1e-5)
        for name, g in r["grads"].items():
            np.testing.assert_allclose(g, ref[name], rtol=2e-5, atol=2e-5 * np.abs(ref[name]).max())
    audio = [n for n in ref if n.startswith("audio.")]
    assert audio and all(np.abs(ref[n]).sum() > 0 for n in audio if "conv1.weight" in n)
    if layout[2] and layout[0] > 1:
        assert runs[world][0][k]["audio_moved"] > 0


def test_the_audio_phase_is_timed_with_the_sequences_its_cost_prices(runs):
    """The audio phase's timed items (what ``equishard calibrate`` fits) are the chunks the
    encoder ran, the runtime cost's terms: over the ranks of a layout, every recording's
    chunks once; not its frames."""
    from dataprep.media_rules.whisper_audio import chunk_positions

    want = sorted(
        p for rank in LAYOUT for _, _, recs in rank for f in recs for p in chunk_positions(f, 8)
    )
    for world in (1, 2, 4):
        k = next(i for i, x in enumerate(x for x in LAYOUTS if x[0] * x[1] == world) if x[1] == 1)
        got = sorted(n for rank_results in runs[world] for n in rank_results[k]["timed"]["items"])
        assert got == want
        assert not any(r[k]["timed"]["padded"] for r in runs[world])
