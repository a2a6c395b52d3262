"""Next-token cross entropy over a large vocabulary without materializing the full logits.

The LM head's output for a packed row is ``tokens x vocabulary``: about 6 GB in bf16 + fp32 for
4k tokens of a 151k-token vocabulary, more than the rest of a 1B model's activations. The loss
here needs only the positions that have a target (image tokens, prompts and padding have none):
it picks those rows of the final hidden states, then runs the head and the loss chunk by chunk,
each chunk under activation checkpointing, so at most one chunk's logits exist at a time in the
forward and in the backward, where the chunk's logits are recomputed. The positions are taken
from the targets on the host, so the step does no device-to-host copy to find them.

The result equals ``F.cross_entropy(head(norm(hidden)), target, ignore_index=-100,
reduction="sum") / normalizer`` with the logits upcast to fp32 (``tests/trainer_adapter/
test_chunked_loss.py``: loss and gradients against that reference).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = ["ChunkedLMLoss", "chunk_tokens_for", "chunked_lm_loss"]

# logits of one chunk in fp32: 256 MiB, e.g. 442 tokens of a 151,646-token vocabulary (a
# 442 x 2048 x 151,646 product still fills an H100; 1 GiB chunks saved little over full logits)
CHUNK_BYTES = 1 << 28


def chunk_tokens_for(vocab_size: int, budget: int = CHUNK_BYTES) -> int:
    """Tokens per chunk so that one chunk's fp32 logits fit ``budget`` bytes (at least 64)."""
    return max(64, budget // (4 * max(vocab_size, 1)))


def _chunk_loss(h: torch.Tensor, target: torch.Tensor, project) -> torch.Tensor:
    logits = project(h)
    return F.cross_entropy(logits.float(), target, reduction="sum")


def chunked_lm_loss(
    hidden: torch.Tensor,
    target: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    *,
    normalizer: float,
    chunk_tokens: int,
) -> torch.Tensor:
    """Summed cross entropy of ``project(hidden)`` against ``target`` over ``normalizer``.

    ``hidden``: [tokens, width] on the model's device; ``target``: [tokens] next-token ids with
    -100 where a position has none, on the host (a device tensor is copied to the host: one
    sync); ``project``: the final norm and LM head; ``chunk_tokens``: target positions per
    chunk (``chunk_tokens_for``)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if target.shape[0] != hidden.shape[0]:
        raise ValueError(f"{target.shape[0]} targets for {hidden.shape[0]} hidden states")
    target = target.reshape(-1).cpu()
    where = (target != -100).nonzero().reshape(-1)
    total = hidden.new_zeros((), dtype=torch.float32)
    if where.numel() == 0:
        return total + 0 * hidden.sum()  # keeps the graph (a collective may wait on its backward)
    cuda = hidden.is_cuda

    def to_device(t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory().to(hidden.device, non_blocking=True) if cuda else t

    picked = hidden.index_select(0, to_device(where))
    wanted = to_device(target[where])
    for lo in range(0, where.numel(), chunk_tokens):
        part = slice(lo, lo + chunk_tokens)
        if torch.is_grad_enabled():
            total = total + checkpoint(
                _chunk_loss, picked[part], wanted[part], project, use_reentrant=False
            )
        else:
            total = total + _chunk_loss(picked[part], wanted[part], project)
    return total / normalizer


class ChunkedLMLoss:
    """The pipeline's loss: the last stage hands over its final-norm hidden states (a row of
    ``[1, tokens, width]``, padding included) and this runs the LM head and the cross entropy
    chunk by chunk (``chunked_lm_loss``); ``normalizer`` is set before each step (the global
    number of target tokens), so microbatch losses add up to the step's mean. Targets given on
    the host need no device sync to find the target positions."""

    def __init__(self, head, chunk_tokens: int, normalizer: float = 1.0, timer=None) -> None:
        self.head, self.chunk_tokens, self.normalizer = head, chunk_tokens, normalizer
        # the last pipeline stage's StageTimer: the LM head and the loss are that stage's work
        # (the schedule runs them after its forward), so their passes count as its busy time
        self.timer = timer

    def __call__(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from trainer_adapter.train.pipeline import timed_pass

        return timed_pass(
            self.timer,
            lambda h: chunked_lm_loss(
                h.reshape(-1, h.shape[-1]),
                target.reshape(-1),
                self.head,
                normalizer=self.normalizer,
                chunk_tokens=self.chunk_tokens,
            ),
            hidden,
        )
