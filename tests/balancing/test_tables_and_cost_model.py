"""The plan's table kernels without a twin, against numpy and Python's own sort, and the cost
model's coefficients against the formula it states (worked by hand).

Planted bugs these catch: the counting sort losing its stability (samples of one step reordered
between runs of the same plan), group maxima that are not maxima, causal attention costed as
full attention, the projection cost counted for one layer only, the vision cost squaring the
sum of a sample's image sequences instead of summing their squares."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from balancing import _kernels as K
from balancing.cost_model import CostModel, PhaseCost, sample_costs

SEEDS = range(25)


@pytest.mark.parametrize("seed", SEEDS)
def test_counting_argsort_is_pythons_stable_sort(seed):
    rng = np.random.default_rng(seed)
    n_keys = int(rng.integers(1, 12))
    keys = rng.integers(0, n_keys, int(rng.integers(0, 300)))  # many ties
    got = K._nb_counting_argsort(keys, n_keys)
    assert got.tolist() == sorted(range(len(keys)), key=lambda i: keys[i])


@pytest.mark.parametrize("seed", SEEDS)
def test_group_max_is_numpys_per_group_maximum(seed):
    rng = np.random.default_rng(seed)
    n_groups = int(rng.integers(1, 20))
    ids = rng.integers(0, n_groups, int(rng.integers(1, 200)))
    x = rng.exponential(100.0, ids.size)
    want = np.zeros(n_groups)
    np.maximum.at(want, ids, x)
    assert K._nb_group_max(ids, x, n_groups).tolist() == want.tolist()


def test_pad_ratios_count_every_group_with_tokens_and_none_without():
    """By hand: a group's pad ratio is (count * max - sum) / (count * max), averaged over the
    groups whose maximum is > 0 (a group of one-token samples included); with no such group the
    mean is 0, not a division by zero."""
    # vision: group 0 (count 3, sum 1, max 1) -> 2/3, group 1 (3, 6, 4) -> 1/2, group 2 none;
    # text: groups 0 and 1 even -> 0, group 2 (count 2, sum 1, max 1) -> 1/2
    ids = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    v = np.array([1.0, 0.0, 0.0, 4.0, 1.0, 1.0, 0.0, 0.0])
    t = np.array([3.0, 3.0, 3.0, 2.0, 2.0, 2.0, 1.0, 0.0])
    stats = K._nb_group_stats(ids, v, t, v, t, 3)
    ra, rb = K._nb_stats_pad_ratios(stats)
    assert ra == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert rb == pytest.approx((0 + 0 + 1 / 2) / 3)
    text_only = K._nb_group_stats(
        np.array([0, 1]), np.zeros(2), np.ones(2), np.zeros(2), np.ones(2), 2
    )
    assert K._nb_stats_pad_ratios(text_only) == (0.0, 0.0)
    empty = K._nb_group_stats(
        np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), 1
    )
    assert K._nb_stats_pad_ratios(empty) == (0.0, 0.0)


def test_phase_cost_from_dims_is_the_stated_formula():
    """alpha = 24 h^2 L (projections and MLP per token), beta = 4 h L per squared sequence
    length (attention), half of it for causal attention; h = 2, L = 3 by hand."""
    full = PhaseCost.from_dims(hidden=2, layers=3, causal=False)
    causal = PhaseCost.from_dims(hidden=2, layers=3, causal=True)
    assert (full.alpha, full.beta) == (24 * 4 * 3, 4 * 2 * 3) == (288, 24)
    assert (causal.alpha, causal.beta) == (288, 12)
    m = CostModel.from_dims(vit_hidden=2, vit_layers=3, llm_hidden=5, llm_layers=7)
    assert (m.vision.alpha, m.vision.beta) == (288, 24)  # the encoder attends both ways
    assert (m.llm.alpha, m.llm.beta) == (24 * 25 * 7, 2 * 5 * 7)


def test_sample_costs_sum_the_squares_of_each_image_sequence():
    table = pa.table(
        {
            "vit_tokens": pa.array([0, 30, 8], pa.int64()),
            "vit_seq_lens": pa.array([[], [10, 20], [8]], pa.list_(pa.int32())),
            "llm_tokens": pa.array([5, 40, 3], pa.int64()),
        }
    )
    model = CostModel(vision=PhaseCost(alpha=2.0, beta=3.0), llm=PhaseCost(alpha=5.0, beta=7.0))
    vc, tc = sample_costs(table, model)
    # by hand: 2*30 + 3*(10^2 + 20^2) = 1560 (not 3*(30^2)); 2*8 + 3*64 = 208
    assert vc.tolist() == [0.0, 1560.0, 208.0]
    assert tc.tolist() == [5 * 5 + 7 * 25, 5 * 40 + 7 * 1600, 5 * 3 + 7 * 9]


def test_a_per_item_constant_counts_each_sequence_and_each_sample_once():
    """gamma (a calibration's per-item constant): once per image sequence in the vision phase,
    once per sample in the LLM, none for a sample without images; a plan report records it and
    reads it back, and a report without it reads as 0."""
    table = pa.table(
        {
            "vit_tokens": pa.array([0, 30, 8], pa.int64()),
            "vit_seq_lens": pa.array([[], [10, 20], [8]], pa.list_(pa.int32())),
            "llm_tokens": pa.array([5, 40, 3], pa.int64()),
        }
    )
    model = CostModel(
        vision=PhaseCost(alpha=2.0, beta=3.0, gamma=100.0),
        llm=PhaseCost(alpha=5.0, beta=7.0, gamma=1000.0),
    )
    vc, tc = sample_costs(table, model)
    assert vc.tolist() == [0.0, 1560.0 + 200.0, 208.0 + 100.0]
    assert tc.tolist() == [25 + 175 + 1000.0, 200 + 11200 + 1000.0, 15 + 63 + 1000.0]
    rec = model.describe()
    assert rec["vision"] == {"alpha": 2.0, "beta": 3.0, "gamma": 100.0}
    assert CostModel.from_record(rec, "r") == model
    old = CostModel(vision=PhaseCost(alpha=2.0, beta=3.0), llm=PhaseCost(alpha=5.0, beta=7.0))
    assert "gamma" not in old.describe()["llm"]  # a report as before the constant existed
    assert CostModel.from_record(old.describe(), "r").llm.gamma == 0.0
    assert PhaseCost(alpha=0, beta=0, gamma=1).of(10, 100, 3) == 3
    for bad in (-1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="finite numbers >= 0"):
            PhaseCost(alpha=1.0, beta=0.0, gamma=bad)
    with pytest.raises(ValueError, match="not all 0"):
        PhaseCost(alpha=0.0, beta=0.0, gamma=0.0)


def test_a_calibrated_policy_is_used_for_every_tower(tmp_path):
    """Measured beats modeled: with a calibrated policy the HF wrappers take its costs, not
    the ones a tower's config dimensions would give."""
    import torch

    from trainer_adapter.hf.rounds import tower_cost
    from trainer_adapter.redistribute import RedistributePolicy

    cal = tmp_path / "cal.json"
    cal.write_text(
        '{"vision": {"alpha": 1, "beta": 2, "gamma": 3}, "llm": {"alpha": 4, "beta": 0}}'
    )
    tower = torch.nn.Linear(2, 2)
    tower.config = type("C", (), {"hidden_size": 64, "num_hidden_layers": 2})()
    measured = RedistributePolicy(cost_model=CostModel.from_calibration(cal))
    assert tower_cost(tower, measured) is measured.cost_model and measured.cost_model.calibrated
    modeled = tower_cost(tower, RedistributePolicy())
    assert not modeled.calibrated and modeled.vision == PhaseCost.from_dims(
        hidden=64, layers=2, causal=False
    )


@pytest.mark.parametrize(
    ("field", "hi"),
    [
        ("vit_hidden", 1 << 24),
        ("llm_hidden", 1 << 24),
        ("vit_layers", 1 << 16),
        ("llm_layers", 1 << 16),
    ],
)
def test_cost_model_options_take_dimensions_at_their_limits_and_refuse_past_them(field, hi):
    """``balance --vit-hidden`` and friends: 1 and the limit are taken and give the model of
    those dimensions; 0, the limit + 1, a bool and a float are refused naming the option."""
    from balancing.cost_model import CostModelOptions

    for ok in (1, hi):
        model = CostModelOptions(**{field: ok}).build()
        dims = {"vit_hidden": 1024, "vit_layers": 24, "llm_hidden": 4096, "llm_layers": 32}
        assert model == CostModel.from_dims(**(dims | {field: ok}))
    flag = "--" + field.replace("_", "-")
    for bad in (0, hi + 1, True, 2.0, -1):
        with pytest.raises(ValueError, match=flag):
            CostModelOptions(**{field: bad})


def test_cost_model_options_read_a_calibration_instead_of_dimensions(tmp_path):
    from balancing.cost_model import CostModelOptions

    cal = tmp_path / "cal.json"
    cal.write_text('{"vision": {"alpha": 1, "beta": 2}, "llm": {"alpha": 3, "beta": 0}}')
    model = CostModelOptions(calibration=str(cal), llm_layers=80).build()
    assert (model.vision, model.llm) == (PhaseCost(alpha=1, beta=2), PhaseCost(alpha=3, beta=0))
    digest = hashlib.sha256(cal.read_bytes()).hexdigest()[:16]
    assert model.source == f"calibration {cal} (sha256 {digest})"  # a plan names its calibration
    cal.write_text('{"vision": {"alpha": -1, "beta": 2}, "llm": {"alpha": 3, "beta": 0}}')
    with pytest.raises(ValueError, match="calibration file"):
        CostModelOptions(calibration=str(cal)).build()
