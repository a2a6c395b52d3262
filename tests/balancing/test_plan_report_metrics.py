"""The plan report's quality sections recomputed from the plan's own rows and the cost table,
by the metric definitions of docs/concepts.md written out here in plain numpy / pandas, with scipy's
Spearman rank correlation as the peer for the trend; the random-batching baseline checked
against the spread of truly random batchings of the same samples. Before, the tests asserted
only that a balanced plan beats the baseline: the node balance taken as each node's busiest
rank, the full-step metrics over other steps, the trend's halves swapped, the LLM cost metrics
over the vision cost, the baseline batching the table in its own (length-sorted) order all
passed them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from scipy.stats import spearmanr

from balancing.plan import BalanceConfig, build_plan

D, NODES = 8, 2


def _dist_ratio(loads: np.ndarray) -> float:
    """docs/concepts.md: per step sum(max - x_i) / (max * D), averaged over steps (0 where max is 0)."""
    out = []
    for row in loads:
        mx = max(row)
        out.append(sum(mx - x for x in row) / (mx * len(row)) if mx > 0 else 0.0)
    return sum(out) / len(out)


def _efficiency(loads: np.ndarray) -> float:
    """docs/concepts.md: sum over steps of the mean over sum over steps of the max."""
    return sum(row.mean() for row in loads) / sum(row.max() for row in loads)


def _pad_ratio(lengths: pd.Series, batch: pd.Series) -> float:
    """docs/concepts.md: per batch sum(max_len - len_i) / (max_len * B), averaged over batches."""
    per = lengths.groupby(batch).agg(["max", "sum", "count"])
    per = per[per["max"] > 0]
    return float(((per["max"] * per["count"] - per["sum"]) / (per["max"] * per["count"])).mean())


def _table(n: int, seed: int) -> pa.Table:
    """Heavy-tailed samples in the order many datasets come in: sorted by length."""
    rng = np.random.default_rng(seed)
    tiles = rng.choice([0, 1, 3, 5, 7], n, p=[0.15, 0.35, 0.2, 0.2, 0.1])
    text = (rng.pareto(1.5, n) * 120 + 20).astype(np.int64).clip(max=6000)
    order = np.argsort(tiles * 256 + text, kind="stable")
    tiles, text = tiles[order], text[order]
    return pa.table(
        {
            "sample_id": [f"s{i}" for i in range(n)],
            "vit_tokens": tiles * 1024,
            "llm_tokens": tiles * 256 + text,
            "vit_seq_lens": pa.array([[1024] * int(k) for k in tiles], pa.list_(pa.int32())),
        }
    )


@pytest.fixture(scope="module", params=["fresh-0", "fresh-1", "incremental"])
def planned(request):
    """(cost table, report, the plan's rows with their samples' tokens): a fresh plan, or a
    night's incremental plan over a parent (some samples deleted, new ones arrived)."""
    import pyarrow.compute as pc

    from balancing.incremental import incremental_plan

    kind, _, seed = request.param.partition("-")
    cfg = BalanceConfig(dp=D, nodes=NODES, seed=int(seed or 2))
    table = _table(3001 + 617 * int(seed or 0), seed=int(seed or 2))
    if kind == "fresh":
        result = build_plan(table, cfg)
    else:
        deleted = {f"s{i}" for i in range(0, table.num_rows, 7)}
        keep = table.filter(
            pc.invert(pc.is_in(table.column("sample_id"), pa.array(sorted(deleted))))
        )
        new = _table(1203, seed=9)
        new = new.set_column(0, "sample_id", pa.array([f"n{i}" for i in range(new.num_rows)]))
        parent = build_plan(table, cfg).plan
        table = pa.concat_tables([keep, new])
        result = incremental_plan(parent, table, deleted, cfg)
    rows = result.plan.to_pandas().merge(table.select(["sample_id", "llm_tokens", "vit_tokens"])
                                         .to_pandas(), on="sample_id")  # fmt: skip
    assert len(rows) == table.num_rows
    return table, result.report, rows


def _full_steps(report) -> int:
    return report["counts"]["steps"] - (1 if report["last_step"]["short"] else 0)


