"""Clearing a phase out of the steps that hold only a little of it
(``balancing._kernels.sparse_steps``): equal to its plain-Python twin, whole or not at all, at
its documented threshold, and every invariant of a plan kept.

Bugs each test catches: a kernel that drifts from its definition (the twin); a step cleared in
part (more uneven than before), or one that loses, duplicates or strands a sample, or empties a
group (the invariants); a receiving step made less even, or a cap passed (the invariants); a
threshold off by its boundary (at, below, above); a plan whose boundary step keeps its few
images (the plan-level case, against the dist ratio computed here).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancing import _reference as R
from balancing._kernels.sparse_steps import CLEAR_ABOVE, _nb_clear_sparse
from balancing.metrics import step_dist_ratios
from balancing.steps import clear_sparse_steps

BIG = 1 << 40


def _plan(rng, n_steps, d, per, phases):
    """``n_steps`` steps of ``d`` groups of 1..``per`` samples: vision tiles, for a third phase
    recordings, LLM tokens; some steps' groups all without vision (recordings only) but a few."""
    rows, group_of = [], []
    for g in range(n_steps * d):
        sparse = (g // d) % 3 == 0 and g % d >= int(rng.integers(1, d + 1))
        for _ in range(int(rng.integers(1, per + 1))):
            v = 0 if sparse else int(rng.integers(0, 4)) * 1024
            row = [v]
            if phases == 3:
                row.append(int(rng.integers(0, 3)) * int(rng.integers(50, 900)))
            row.append(int(rng.integers(20, 1500)) + v // 4)
            rows.append(row)
            group_of.append(g)
    x = np.array(rows, dtype=np.int64)
    by_step = np.arange(n_steps * d, dtype=np.int64).reshape(n_steps, d)
    perm = rng.permutation(n_steps * d)  # group ids in no order of their steps
    return x, perm[np.array(group_of)], perm[by_step]


def _group_loads(x, group_of, n_groups):
    out = np.zeros((n_groups, x.shape[1]))
    np.add.at(out, group_of, x)
    return out


def _run(x, group_of, by_step, q):
    n_groups = int(by_step.max()) + 1
    got = group_of.copy()
    moved = _nb_clear_sparse(x, got, by_step, q, n_groups)
    return got, moved


@pytest.mark.parametrize("seed", range(40))
def test_clearing_equals_its_twin(seed):
    rng = np.random.default_rng(seed)
    phases = 2 + seed % 2
    x, group_of, by_step = _plan(rng, int(rng.integers(2, 7)), int(rng.integers(2, 6)), 4, phases)
    n_groups = int(by_step.max()) + 1
    loads = _group_loads(x, group_of, n_groups)
    # caps from loose to tighter than some groups already are (then no group may grow there)
    q = (loads.max(axis=0) * rng.uniform(0.7, 1.5, phases)).astype(np.int64)
    got, moved = _run(x, group_of, by_step, q)
    want, want_moved = R.clear_sparse(
        x.tolist(), group_of.tolist(), by_step.tolist(), q.tolist(), n_groups
    )
    assert got.tolist() == want and moved == want_moved


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 3))
def test_clearing_keeps_every_invariant(seed, phases):
    """Every sample in one group of a step; no group left without samples; no group past a cap
    it was under, or further past one; a step that lost load cleared of a phase (none of it
    left); a step that only took items with no largest load raised and no phase less even."""
    rng = np.random.default_rng(seed)
    x, group_of, by_step = _plan(rng, int(rng.integers(2, 8)), int(rng.integers(2, 6)), 4, phases)
    n_groups = int(by_step.max()) + 1
    before = _group_loads(x, group_of, n_groups)
    q = (before.max(axis=0) * rng.uniform(0.8, 1.3, phases)).astype(np.int64)
    got, moved = _run(x, group_of, by_step, q)
    after = _group_loads(x, got, n_groups)
    assert np.isin(got, by_step.ravel()).all()
    assert (np.bincount(got, minlength=n_groups)[by_step.ravel()] > 0).all()
    assert moved == int((got != group_of).sum())
    assert (after <= np.maximum(q, before) + 1e-9).all()
    for groups in by_step:
        b, a = before[groups], after[groups]
        lost = (a.sum(axis=0) < b.sum(axis=0)).any()
        if lost:  # a source: cleared of a phase it had
            assert ((a.sum(axis=0) == 0) & (b.sum(axis=0) > 0)).any()
        elif (a.sum(axis=0) > b.sum(axis=0)).any():  # only took items: none less even
            assert (a.max(axis=0) <= b.max(axis=0)).all()
            old, new = step_dist_ratios(b.T), step_dist_ratios(a.T)
            assert (new <= old + 1e-12).all()


