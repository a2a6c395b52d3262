"""Odd but valid, and invalid, numbers where lengths enter the balancing algorithms (issue #37
item 10): ties and zeros spread by count; NaN, inf, negatives and out-of-range ranks are refused
by name instead of silently piling everything on one batch (or indexing outside an array in a
kernel)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from balancing.cost_model import PhaseCost
from balancing.nodewise import locality_balance, nodewise_permutation
from balancing.plan import BalanceConfig, build_plan
from balancing.post_balance import METHODS, post_balance
from balancing.reorder import inter_microbatch_reorder, intra_batch_reorder, pipeline_times

BAD = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf, "negative": -1.0}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bad", sorted(BAD))
def test_post_balance_refuses_nan_inf_and_negatives(method, bad):
    """Bug: NaN and +inf were accepted (Karmarkar-Karp put everything on one batch)."""
    x = np.arange(1.0, 17.0)
    x[5] = BAD[bad]
    with pytest.raises(ValueError, match=r"item 5"):
        post_balance(x, 4, method=method)


@pytest.mark.parametrize("method", METHODS)
def test_lengths_whose_sum_is_not_finite_are_refused(method):
    """Each finite, their sum not: every batch's load read inf, so any split looked as even
    as any other (bug: accepted, the loads came back [inf, 1e308])."""
    x = np.array([1e308, 1e308, 1e308, 1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="sum past the largest float"):
        post_balance(x, 2, method=method)


@pytest.mark.parametrize("bad", sorted(BAD))
def test_memory_and_runtime_entry_points_refuse_them_too(bad):
    x = np.arange(1.0, 17.0)
    y = x.copy()
    y[3] = BAD[bad]
    src = np.arange(16) % 4
    with pytest.raises(ValueError, match="memory"):
        post_balance(x, 4, method="lpt", memory=y, memory_cap=1e9)
    with pytest.raises(ValueError, match="item 3"):
        locality_balance(y, src, 4, 2)
    with pytest.raises(ValueError, match="volume"):
        nodewise_permutation(src, src[::-1].copy(), y, 4, 2)
    with pytest.raises(ValueError, match="sizes"):
        intra_batch_reorder(y, 2)
    with pytest.raises(ValueError, match="stage times"):
        inter_microbatch_reorder(y, 2)
    with pytest.raises(ValueError, match="stage times"):
        pipeline_times(y, p=2)


def test_ranks_outside_the_range_are_refused_not_indexed():
    """A rank id >= d or < 0 would index outside the kernels' arrays (numba does not check)."""
    x = np.ones(8)
    for bad in (4, -1, 10**9):
        src = np.zeros(8, dtype=np.int64)
        src[2] = bad
        with pytest.raises(ValueError, match=r"src\[2\]"):
            locality_balance(x, src, 4, 2)
        with pytest.raises(ValueError, match=r"dest\[2\]"):
            nodewise_permutation(np.zeros(8, dtype=np.int64), src, x, 4, 2)
    with pytest.raises(ValueError, match="permutation"):
        pipeline_times(np.ones(4), p=2, order=[0, 0, 1, 2])
    with pytest.raises(ValueError, match="order"):
        pipeline_times(np.ones(4), p=2, order=[0, 1, 2, 7])


@pytest.mark.parametrize("alpha, beta", [(np.nan, 1.0), (1.0, np.inf), (-1.0, 2.0), (0, 0)])
def test_cost_coefficients_must_be_finite(alpha, beta):
    with pytest.raises(ValueError, match="finite"):
        PhaseCost(alpha=alpha, beta=beta)


def _table(v: int, t: int, n: int) -> pa.Table:
    return pa.table(
        {
            "sample_id": [f"s{i}" for i in range(n)],
            "source": ["x"] * n,
            "num_images": pa.array([1 if v else 0] * n, pa.int32()),
            "vit_tokens": pa.array([v] * n, pa.int64()),
            "vit_seq_lens": pa.array([[v] if v else [] for _ in range(n)], pa.list_(pa.int32())),
            "llm_tokens": pa.array([t] * n, pa.int64()),
            "text_tokens": pa.array([t] * n, pa.int64()),
        }
    )


