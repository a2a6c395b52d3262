"""The loss normalizer counts exactly the terms the loss sums, also where a sample's (or a
packed row's) first token carries a label: that token is never predicted (nothing comes before
it inside its sample), so it is no term of the loss and no part of the normalizer. The suite's
batches never labelled a first token, so counting it passed unseen (a planted bug of the
held-out set). References: the number of targets the loss itself sees
(``shifted_labels``, the reference trainer's), and transformers' own ``ForCausalLMLoss``."""

from __future__ import annotations

import torch

from tests.dist_helper import run_ranks
from tests.trainer_adapter.synthetic import batch_of


def _labelled_first(rank: int) -> dict:
    """Samples whose every token is a target, the first included (an image-free sample that
    opens inside an assistant turn), beside ordinary ones."""
    b = batch_of(rank, [(0, 7), (2, 11), (0, 5), (1, 9)][: 3 + rank])
    cu = b["cu_seqlens"].tolist()
    for i in (0, 2):  # the image-free samples: every token labelled
        b["labels"][cu[i] : cu[i + 1]] = b["input_ids"][cu[i] : cu[i + 1]]
    return b


def _normalizer_and_terms(rank, world):
    from trainer_adapter import RedistributePolicy, Topology, redistribute
    from trainer_adapter.train.model import shifted_labels

    batch = _labelled_first(rank)
    assert any(batch["labels"][c] != -100 for c in batch["cu_seqlens"][:-1].tolist())
    local, route = redistribute(batch, None, Topology(ranks_per_node=1), RedistributePolicy())
    terms = int((shifted_labels(local.labels, local.label_cu_seqlens) != -100).sum())
    return float(route.table[:, 4].sum()), terms


def test_the_runtime_normalizer_counts_the_loss_terms_when_first_tokens_carry_labels():
    got = run_ranks(_normalizer_and_terms, 2, timeout=120)
    normalizers = {n for n, _ in got}
    assert len(normalizers) == 1  # every rank divides by the same global count
    assert normalizers.pop() == sum(t for _, t in got)


def _hf_counts(rank, world):
    from transformers.loss.loss_utils import ForCausalLMLoss

    from trainer_adapter.hf.balance import global_targets

    g = torch.Generator().manual_seed(rank)
    logits = torch.randn(1, 12, 50, generator=g)
    ids = torch.randint(0, 50, (1, 12), generator=g)
    out = []
    for first in (True, False):
        labels = ids.clone()
        labels[0, 5:7] = -100
        if not first:
            labels[0, 0] = -100
        n = global_targets(labels)  # summed over the ranks
        mean = ForCausalLMLoss(logits, labels, 50)  # transformers' own count of its terms
        summed = ForCausalLMLoss(logits, labels, 50, num_items_in_batch=n / world)
        out.append((bool(torch.allclose(summed, mean)), int(n)))
    return out


def test_hf_global_targets_equal_transformers_own_count_when_a_row_opens_labelled():
    """``global_targets`` (num_items_in_batch) against transformers' ``ForCausalLMLoss``: the
    loss summed over it equals the mean transformers takes over the tokens it predicts, with
    the row's first token labelled and without (11 predicted positions a row, two of them
    unlabelled: 9 a rank, 18 over two)."""
    got = run_ranks(_hf_counts, 2, timeout=120)
    assert got == [[(True, 18), (True, 18)]] * 2