def _one_step_case(shares, d, room=3, receivers=2):
    """Step 0: ``d`` groups, group r with ``shares[r]`` one-tile images (280 LLM tokens each)
    and a recording (so that no group is left empty or without a phase); then ``receivers``
    steps where every group has images and a recording, group 0 the lightest in vision (4
    tiles under the step's 8) and in the LLM (room for ``room`` images under the step's
    largest load); no caps bind."""
    rows, group_of = [], []
    for r in range(d):
        rows.append([0, 300, 100])
        group_of.append(r)
        for _ in range(shares[r]):
            rows.append([1024, 0, 280])
            group_of.append(r)
    for s in range(1, receivers + 1):
        for r in range(d):
            g = s * d + r
            light = [4096, 0, 2000 - 280 * room] if r == 0 else [8192, 0, 2000]
            rows += [light, [0, 300, 100]]
            group_of += [g, g]
    x = np.array(rows, dtype=np.int64)
    by_step = np.arange((receivers + 1) * d, dtype=np.int64).reshape(receivers + 1, d)
    return x, np.array(group_of, dtype=np.int64), by_step


NO_CAPS = np.array([BIG, BIG, BIG], dtype=np.int64)


@pytest.mark.parametrize(
    ("shares", "cleared"),
    [
        ((1, 1, 1, 1, 1, 1, 1, 0), False),  # one group of 8 without: dist 0.125, below
        ((1, 1, 1, 1, 1, 1, 0, 0), False),  # two of 8: dist 0.25, the threshold itself
        ((1, 1, 1, 1, 1, 0, 0, 0), True),  # three of 8: dist 0.375, above
        ((2, 1, 0, 0, 0, 0, 0, 0), True),  # dist 1 - 3 / 16
    ],
)
def test_a_step_is_cleared_only_past_the_threshold(shares, cleared):
    """The receiving steps have room for every image (four a step, three steps): only the
    threshold decides."""
    assert CLEAR_ABOVE == 0.25
    x, group_of, by_step = _one_step_case(shares, 8, room=4, receivers=3)
    got, moved = _run(x, group_of, by_step, NO_CAPS)
    after = _group_loads(x, got, 32)
    assert bool(after[:8, 0].sum() == 0) is cleared
    assert moved == (sum(shares) if cleared else 0)
    if cleared:  # the images went to the light groups of the receiving steps, in turn
        took = (after[[8, 16, 24], 0] - 4096) // 1024
        assert took.sum() == sum(shares) and int(took.max() - took.min()) <= 1
        assert (after[8:, 0] <= 8192).all() and (after[8:, 2] <= 2100).all()


@pytest.mark.parametrize(("room", "moved"), [(2, 0), (3, 3)])
def test_a_step_is_cleared_whole_or_not_at_all(room, moved):
    """Three images to give away and one receiving step whose light group has LLM room for
    ``room`` of them (more would raise the step's largest LLM load): with room for two, none
    moves, though two could (a step cleared in part is more uneven than before)."""
    x, group_of, by_step = _one_step_case((1, 1, 1, 0, 0, 0, 0, 0), 8, room=room, receivers=1)
    got, n = _run(x, group_of, by_step, NO_CAPS)
    assert n == moved and int((got != group_of).sum()) == moved
    if not moved:
        np.testing.assert_array_equal(got, group_of)


