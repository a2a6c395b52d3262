"""The group-error mechanism on its own (no transformers): one rank's refusal carried by the
item tables' gather to every rank, the settings agreement of ``plan_items``, and the message
every rank raises. The wrappers on real architectures: test_hf_group_errors.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.dist_helper import run_ranks
from trainer_adapter.group_errors import StepRefused, raise_together, reason_of


def test_no_reason_no_error():
    raise_together([None, None, None], "x")


def test_message_groups_ranks_by_reason_and_chains_the_cause():
    cause = RuntimeError("CUDA out of memory")
    with pytest.raises(StepRefused) as e:
        raise_together([None, "bad rows", "bad rows", "no grid"], "Tower (balance_vision)", cause)
    msg = str(e.value)
    assert msg.startswith("Tower (balance_vision) stopped on every rank of the group")
    assert "ranks 1, 2 of 4: bad rows" in msg and "rank 3 of 4: no grid" in msg
    assert "rank 0" not in msg
    assert e.value.reasons == {1: "bad rows", 2: "bad rows", 3: "no grid"}
    assert e.value.__cause__ is cause
    assert isinstance(e.value, ValueError)  # callers catching the wrappers' refusals still do


def test_reason_of():
    assert reason_of(ValueError("refused")) == "refused"
    assert reason_of(RuntimeError("oom")) == "RuntimeError: oom"


def _table(rank):
    return np.array([[3 + rank], [1]], dtype=np.int64) if rank != 1 else np.zeros((0, 1), np.int64)


def rank_refusal(rank, world):
    """Rank 1 refuses the first round; every rank must raise there, then a second round
    works on every rank and plans as a clean one."""
    from trainer_adapter.item_exchange import plan_items

    cost = lambda t: t[:, 0].astype(float)  # noqa: E731
    refusal = ValueError("rank one's table is bad") if rank == 1 else None
    try:
        plan_items(_table(rank), cost, refusal=refusal, where="test round")
        first = None
    except StepRefused as e:
        first = (str(e), sorted(e.reasons), e.__cause__ is not None and e.__cause__ is refusal)
    route = plan_items(_table(rank), cost)
    return first, route.dest.tolist(), route.table.tolist()


def test_one_ranks_refusal_raised_on_every_rank_and_the_group_goes_on():
    runs = run_ranks(rank_refusal, 3)
    for rank, (first, dest, table) in enumerate(runs):
        assert first is not None, f"rank {rank} planned the refused round"
        msg, reasons, chained = first
        assert reasons == [1] and "rank 1 of 3: rank one's table is bad" in msg
        assert msg.startswith("test round stopped")
        assert chained == (rank == 1)
        # the next round: the same plan everywhere, the settings column not in the table
        assert table == [[3], [1], [5], [1]]
        assert dest == runs[0][1]


def rank_settings(rank, world, settings):
    from trainer_adapter.item_exchange import plan_items

    cost = lambda t: t[:, 0].astype(float)  # noqa: E731
    try:
        route = plan_items(_table(rank), cost, settings=settings[rank])
    except StepRefused as e:
        return "refused", str(e)
    return "planned", route.settings


def test_settings_agreed_and_adopted_by_a_rank_without_items():
    """Ranks 0 and 2 bring items called with fine=True; rank 1 brings none (its call has
    other settings, which do not matter): every rank runs received items with fine=True."""
    runs = run_ranks(rank_settings, 3, [{"fine": True}, {}, {"fine": True}])
    assert runs == [("planned", {"fine": True})] * 3


def test_no_settings_nothing_to_agree():
    runs = run_ranks(rank_settings, 3, [{}, {}, {}])
    assert runs == [("planned", {})] * 3


def test_settings_that_differ_refused_on_every_rank():
    runs = run_ranks(rank_settings, 3, [{"fine": True}, {"fine": True}, {"fine": False}])
    for kind, msg in runs:
        assert kind == "refused"
        assert "different settings" in msg
        assert "rank 0 of 3: called with {'fine': True}" in msg
        assert "rank 2 of 3: called with {'fine': False}" in msg
        assert "rank 1" not in msg  # it brought no items: its settings do not count


def test_call_settings_are_the_plain_keyword_inputs_only():
    """What a rank running another rank's items must call them with: the module call's plain
    keyword values (a flag, a layer index or list of them, a strategy name), never per-item
    tensors, output selection or the packing kwargs of this rank's own row (bug: a rank ran
    received items with none of the caller's settings, or with its own row's cu_seq_lens).
    Reference: the rule applied by hand to one call of every kind of keyword."""
    import torch

    from trainer_adapter.hf.packing import call_settings

    kwargs = {
        "pixel_values": torch.zeros(4, 3),
        "image_grid_thw": torch.tensor([[1, 2, 2]]),
        "fine": True,
        "vision_feature_layer": [-2, -1],
        "vision_feature_select_strategy": "default",
        "temperature": 0.5,
        "return_dict": True,
        "output_hidden_states": False,
        "cu_seq_lens_q": torch.tensor([0, 4]),
        "max_length_q": 4,
        "callback": object(),
        "mixed": [1, torch.zeros(1)],
    }
    assert call_settings(kwargs) == {
        "fine": True,
        "temperature": 0.5,
        "vision_feature_layer": [-2, -1],
        "vision_feature_select_strategy": "default",
    }
