"""Llama 4's language model is a causal LM (its own ``lm_head``): ``balance_model`` balances
the decoder inside it, and the head runs on each sample's own rank as without balancing.

Checked on the language model alone (the installed transformers' full Llama 4 step may fail
on its own, see ``test_hf_parity.skip_if_transformers_fails``): 2 gloo ranks with packed rows
of different lengths, the balanced call against the same model paused (each rank its own
row, as never balanced). Bug caught: the causal LM itself wrapped as if it were the decoder
(its logits routed as hidden states, or refused)."""

from __future__ import annotations

import pytest
import torch

from tests.dist_helper import run_ranks


def _rank(rank: int, world: int) -> dict:
    from tests.trainer_adapter.test_hf_parity import build_model
    from trainer_adapter.hf.balance import balance_model, paused

    torch.manual_seed(0)
    model = build_model("llama4").float().eval()
    lm = model.language_model
    balance_model(model, encoder=False, llm=True)
    wrapped = [type(m).__name__ for m in model.modules() if hasattr(m, "equishard_paused")]
    # rank 0: three samples (40 tokens), rank 1: one of 6: the plan moves samples
    lengths = [[12, 16, 12], [6]][rank]
    g = torch.Generator().manual_seed(1 + rank)
    embeds = torch.randn(1, sum(lengths), lm.config.hidden_size, generator=g)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        got = lm(inputs_embeds=embeds, position_ids=positions, use_cache=False)
        route = lm.model.last_route
        with paused(model):
            want = lm(inputs_embeds=embeds, position_ids=positions, use_cache=False)
    return {
        "wrapped": wrapped,
        "moved": route.moved,
        "diff": float((got.logits - want.logits).abs().max()),
        "shape": tuple(got.logits.shape),
        "want_shape": tuple(want.logits.shape),
    }


def test_llama4_causal_lm_balances_its_inner_decoder():
    pytest.importorskip("transformers")
    got = run_ranks(_rank, 2, timeout=300)
    for r in got:
        assert r["wrapped"] == ["Llama4TextModel"], r["wrapped"]
        assert r["shape"] == r["want_shape"]
        assert r["diff"] < 1e-5, r
    assert got[0]["moved"] > 0  # samples did change rank
