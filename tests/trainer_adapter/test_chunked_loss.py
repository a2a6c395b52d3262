"""The trainer's chunked LM loss (``chunked_lm_loss``) against the full-logits loss.

Reference: the head and norm applied to every position at once, ``log_softmax`` in float64, the
target positions picked by mask (an independent formula, not the chunked code path); gradients
of the hidden states, the head and the norm from autograd through that reference.

Planted bugs this catches: a chunk boundary dropping or repeating a position (off-by-one slices),
targets paired with the wrong rows (positions taken before the shift, or unsorted), ignored
positions counted, the logits not upcast to fp32, the normalizer left out, and the full logits
kept for the backward (the memory this module exists to save)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainer_adapter.train.loss import ChunkedLMLoss, chunk_tokens_for, chunked_lm_loss
from trainer_adapter.train.pipeline import LMLoss


def _setup(seed: int, tokens: int = 97, width: int = 16, vocab: int = 300):
    g = torch.Generator().manual_seed(seed)
    norm, head = nn.LayerNorm(width), nn.Linear(width, vocab)
    with torch.no_grad():
        for p in (*norm.parameters(), *head.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if p is norm.weight else 0.0))
    hidden = torch.randn(tokens, width, generator=g, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,), generator=g)
    target[torch.rand(tokens, generator=g) < 0.35] = -100  # image tokens, prompts, padding
    return norm, head, hidden, target


def _grads(loss, mods, hidden):
    params = [hidden, *(p for m in mods for p in m.parameters())]
    return torch.autograd.grad(loss, params)


def _reference(norm, head, hidden, target, normalizer):
    logits = head(norm(hidden)).double()
    keep = target != -100
    logp = torch.log_softmax(logits[keep], dim=-1)
    return -logp.gather(1, target[keep][:, None]).sum() / normalizer


@pytest.mark.parametrize("chunk", [1, 7, 32, 61, 1000])
@pytest.mark.parametrize("seed", range(3))
def test_loss_and_gradients_equal_the_full_logits_reference(chunk, seed):
    norm, head, hidden, target = _setup(seed)
    normalizer = 1.3 * float((target != -100).sum())
    project = lambda h: head(norm(h))  # noqa: E731
    got = chunked_lm_loss(hidden, target, project, normalizer=normalizer, chunk_tokens=chunk)
    ref = _reference(norm, head, hidden, target, normalizer)
    assert got.dtype == torch.float32
    assert float(got) == pytest.approx(float(ref), rel=1e-5)
    for g, r in zip(
        _grads(got, (norm, head), hidden), _grads(ref, (norm, head), hidden), strict=True
    ):
        torch.testing.assert_close(g, r.to(g.dtype), rtol=1e-4, atol=1e-6)


def test_the_pipeline_loss_takes_a_row_of_hidden_states():
    """``ChunkedLMLoss`` gets the last stage's ``[1, tokens, width]`` row (tokens != width) and
    its ``[1, tokens]`` targets: the same loss and gradients as the full-logits reference of the
    flattened row over the normalizer set before the step (a row flattened on the wrong axis
    pairs targets with the wrong positions or fails)."""
    norm, head, hidden, target = _setup(4, tokens=53, width=16)
    project = lambda h: head(norm(h))  # noqa: E731
    loss = ChunkedLMLoss(project, chunk_tokens=10)
    unset = loss(hidden[None], target[None])  # before a step sets it: the plain sum
    assert float(unset) == pytest.approx(float(_reference(norm, head, hidden, target, 1.0)))
    loss.normalizer = 7.5
    got = loss(hidden[None], target[None])
    ref = _reference(norm, head, hidden, target, 7.5)
    assert float(got) == pytest.approx(float(ref), rel=1e-5)
    for g, r in zip(
        _grads(got, (norm, head), hidden), _grads(ref, (norm, head), hidden), strict=True
    ):
        torch.testing.assert_close(g, r.to(g.dtype), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 13, 1000])
def test_without_grad_the_loss_is_the_same(chunk):
    """Evaluation (``torch.no_grad``): the chunks are summed without checkpoints, to the same
    value as the reference."""
    norm, head, hidden, target = _setup(5)
    with torch.no_grad():
        got = chunked_lm_loss(
            hidden, target, lambda h: head(norm(h)), normalizer=3.0, chunk_tokens=chunk
        )
        ref = _reference(norm, head, hidden, target, 3.0)
    assert not got.requires_grad
    assert float(got) == pytest.approx(float(ref), rel=1e-5)


def test_targets_must_be_one_per_hidden_state_given_by_keyword():
    norm, head, hidden, target = _setup(6, tokens=20)
    project = lambda h: head(norm(h))  # noqa: E731
    with pytest.raises(ValueError, match="1 targets for 20 hidden states"):
        chunked_lm_loss(hidden, target[None], project, normalizer=1.0, chunk_tokens=8)
    with pytest.raises(ValueError, match="19 targets for 20 hidden states"):
        chunked_lm_loss(hidden, target[1:], project, normalizer=1.0, chunk_tokens=8)
    with pytest.raises(ValueError, match="21 targets for 20 hidden states"):
        chunked_lm_loss(hidden, target[[*range(20), 0]], project, normalizer=1.0, chunk_tokens=8)
    with pytest.raises(TypeError):
        chunked_lm_loss(hidden, target, project, 1.0, 8)  # type: ignore[misc]


def test_no_target_and_hidden_states_that_sum_to_zero_give_zero_not_nan():
    norm, head, _, target = _setup(0)
    target[:] = -100
    hidden = torch.zeros(target.shape[0], 16, requires_grad=True)
    got = chunked_lm_loss(hidden, target, lambda h: head(norm(h)), normalizer=1.0, chunk_tokens=8)
    assert float(got) == 0.0
    got.backward()
    assert float(hidden.grad.abs().sum()) == 0.0


def test_no_target_gives_zero_with_a_graph():
    norm, head, hidden, target = _setup(0)
    target[:] = -100
    got = chunked_lm_loss(hidden, target, lambda h: head(norm(h)), normalizer=1.0, chunk_tokens=8)
    assert float(got) == 0.0 and got.requires_grad
    got.backward()
    assert hidden.grad is not None and float(hidden.grad.abs().sum()) == 0.0


def test_bf16_autocast_matches_the_full_logits_loss_of_the_same_products():
    """Under bf16 autocast the head's products are bf16 in both; the loss is fp32 in both
    (a chunked loss on bf16 logits without the upcast is off by ~1e-3 relative)."""
    norm, head, hidden, target = _setup(5, tokens=200, vocab=2000)
    n = float((target != -100).sum())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = chunked_lm_loss(
            hidden, target, lambda h: head(norm(h)), normalizer=n, chunk_tokens=50
        )
        full = LMLoss(n)(head(norm(hidden)), target)
    assert float(got) == pytest.approx(float(full), rel=2e-5)


def test_bf16_logits_outside_autocast_are_upcast_before_the_loss():
    """A model held in bf16 (no autocast, so cross entropy is not upcast for it): the loss of its
    bf16 logits equals a float64 reference of those same logits (a bf16 loss is off by ~1e-3)."""
    norm, head, hidden, target = _setup(2, tokens=300, vocab=2000)
    norm, head = norm.bfloat16(), head.bfloat16()
    n = float((target != -100).sum())
    got = chunked_lm_loss(
        hidden.bfloat16(), target, lambda h: head(norm(h)), normalizer=n, chunk_tokens=64
    )
    with torch.no_grad():
        logits = head(norm(hidden.bfloat16())).double()
    keep = target != -100
    ref = -torch.log_softmax(logits[keep], -1).gather(1, target[keep][:, None]).sum() / n
    assert got.dtype == torch.float32
    assert float(got) == pytest.approx(float(ref), rel=1e-5)


def test_the_full_logits_are_never_saved_for_the_backward():
    """Every tensor autograd keeps for the backward is smaller than one chunk's logits (the
    full-logits loss keeps a tokens x vocabulary tensor), and the head never runs over more than
    one chunk's rows, in the forward or in the backward's recomputation (a single chunk of every
    target row, under checkpointing, keeps nothing in the forward but makes the full logits in
    the backward)."""
    norm, head, hidden, target = _setup(1, tokens=400, vocab=3000)
    chunk = 64
    largest = []

    def pack(t):
        largest.append(t.numel())
        return t

    rows = []  # the rows the head runs over, call by call (forward, then backward's recompute)

    def project(h):
        rows.append(h.shape[0])
        return head(norm(h))

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = chunked_lm_loss(hidden, target, project, normalizer=1.0, chunk_tokens=chunk)
    assert max(largest) < chunk * 3000
    n_forward = len(rows)
    loss.backward()  # the chunks' logits are recomputed here, one at a time
    n_target = int((target != -100).sum())
    assert n_forward == len(rows) - n_forward == -(-n_target // chunk), rows
    assert max(rows) <= chunk and sum(rows) == 2 * n_target, rows
    largest.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        LMLoss(1.0)(head(norm(hidden)), target)
    assert max(largest) >= int((target != -100).sum()) * 3000  # what the reference keeps


def test_chunk_size_follows_the_vocabulary_and_bad_arguments_are_refused():
    assert chunk_tokens_for(151_646) == (1 << 28) // (4 * 151_646) == 442
    assert chunk_tokens_for(10**9) == 64
    # one token of vocabulary (and none, floored to one): the whole budget; the 64 floor at,
    # above and below the vocabulary where it starts to hold (2**28 / (4 * 64) tokens)
    assert chunk_tokens_for(1) == chunk_tokens_for(0) == (1 << 28) // 4
    edge = (1 << 28) // (4 * 64)
    assert chunk_tokens_for(edge) == 64 == (1 << 28) // (4 * edge)
    assert chunk_tokens_for(edge + 1) == 64 > (1 << 28) // (4 * (edge + 1))  # the floor
    assert chunk_tokens_for(1_032_444) == 65  # the largest vocabulary given more than 64
    _, head, hidden, target = _setup(0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_lm_loss(hidden, target, head, normalizer=1.0, chunk_tokens=0)
    with pytest.raises(ValueError, match="targets for"):
        chunked_lm_loss(hidden, target[:-1], head, normalizer=1.0, chunk_tokens=8)
