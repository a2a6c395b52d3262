"""``assign_steps`` against an independent LPT, under a change of units, and its markers.

Bugs these catch (each survived the rest of the suite under cosmic-ray): the last step's
sample weights floored (``//``) before LPT, so samples lighter than the mean weigh nothing and
land anywhere; a phase normalized by a floor of 1 instead of its mean, so loads measured in
small units (a calibrated cost in seconds) stop counting in node placement; groups dissolved
into the last step marked with something other than -1; the keyword-only settings made
positional."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancing.steps import assign_steps


def lpt_reference(w: np.ndarray, members: np.ndarray, d: int) -> np.ndarray:
    """Plain LPT written apart from the kernels: heaviest first (ties: lower sample index), each
    onto the least-loaded bin (ties: the lowest bin). The bin of each member, in ``members``'
    order."""
    loads = [0.0] * d
    out = {}
    for i in sorted(members.tolist(), key=lambda i: (-w[i], i)):
        b = min(range(d), key=lambda j: (loads[j], j))
        loads[b] += w[i]
        out[i] = b
    return np.array([out[i] for i in members.tolist()], dtype=np.int64)


def _case(rng: np.random.Generator, n_groups: int, d: int):
    sizes = rng.integers(1, 4, n_groups)
    group_of = np.repeat(np.arange(n_groups), sizes)
    n = group_of.size
    vc = rng.integers(0, 5000, n).astype(float)
    lc = rng.integers(1, 3000, n).astype(float)
    return group_of, {"vit_tokens": vc, "llm_tokens": lc, "vit_cost": vc * 1.5, "llm_cost": lc}


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(2, 6), data=st.data())
def test_the_last_step_is_exactly_lpt_on_normalized_weights(seed, d, data):
    """The dissolved groups' samples go to the last step's D groups as plain LPT puts them on
    w = vision cost / its mean + LLM cost / its mean (the weights exact, not floored)."""
    n_groups = data.draw(st.integers(1, 4)) * d + data.draw(st.integers(1, d - 1))
    group_of, loads = _case(np.random.default_rng(seed), n_groups, d)
    a = assign_steps(
        group_of, n_groups, loads, nodes=1, gpus_per_node=d, rng=np.random.default_rng(0)
    )
    members = np.flatnonzero(np.isin(a.group_of, a.last_step_groups))
    vc, lc = loads["vit_cost"], loads["llm_cost"]
    w = vc / max(vc.mean(), 1e-12) + lc / max(lc.mean(), 1e-12)
    want = a.last_step_groups[lpt_reference(w, members, d)]
    np.testing.assert_array_equal(a.group_of[members], want)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("scale", [1e-4, 1e-2, 1e3])
def test_units_do_not_change_the_assignment(seed, scale):
    """Each phase is normalized by its own mean before LPT and node placement, so loads given
    in other units (costs in seconds, tokens in thousands) give the same assignment; mean loads
    below 1 included (a floor of 1 in place of the mean would drop the phase)."""
    rng = np.random.default_rng(seed)
    nodes, per = 2, 3
    d = nodes * per
    n_groups = int(rng.integers(2, 5)) * d + int(rng.integers(1, d))
    group_of, loads = _case(rng, n_groups, d)
    base = assign_steps(
        group_of, n_groups, loads, nodes=nodes, gpus_per_node=per, rng=np.random.default_rng(1)
    )
    scaled = {k: v * scale for k, v in loads.items()}
    got = assign_steps(
        group_of, n_groups, scaled, nodes=nodes, gpus_per_node=per, rng=np.random.default_rng(1)
    )
    for field in ("group_of", "step", "node", "local_rank", "last_step_groups"):
        np.testing.assert_array_equal(getattr(got, field), getattr(base, field), err_msg=field)


def test_units_of_one_phase_alone_do_not_change_node_placement():
    """Only the LLM phase in small units (mean below 1): the node placement is the one made
    with the LLM loads in tokens, found on the cases where the two weigh differently."""
    changed = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        nodes, per = 2, 2
        n_groups = 3 * nodes * per
        group_of, loads = _case(rng, n_groups, nodes * per)
        base = assign_steps(
            group_of, n_groups, loads, nodes=nodes, gpus_per_node=per, rng=np.random.default_rng(2)
        )
        small = {**loads, "llm_tokens": loads["llm_tokens"] / 1e4}
        got = assign_steps(
            group_of, n_groups, small, nodes=nodes, gpus_per_node=per, rng=np.random.default_rng(2)
        )
        np.testing.assert_array_equal(got.node, base.node)
        np.testing.assert_array_equal(got.local_rank, base.local_rank)
        vision_only = {**loads, "llm_tokens": np.zeros_like(loads["llm_tokens"])}
        other = assign_steps(
            group_of,
            n_groups,
            vision_only,
            nodes=nodes,
            gpus_per_node=per,
            rng=np.random.default_rng(2),
        )
        changed += not np.array_equal(other.node, base.node)
    assert changed, "no case where the LLM phase changes the node placement: the test is blind"


def test_dissolved_groups_are_marked_minus_one():
    """A group dissolved into the last step has no step, node or rank: all three are -1, and
    it has no sample left; every other group has a step, node and rank."""
    rng = np.random.default_rng(5)
    d = 4
    n_groups = 2 * d + 3
    group_of, loads = _case(rng, n_groups, d)
    a = assign_steps(group_of, n_groups, loads, nodes=2, gpus_per_node=2, rng=rng)
    dissolved = np.flatnonzero(a.step[:n_groups] == -1)
    assert dissolved.size == 3
    for field in (a.step, a.node, a.local_rank):
        assert set(field[dissolved].tolist()) == {-1}
    assert not np.isin(a.group_of, dissolved).any()
    live = np.setdiff1d(np.arange(a.step.size), dissolved)
    assert (a.step[live] >= 0).all() and (a.node[live] >= 0).all()
    assert (a.local_rank[live] >= 0).all() and a.step.size == n_groups + d


def test_the_settings_are_keyword_only():
    group_of, loads = _case(np.random.default_rng(0), 4, 2)
    with pytest.raises(TypeError):
        assign_steps(group_of, 4, loads, 1, 2, np.random.default_rng(0))


@pytest.mark.parametrize("empty", ["vision", "both costs", "llm tokens"])
def test_a_phase_with_no_load_at_all_divides_nothing_by_zero(empty):
    """Text-only data: no vision tokens or cost anywhere (mean 0). Each phase's mean is floored
    at a tiny positive number, never used as 0 (0 / 0 is NaN: the placement then compares
    NaNs); the placement still fills every (node, rank) slot of every step once."""
    rng = np.random.default_rng(3)
    nodes, per = 2, 2
    d = nodes * per
    n_groups = 3 * d + 2
    group_of, loads = _case(rng, n_groups, d)
    if empty == "llm tokens":  # (no LLM tokens anywhere: the floor of that phase's mean)
        loads["llm_tokens"] = np.zeros_like(loads["llm_tokens"])
    else:
        loads["vit_tokens"] = np.zeros_like(loads["vit_tokens"])
        loads["vit_cost"] = np.zeros_like(loads["vit_cost"])
    if empty == "both costs":
        loads["llm_cost"] = np.zeros_like(loads["llm_cost"])
    with np.errstate(all="raise"):
        a = assign_steps(
            group_of, n_groups, loads, nodes=nodes, gpus_per_node=per, rng=np.random.default_rng(0)
        )
    placed = a.step >= 0
    slots = a.step[placed] * d + a.node[placed] * per + a.local_rank[placed]
    assert sorted(slots.tolist()) == list(range(a.n_steps * d))


@pytest.mark.parametrize("levels", [1, 4, 16])
def test_coarse_keeps_few_values_and_bins_many(levels):
    """An encoder's group load as a sort key: kept as it is with at most ``levels`` distinct
    values (whole padded windows), else 0 for no load and, for a load, 1 + its bin among
    ``levels - 1`` equal bins of log(load) between the smallest load and the largest; the
    maximum in the last bin, order kept (a bin never ranks a smaller load above a larger), the
    smallest load never in the bin of no load (the bug named: a step of groups without audio
    and groups with a short recording, all but empty of audio and as uneven as a step can be),
    and within a bin no load more than the bin's factor above another (the bug named: equal
    bins of the range, whose first bin holds loads 40x apart)."""
    from balancing.steps import coarse

    few = np.array([0.0, 1500.0, 3000.0, 1500.0])[: max(1, min(4, levels))]
    if np.unique(few).size <= levels:
        np.testing.assert_array_equal(coarse(few, levels), few)
    rng = np.random.default_rng(levels)
    many = np.where(rng.random(400) < 0.3, 0.0, rng.uniform(0, 5000, 400))
    many[:2] = (1e-3, 5000.0)  # the smallest load and the largest
    got = coarse(many, levels)
    if levels > 1:
        factor = (5000.0 / 1e-3) ** (1 / (levels - 1))  # each bin spans this ratio
        edges = 1e-3 * factor ** np.arange(1, levels - 1)  # the bins' upper ends but the last
        want = np.where(many > 0, np.searchsorted(edges, many, side="right") + 1, 0)
        close = np.isclose(many[:, None], edges[None, :], rtol=1e-9).any(axis=1)
        np.testing.assert_array_equal(got[~close], want[~close])  # an edge itself: rounding
        assert got[0] == 1 and got[1] == levels - 1 and (got[many == 0] == 0).all()
        for b in range(1, levels):
            inside = many[got == b]
            assert inside.size == 0 or inside.max() <= inside.min() * factor * (1 + 1e-9)
    order = np.argsort(many, kind="stable")
    assert (np.diff(got[order]) >= 0).all()
    np.testing.assert_array_equal(coarse(np.zeros(50), levels), np.zeros(50))
    one = np.array([0.0, 1500.0, 1500.0])  # one load: its log spans nothing (no 0 / 0)
    want_one = one if levels > 1 else np.zeros(3)  # a single level holds every group
    np.testing.assert_array_equal(coarse(one, levels), want_one)
    exactly = np.arange(levels) ** 2 * 7.0  # exactly ``levels`` values: kept, not binned
    np.testing.assert_array_equal(coarse(exactly, levels), exactly)


def _audio_case(rng: np.random.Generator, n_groups: int, d: int):
    """Groups of 1-3 samples, a third of the samples with one padded recording (1,500)."""
    group_of, loads = _case(rng, n_groups, d)
    audio = np.where(rng.random(group_of.size) < 0.35, 1500.0, 0.0)
    # the cost in small units (a calibration in seconds): its mean below 1 still normalizes it
    return group_of, {**loads, "audio_tokens": audio, "audio_cost": audio * 2e-5}


AUDIO = (("audio_tokens", "audio_cost"),)


@pytest.mark.parametrize("seed", range(10))
def test_an_audio_phase_orders_steps_first_and_weighs_in_the_last_step(seed):
    """With another encoder: a full step's groups hold the same coarse audio load (the sort's
    first key: whole recordings here), and the last step's LPT weighs its cost beside the
    vision and the LLM costs (each over its mean)."""
    d = 3
    rng = np.random.default_rng(seed)
    n_groups = 5 * d + 2
    group_of, loads = _audio_case(rng, n_groups, d)
    a = assign_steps(
        group_of,
        n_groups,
        loads,
        nodes=1,
        gpus_per_node=d,
        rng=np.random.default_rng(0),
        extra=AUDIO,
    )
    ga = np.bincount(group_of, weights=loads["audio_tokens"], minlength=n_groups)
    full = np.flatnonzero((a.step[:n_groups] >= 0) & (a.step[:n_groups] < a.n_steps - 1))
    for s in range(a.n_steps - 1):  # a step is a run of the audio order: none between
        members = np.flatnonzero(a.step[:n_groups] == s)
        lo, hi = ga[members].min(), ga[members].max()
        others = np.setdiff1d(full, members)
        assert not ((ga[others] > lo) & (ga[others] < hi)).any()
    members = np.flatnonzero(np.isin(a.group_of, a.last_step_groups))
    w = sum(loads[k] / max(loads[k].mean(), 1e-12) for k in ("vit_cost", "audio_cost", "llm_cost"))
    want = a.last_step_groups[lpt_reference(w, members, d)]
    np.testing.assert_array_equal(a.group_of[members], want)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("steps", [5, 6])
def test_refined_steps_keep_their_samples_and_caps_and_even_every_phase(seed, steps):
    """``caps`` given: samples move only between the groups of their own step, no group passes
    a cap it was under, and the steps come out at least as even in every phase together (the
    weighted sum of squares per step never rises)."""
    d = 4
    rng = np.random.default_rng(seed)
    n_groups = steps * d  # an odd and an even count of steps
    group_of, loads = _audio_case(rng, n_groups, d)
    caps = np.array([40_000, 6_000, 20_000])
    kw = dict(nodes=2, gpus_per_node=2, extra=AUDIO)
    plain = assign_steps(group_of, n_groups, loads, rng=np.random.default_rng(1), **kw)
    refined = assign_steps(group_of, n_groups, loads, rng=np.random.default_rng(1), caps=caps, **kw)
    np.testing.assert_array_equal(plain.step, refined.step)
    np.testing.assert_array_equal(plain.step[plain.group_of], refined.step[refined.group_of])
    keys = ("vit_tokens", "audio_tokens", "llm_tokens")
    moved = plain.group_of != refined.group_of
    assert moved.any()
    before, after = (
        np.stack(
            [np.bincount(a.group_of, weights=loads[k], minlength=a.step.size) for k in keys], 1
        )
        for a in (plain, refined)
    )
    assert (after <= np.maximum(caps, before)).all()
    from balancing import _kernels as K

    x = np.stack([loads[k] for k in keys], 1).astype(np.int64)
    for s in range(plain.n_steps):
        g = np.flatnonzero(plain.step == s)
        w = np.divide(len(g), before[g].sum(0), out=np.zeros(3), where=before[g].sum(0) > 0)
        assert ((after[g] * w) ** 2).sum() <= ((before[g] * w) ** 2).sum() + 1e-9
        # every step, the last too, was refined to the end: the kernel finds nothing more
        mine = np.flatnonzero(np.isin(refined.group_of, g))
        slot = np.searchsorted(g, refined.group_of[mine])
        assert K._nb_refine_step(x[mine], slot, g.size, caps, 1 << 20) == 0, s


@pytest.mark.parametrize("distinct", [15, 16, 17])
def test_coarse_default_keeps_sixteen_values_and_bins_seventeen(distinct):
    """The default ``COARSE_LEVELS`` (16) at, below and above: a load of at most 16 distinct
    values (padded windows) is its own sort key, one of 17 is binned (into at most 16 levels)."""
    from balancing.steps import COARSE_LEVELS, coarse

    assert COARSE_LEVELS == 16
    x = np.arange(distinct, dtype=np.float64) * 1500.0
    got = coarse(x)
    if distinct <= 16:
        np.testing.assert_array_equal(got, x)
    else:
        assert np.unique(got).size <= 16 and got.max() == 15


def test_the_step_helpers_refuse_what_they_cannot_mean():
    """``place_steps`` takes its layout by keyword (a positional 8, 1 would swap nodes and
    ranks unseen); ``last_step_bins`` takes one mean per phase's costs (a missing mean would
    weigh a phase in raw units)."""
    from balancing.steps import last_step_bins, place_steps

    sums = [np.ones(4), np.ones(4)]
    by_step = np.arange(4).reshape(1, 4)
    with pytest.raises(TypeError):
        place_steps(sums, by_step, 2, 2)
    node, local = place_steps(sums, by_step, nodes=2, gpus_per_node=2)
    assert sorted(zip(node.tolist(), local.tolist(), strict=True)) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    members = np.arange(3)
    with pytest.raises(ValueError):
        last_step_bins(members, [np.ones(3), np.ones(3)], [1.0], 2)
