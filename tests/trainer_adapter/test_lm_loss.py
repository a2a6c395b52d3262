"""The pipeline's loss (``LMLoss``) against a float64 reference written with ``log_softmax``:
the summed next-token cross entropy over the target positions, divided by the step's global
number of targets, in at least fp32 whatever the logits' dtype.

Planted bugs this catches: the loss computed on bf16 logits without the fp32 upcast (its value
rounded to bf16's 8 bits of mantissa), padding or non-target positions counted, the local
instead of the given normalizer."""

from __future__ import annotations

import pytest
import torch

from trainer_adapter.train.pipeline import LMLoss


def _reference(logits: torch.Tensor, target: torch.Tensor, normalizer: float) -> float:
    x = logits.reshape(-1, logits.shape[-1]).double()
    t = target.reshape(-1)
    keep = t != -100
    logp = torch.log_softmax(x[keep], dim=-1)
    return float(-logp[torch.arange(int(keep.sum())), t[keep]].sum() / normalizer)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(4))
def test_loss_equals_a_float64_reference_in_every_dtype(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rows, length, vocab = 2, 300, 1000
    logits = (torch.randn(rows, length, vocab, generator=g) * 4).to(dtype)
    target = torch.randint(0, vocab, (rows, length), generator=g)
    target[torch.rand(rows, length, generator=g) < 0.3] = -100  # prompts and padding
    normalizer = float((target != -100).sum()) * 1.7  # the step's targets on every rank
    got = LMLoss(normalizer)(logits, target)
    assert got.dtype == torch.float32
    assert float(got) == pytest.approx(_reference(logits, target, normalizer), rel=2e-6)


def test_gradients_reach_low_precision_logits_in_their_dtype():
    logits = torch.randn(1, 8, 50, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 50, (1, 8))
    LMLoss(8.0)(logits, target).backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
