"""Generation and one-rank evaluation on a balanced model: ``paused(model)`` runs each rank's
own inputs with no exchange, so ranks may call the model differently (``generate`` with a KV
cache, a different number of calls per rank). Without it, a decoder given a KV cache refuses
with an error that names the way out, on every rank (no rank left in a collective).
Anchor: the same weights, never balanced, generating from the same prompts."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from tests.dist_helper import run_ranks
from tests.trainer_adapter.test_hf_parity import build_model, make_batches

pytest.importorskip("transformers")

# rank 0: a prompt with an image; rank 1: text only (two prompts, so two generate calls)
PROMPTS = [[[(5, (1, 8, 8), 3)]], [[(6, None, 2)], [(3, None, 4)]]]


def _prompts(model, rank):
    batches = make_batches("qwen2vl", model, PROMPTS[rank])
    keys = ("input_ids", "pixel_values", "image_grid_thw")
    return [{k: b[k] for k in keys if b.get(k) is not None} for b in batches]


def rank_main(rank, world):
    from trainer_adapter.hf.balance import balance_model, paused
    from trainer_adapter.redistribute import RedistributePolicy

    model = build_model("qwen2vl").eval()
    plain = copy.deepcopy(model)
    balance_model(model, policy=RedistributePolicy(placement="identity"))
    out = {}
    text_only = {"input_ids": _prompts(model, 1)[0]["input_ids"]}
    try:  # every rank text-only: no tower call, each decoder refuses at once
        model.generate(**text_only, max_new_tokens=2, do_sample=False)
        out["refused"] = None
    except ValueError as exc:
        out["refused"] = str(exc)
    got, want = [], []
    with torch.no_grad(), paused(model):
        for prompt in _prompts(model, rank):
            kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
            got.append(model.generate(**prompt, **kw).tolist())
            want.append(plain.generate(**prompt, **kw).tolist())
    out["generated"], out["reference"] = got, want
    # balancing is back after the block: a packed training step moves samples again
    batch = make_batches("qwen2vl", model, None)[rank]
    model.train()(**batch, use_cache=False)
    out["moved_after"] = model.model.language_model.last_route.moved
    return out


@functools.cache
def results() -> list:
    return run_ranks(rank_main, 2, timeout=300)


def test_generate_inside_paused_equals_the_unbalanced_model():
    for rank, r in enumerate(results()):
        assert r["generated"] == r["reference"], rank
        assert len(r["generated"]) == len(PROMPTS[rank])  # ranks called generate 1 and 2 times
        assert all(len(seq[0]) > 4 for seq in r["generated"])


def test_generate_without_paused_is_refused_by_name():
    for r in results():
        assert r["refused"] is not None and "paused(model)" in r["refused"]


def test_balancing_is_back_after_the_block():
    assert all(r["moved_after"] > 0 for r in results())