def _step_loads(rows: pd.DataFrame, steps: int) -> dict[str, np.ndarray]:
    """[steps, D] of each phase: tokens summed over the samples in each (step, rank), the
    costs as the plan records them per group; a slot holding no group loads 0."""
    groups = rows.groupby("group_id").agg(
        step=("step", "first"),
        rank=("rank", "first"),
        vit_tokens=("vit_tokens", "sum"),
        llm_tokens=("llm_tokens", "sum"),
        vit_cost=("group_vit_cost", "first"),
        llm_cost=("group_llm_cost", "first"),
    )
    out = {}
    for phase in ("vit_tokens", "llm_tokens", "vit_cost", "llm_cost"):
        loads = np.zeros((steps, D))
        for g in groups.itertuples():
            loads[g.step, g.rank] += getattr(g, phase)
        out[phase] = loads
    return out


def _metrics(loads: dict) -> dict:
    out = {}
    for name in ("vit", "llm"):
        out[f"dist_ratio_{name}"] = _dist_ratio(loads[f"{name}_tokens"])
        out[f"efficiency_{name}"] = _efficiency(loads[f"{name}_tokens"])
        out[f"dist_ratio_{name}_cost"] = _dist_ratio(loads[f"{name}_cost"])
        out[f"efficiency_{name}_cost"] = _efficiency(loads[f"{name}_cost"])
    return out


def test_the_reports_balance_metrics_are_the_plans(planned):
    """Every step, full steps and node metric of the report equals the definition applied to
    the plan's rows (the report rounds to 6 digits)."""
    _, report, rows = planned
    steps = report["counts"]["steps"]
    assert report["last_step"]["short"]  # the full-step metrics leave a step out
    loads = _step_loads(rows, steps)
    full = {k: x[: _full_steps(report)] for k, x in loads.items()}
    got = report["metrics"]
    for section, want in (("balanced", _metrics(loads)), ("balanced_full_steps", _metrics(full))):
        for key, value in want.items():
            assert got[section][key] == pytest.approx(value, abs=2e-6), (section, key)
    # a node's load is the sum of its ranks' (rank = node * ranks_per_node + local_rank)
    for name in ("vit", "llm"):
        nodes = loads[f"{name}_tokens"].reshape(steps, NODES, D // NODES).sum(axis=2)
        want = _dist_ratio(nodes)
        assert report["node_balance"][f"dist_ratio_{name}"] == pytest.approx(want, abs=2e-6)
    # pad ratios: every non-empty group a padded batch
    for name in ("vit", "llm"):
        want = _pad_ratio(rows[f"{name}_tokens"], rows["group_id"])
        assert got["balanced"][f"pad_ratio_{name}"] == pytest.approx(want, abs=2e-6)


def test_the_reports_trend_is_spearmans_and_the_halves(planned):
    """The trend over the full steps: scipy's Spearman correlation of the step index with the
    step's mean load (ties ranked by their average, as vision loads in multiples of a tile
    have), and the second half's mean load over the first's."""
    _, report, rows = planned
    steps = report["counts"]["steps"]
    loads = _step_loads(rows, steps)
    for name in ("vit", "llm"):
        mean = loads[f"{name}_tokens"][: _full_steps(report)].mean(axis=1)
        rho = spearmanr(np.arange(mean.size), mean).statistic
        half = mean.size // 2
        trend = report["trend"][name]
        assert trend["spearman"] == pytest.approx(rho, abs=1e-4), name
        assert trend["second_half_over_first"] == pytest.approx(
            mean[half:].mean() / mean[:half].mean(), abs=1e-4
        )
    vit = loads["vit_tokens"][: _full_steps(report)].mean(axis=1)
    assert np.unique(vit).size < vit.size  # ties: the average ranks are exercised


def test_the_random_baseline_is_random_batching(planned):
    """The baseline batches the samples at random, B per rank and D ranks a step: its dist
    ratio lies within the spread of 200 random batchings of the same samples. The table comes
    sorted by length, so batching it in its own order (neighbours together, each step's ranks
    alike) is far outside that spread."""
    table, report, _ = planned
    b = round(report["parameters"]["target_batch"])
    llm = table.column("llm_tokens").to_numpy().astype(float)
    rng = np.random.default_rng(123)

    def batching(order: np.ndarray) -> float:
        batches = llm[order][: (llm.size // (b * D)) * b * D].reshape(-1, D, b).sum(axis=2)
        return _dist_ratio(batches)

    spread = np.array([batching(rng.permutation(llm.size)) for _ in range(200)])
    lo, hi = np.quantile(spread, [0.005, 0.995])
    assert lo <= report["metrics"]["random"]["dist_ratio_llm"] <= hi
    assert not lo <= batching(np.arange(llm.size)) <= hi  # the sorted order: not random