@pytest.mark.parametrize("cap", [1, 0, -1])
def test_a_cap_binds_at_its_value(cap):
    """The LLM cap at the light group's load plus three images' tokens (+1, at, -1): at and
    above, the three move; below, none does."""
    x, group_of, by_step = _one_step_case((1, 1, 1, 0, 0, 0, 0, 0), 8, room=5, receivers=1)
    q = NO_CAPS.copy()
    q[2] = 2100 - 280 * 5 + 3 * 280 + cap
    _, n = _run(x, group_of, by_step, q)
    assert n == (3 if cap >= 0 else 0)


def test_the_short_last_step_and_a_step_without_the_phase_stay():
    """A step with a group of no samples (the short last step) is never cleared, though sparse;
    a step with no vision at all is even and stays."""
    x, group_of, by_step = _one_step_case((1, 0, 0, 0, 0, 0, 0, 0), 8)
    keep = group_of != 7  # group 7 of step 0: no samples
    _, moved = _run(x[keep], group_of[keep], by_step, NO_CAPS)
    assert moved == 0
    _, moved = _run(x, group_of, by_step, NO_CAPS)
    assert moved == 1  # the same step with its group 7: cleared
    x0 = x[x[:, 0] == 0]  # step 0 without its images: nothing to clear
    _, moved = _run(x0, group_of[x[:, 0] == 0], by_step, NO_CAPS)
    assert moved == 0


def test_clear_sparse_steps_returns_a_copy():
    x, group_of, by_step = _one_step_case((1, 1, 1, 0, 0, 0, 0, 0), 8)
    before = group_of.copy()
    out = clear_sparse_steps(group_of, by_step, [x[:, j] for j in range(3)], NO_CAPS, 24)
    assert (out != before).sum() == 3 and (group_of == before).all()


def _boundary_plan():
    """16 groups for D = 4, every group one 300-position recording (one audio level): 6 with
    no image, then 10 with 1-3 one-tile images (vision order), so that the second step holds
    two groups without vision beside two with one image each."""
    rows = []
    for g in range(16):
        rows.append((g, 0, 300, 120))
        for _ in range(0 if g < 6 else 1 + (g - 6) % 3):
            rows.append((g, 1024, 0, 300))
    a = np.array(rows, dtype=np.int64)
    group_of = a[:, 0]
    v, au, t = (a[:, j].astype(float) for j in (1, 2, 3))
    loads = {
        "vit_tokens": v,
        "vit_cost": v,
        "audio_tokens": au,
        "audio_cost": au,
        "llm_tokens": t,
        "llm_cost": t,
    }
    return group_of, loads


@pytest.mark.parametrize("clearing", [True, False])
def test_a_plans_boundary_step_gives_its_few_images_away(monkeypatch, clearing):
    """Through ``assign_steps``: the step where groups without images meet groups with one has
    a vision dist ratio of 0.5 (the bug named: it stays so without the clearing); cleared,
    every full step's vision is even or carried by every group, and no sample is lost."""
    from balancing import steps as steps_module

    if not clearing:
        monkeypatch.setattr(steps_module, "clear_sparse_steps", lambda g, *a: g)
    group_of, loads = _boundary_plan()
    a = steps_module.assign_steps(
        group_of,
        16,
        loads,
        nodes=1,
        gpus_per_node=4,
        rng=np.random.default_rng(0),
        extra=(("audio_tokens", "audio_cost"),),
        caps=np.array([BIG, BIG, BIG]),
    )
    assert a.group_of.size == group_of.size and (a.step[a.group_of] >= 0).all()
    vision = np.zeros((a.n_steps, 4))
    placed = a.step[a.group_of]
    np.add.at(vision, (placed, a.local_rank[a.group_of]), loads["vit_tokens"])
    dist = step_dist_ratios(vision)
    sparse = [(row > 0).any() and not (row > 0).all() for row in vision]
    if clearing:
        assert not any(sp and d > CLEAR_ABOVE for sp, d in zip(sparse, dist, strict=True))
        assert (vision.sum(axis=1) == 0).sum() == 2  # the six groups without images and two more
    else:
        assert any(sp and d >= 0.5 for sp, d in zip(sparse, dist, strict=True))