@pytest.mark.parametrize("v, t", [(0, 0), (0, 7), (300, 300)])
@pytest.mark.parametrize("dp, batch, n", [(4, 4, 64), (8, 3, 100)])
def test_equal_or_zero_costs_spread_by_count(v, t, dp, batch, n):
    """Every sample alike (all zero, or all equal): the reference answer is a count-balanced
    plan, every rank within one group's worth of n / dp samples and groups near the target
    batch (bug: an all-zero table became one group of every sample on one rank)."""
    plan = build_plan(_table(v, t, n), BalanceConfig(dp=dp, nodes=1, target_batch=batch)).plan
    per_rank = np.bincount(plan.column("rank").to_numpy(), minlength=dp)
    sizes = np.unique(plan.column("group_id").to_numpy(), return_counts=True)[1]
    assert plan.num_rows == n
    assert sizes.max() <= 2 * batch, sizes
    assert per_rank.max() - per_rank.min() <= 2 * batch, per_rank


@pytest.mark.parametrize("value", [np.nan, np.inf, -1.0])
def test_config_numbers_must_be_finite(value):
    """NaN passes a plain ``x < 0`` check: every float a user sets is checked to be finite."""
    from trainer_adapter.redistribute import RedistributePolicy

    with pytest.raises(ValueError, match="finite"):
        RedistributePolicy(min_gain=value)
    with pytest.raises(ValueError):
        BalanceConfig(dp=4, nodes=1, target_batch=value)
    with pytest.raises(ValueError):
        BalanceConfig(dp=4, nodes=1, slack=value)


def test_rank_counts_past_the_bound_are_refused():
    """``--dp 10**12`` would make arrays of that size: refused by name at once."""
    with pytest.raises(ValueError, match="--dp must be"):
        BalanceConfig(dp=10**12, nodes=1)


@pytest.mark.parametrize("bad", [0, 2.5, np.nan, True, "4", 10**12])
def test_rank_counts_of_the_runtime_api_are_whole_and_bounded(bad):
    """Every public balancing function that takes a number of ranks, batches, groups or stages
    refuses one that is not a whole number in range, naming it: 2.5 or NaN ranks, True (read
    as 1), and 10**12 (post_balance allocated arrays of d: at 10**9 the process died out of
    memory)."""
    from balancing import (
        batch_loads,
        inter_microbatch_reorder,
        intra_batch_reorder,
        locality_balance,
        nodewise_permutation,
        pipeline_times,
        post_balance,
        volume_matrix,
    )

    x = np.array([5.0, 3.0, 2.0, 7.0])
    zeros = np.zeros(4, dtype=np.int64)
    calls = {
        "post_balance": lambda: post_balance(x, bad),
        "batch_loads": lambda: batch_loads(x, zeros, bad),
        "volume_matrix": lambda: volume_matrix(zeros, zeros, x, bad),
        "nodewise_permutation": lambda: nodewise_permutation(zeros, zeros, x, bad, 1),
        "nodewise per_node": lambda: nodewise_permutation(zeros, zeros, x, 2, bad),
        "locality_balance": lambda: locality_balance(x, zeros, bad, 1),
        "locality per_node": lambda: locality_balance(x, zeros, 2, bad),
        "intra_batch_reorder": lambda: intra_batch_reorder(x, bad),
        "inter_microbatch_reorder": lambda: inter_microbatch_reorder(x, bad),
        "pipeline_times": lambda: pipeline_times(x, p=bad),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="whole number"):
            call()
            pytest.fail(f"{name} took {bad!r}")


def test_counts_that_cap_a_balance_are_whole():
    from balancing import post_balance

    x = np.array([5.0, 3.0, 2.0, 7.0])
    for kw in ({"max_count": 1.5}, {"max_count": np.nan}, {"max_swaps": -1}, {"max_swaps": 0.5}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            post_balance(x, 2, **kw)