@pytest.mark.parametrize(
    ("phase", "other", "carried", "cleared"),
    [
        (0, 0, 300, False),  # clearing vision: the image is its group's only recording
        (0, 1, 300, True),  # ... its group holds one more position of audio: cleared
        (0, 0, 1, False),  # ... a recording of one position, the group's only one
        (0, 0, 0, True),  # ... the group has no audio at all: nothing to keep
        (1, 0, 1024, False),  # clearing audio: the recording is its group's only image
        (1, 1, 1024, True),  # ... its group holds one more vision unit: cleared
    ],
)
def test_a_group_keeps_every_other_phase_it_has(phase, other, carried, cleared):
    """Step 0's one item of ``phase`` also carries ``carried`` units of the other encoder
    phase, all of its group's load of it but ``other`` units: moving it would leave the group
    without that phase (a step of groups with and without it: the unevenness moved, not
    cleared), so the step stays; with one unit left there, or none ever, it is cleared.
    Receiving steps carry both phases everywhere."""
    d = 4
    item = [1024, 300, 280]
    item[1 - phase] = carried
    rest = [0, 0, 50]
    rest[1 - phase] = other  # the group's other sample: ``other`` units of the other phase
    rows, group_of = [item, rest], [0, 0]
    for r in range(1, d):  # the other groups: the other phase only
        filler = [0, 0, 50]
        filler[1 - phase] = 300 if phase == 0 else 1024
        rows.append(filler)
        group_of.append(r)
    for s in (1, 2):
        for r in range(d):
            scale = 1 if r == 0 else 3  # group 0 light in every phase
            rows.append([1024 * scale, 300 * scale, 300 * scale])
            group_of.append(s * d + r)
    x = np.array(rows, dtype=np.int64)
    by_step = np.arange(3 * d, dtype=np.int64).reshape(3, d)
    got, moved = _run(x, np.array(group_of, dtype=np.int64), by_step, NO_CAPS)
    assert moved == (1 if cleared else 0)
    after = _group_loads(x, got, 3 * d)
    assert bool(after[:d, phase].sum() == 0) is cleared
    if carried or other:  # no group of step 0 without the other phase
        assert (after[:d, 1 - phase] > 0).all()


def test_no_item_goes_to_a_step_without_a_phase_it_carries():
    """The only receiving step has no audio: an image carrying one audio position would raise
    its largest audio load from 0 (a new step with and without audio), so the sparse step
    stays; with a receiving step that has audio, it goes there."""
    d = 4
    rows = [[1024, 1, 280], [0, 300, 50]] + [[0, 300, 50]] * (d - 1)
    group_of = [0, 0, *range(1, d)]
    for r in range(d):  # step 1: images, no audio; group 0 light
        rows.append([1024 if r == 0 else 4096, 0, 300 if r == 0 else 2000])
        group_of.append(d + r)
    x = np.array(rows, dtype=np.int64)
    g = np.array(group_of, dtype=np.int64)
    by_step = np.arange(2 * d, dtype=np.int64).reshape(2, d)
    _, moved = _run(x, g, by_step, NO_CAPS)
    assert moved == 0
    x2 = x.copy()
    x2[-d:, 1] = 10  # step 1 with audio in every group, as much in each
    x2[-d, 1] = 5
    got, moved = _run(x2, g, by_step, NO_CAPS)
    assert moved == 1 and got[0] == d


def test_a_step_whose_every_group_carries_the_phase_is_never_cleared():
    """Step 0: a group with a single vision unit beside one of 1,024, a dist ratio of 0.5 in
    vision, yet every group carries it (nothing to clear: the refinement's work), so nothing
    moves, though step 1's light group has room for both images."""
    x = np.array(
        [[1, 0, 10], [0, 300, 40], [1024, 0, 10], [0, 300, 40], [256, 300, 200], [2048, 300, 300]],
        dtype=np.int64,
    )
    group_of = np.array([0, 0, 1, 1, 2, 3], dtype=np.int64)
    _, moved = _run(x, group_of, np.arange(4, dtype=np.int64).reshape(2, 2), NO_CAPS)
    assert moved == 0


def test_the_lightest_group_takes_the_item_whichever_its_id():
    """The receiving step's lightest group has id 0 (the ids need not follow the steps): it
    takes the image, not the heavier group after it where the image fits too."""
    d = 4
    # step 0 (groups 0-3): receiving; group 0 the lightest in vision, group 1 next: both fit
    rows = [[1024, 100, 500], [2048, 100, 500], [4096, 100, 900], [4096, 100, 900]]
    rows += [[1024, 0, 280], [0, 300, 50]] + [[0, 300, 50]] * (d - 1)  # step 1: one image
    group_of = [0, 1, 2, 3, 4, 4, 5, 6, 7]
    x = np.array(rows, dtype=np.int64)
    by_step = np.arange(2 * d, dtype=np.int64).reshape(2, d)
    got, moved = _run(x, np.array(group_of, dtype=np.int64), by_step, NO_CAPS)
    assert moved == 1 and got[4] == 0


def test_a_group_keeps_a_sample():
    """Two images without LLM tokens (a table of encoder loads alone) in one group, the rest of
    the step without images: the second would leave its group without samples, so the step
    stays."""
    d = 4
    rows = [[1024, 0, 0], [1024, 0, 0]] + [[0, 300, 50]] * (d - 1)
    group_of = [0, 0, 1, 2, 3]
    for r in range(d):
        rows.append([1024 if r == 0 else 4096, 300, 300])
        group_of.append(d + r)
    for r in range(d):
        rows.append([1024 if r == 0 else 4096, 300, 300])
        group_of.append(2 * d + r)
    x = np.array(rows, dtype=np.int64)
    by_step = np.arange(3 * d, dtype=np.int64).reshape(3, d)
    got, moved = _run(x, np.array(group_of, dtype=np.int64), by_step, NO_CAPS)
    assert moved == 0 and (got == np.array(group_of)).all()


@pytest.mark.parametrize(("third", "cleared"), [(1024, False), (1023, True)])
def test_one_unit_past_the_threshold_is_cleared(third, cleared):
    """Vision loads 1,024, 1,024, ``third`` and 0 over four groups: at 1,024 the dist ratio is
    0.25 itself (stays); one unit less puts it past (cleared): the threshold is exact."""
    d = 4
    rows = [[1024, 300, 100], [1024, 300, 100], [third, 300, 100], [0, 300, 100]]
    rows += [[0, 300, 100]] * 3  # a second sample each in groups 0-2: they keep one
    group_of = [0, 1, 2, 3, 0, 1, 2]
    for r in range(d):  # step 1: room for the three images in its light group
        rows.append([1024 if r == 0 else 8192, 900 if r == 0 else 1800, 400 if r == 0 else 800])
        group_of.append(d + r)
    x = np.array(rows, dtype=np.int64)
    by_step = np.arange(2 * d, dtype=np.int64).reshape(2, d)
    _, moved = _run(x, np.array(group_of, dtype=np.int64), by_step, NO_CAPS)
    assert moved == (3 if cleared else 0)
