"""The step refinement (``balancing._kernels.step_refine``): equal to its plain-Python twin,
locally optimal by brute force, within the caps, and the plan it serves even in every phase.

Bugs each test catches: a kernel that drifts from its definition (the twin); a gain formula
that is not the change of the sum of squares, or a search that stops early or skips a
partner (brute force: the squares themselves, over every move and swap of every phase's
heaviest group); a refinement that passes a cap a trainer sizes its rows by, or loses or
duplicates a sample (the invariants).
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancing import _kernels as K
from balancing import _reference as R

SEEDS = range(40)
BIG = 1 << 20  # moves: enough for any test step to converge


def _step(rng, d, per, phases, padded_audio=True):
    """A step of ``d`` groups of about ``per`` samples: vision tiles, audio recordings (most
    samples none; 1,500 positions each when padded), LLM tokens."""
    m = d * per
    v = rng.integers(0, 6, m) * 1024
    cols = [v]
    for _ in range(phases - 2):
        has = rng.random(m) < 0.3
        cols.append(np.where(has, 1500 if padded_audio else rng.integers(100, 1500, m), 0))
    cols.append(rng.integers(20, 3000, m) + v // 4)
    x = np.stack(cols, axis=1).astype(np.int64)
    slot = np.repeat(np.arange(d), per)
    rng.shuffle(slot)
    return x, slot


def _loads(x, slot, d):
    out = np.zeros((d, x.shape[1]))
    np.add.at(out, slot, x)
    return out


def _weights(loads):
    tot = loads.sum(axis=0)
    return np.divide(loads.shape[0], tot, out=np.zeros(tot.size), where=tot > 0)


def _objective(loads, w=None):
    """The weighted sum of squared group loads (each phase over its mean per group)."""
    w = _weights(loads) if w is None else w
    return float(((loads * w) ** 2).sum())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("phases", [2, 3])
def test_refine_step_equals_its_twin(seed, phases):
    rng = np.random.default_rng(seed)
    d, per = int(rng.integers(2, 6)), int(rng.integers(1, 6))
    x, slot = _step(rng, d, per, phases, padded_audio=seed % 2 == 0)
    q = np.array([x[:, j].sum() // d + int(rng.integers(0, 3000)) for j in range(phases)])
    max_moves = BIG if seed % 4 else int(rng.integers(0, 4))  # also cut short
    got = slot.copy()
    moves = K._nb_refine_step(x, got, d, q, max_moves)
    want, want_moves = R.refine_step(x.tolist(), slot.tolist(), d, q.tolist(), max_moves)
    assert got.tolist() == want and moves == want_moves


@pytest.mark.parametrize("seed", SEEDS)
def test_refine_step_equals_its_twin_on_tiny_and_empty_phases(seed):
    """Loads of 0 to 2 units; a sparse phase (one sample of 1 unit: its weight is d, so its
    squares dominate the choice); every other seed a phase with no load at all (never a
    head: nothing to even there)."""
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 6))
    m = d * int(rng.integers(1, 4))
    x = rng.integers(0, 3, (m, 4)).astype(np.int64)
    x[:, 2] = 0
    x[int(rng.integers(0, m)), 2] = 1
    if seed % 2:
        x[:, 3] = 0
    slot = rng.integers(0, d, m).astype(np.int64)
    q = np.full(4, 1 << 30)
    got = slot.copy()
    moves = K._nb_refine_step(x, got, d, q, BIG)
    want, want_moves = R.refine_step(x.tolist(), slot.tolist(), d, q.tolist(), BIG)
    assert got.tolist() == want and moves == want_moves


@pytest.mark.parametrize(("gap", "moved"), [(6, 0), (8, 1), (10, 1)])
def test_a_move_is_made_only_past_the_threshold(gap, moved):
    """Two groups of 2,000 units between them, one phase: shifting one unit across a gap of g
    units changes the sum of squared loads (over their mean) by 2e-6 (1 - g): 1e-5 at g = 6
    (the threshold itself: not made), 1.4e-5 at g = 8 and 1.8e-5 at g = 10 (made; moving the
    1-unit sample and swapping the two large ones shift the same unit, the loads tell)."""
    heavy, light = 1000 + gap // 2, 1000 - gap // 2
    x = np.array([[heavy - 1], [1], [light]], dtype=np.int64)
    slot = np.array([0, 0, 1])
    assert K._nb_refine_step(x, slot, 2, np.array([1 << 30]), BIG) == moved
    want = [light + 1, heavy - 1] if moved else [light, heavy]
    assert sorted(_loads(x, slot, 2)[:, 0].tolist()) == want


def _caps_kept(before, after, q):
    """No group passes a cap it was under, nor grows in a phase where it was past the cap."""
    return bool((after <= np.maximum(q, before)).all())


@pytest.mark.parametrize("seed", SEEDS)
def test_refine_step_ends_where_no_move_or_swap_gains(seed):
    """Brute force with the squares themselves: at the end, no move or swap between any
    phase's heaviest group and any other group lowers the weighted sum of squares by more
    than the kernel's threshold while keeping the caps."""
    from balancing._kernels.step_refine import EPS

    rng = np.random.default_rng(seed)
    d, per = int(rng.integers(2, 5)), int(rng.integers(1, 5))
    x, slot = _step(rng, d, per, 3)
    q = np.array([x[:, j].sum() // d * 2 + 1 for j in range(3)])
    w = _weights(_loads(x, slot, d))
    K._nb_refine_step(x, slot, d, q, BIG)
    loads = _loads(x, slot, d)
    base = _objective(loads, w)
    heads = {int(np.argmax(loads[:, j] * w[j])) for j in range(3) if loads[:, j].any()}
    for a in np.flatnonzero(np.isin(slot, list(heads))):
        for b in [-1, *np.flatnonzero(slot != slot[a])]:
            for to in [r for r in range(d) if r != slot[a]] if b < 0 else [slot[b]]:
                trial = slot.copy()
                trial[a] = to
                if b >= 0:
                    trial[b] = slot[a]
                after = _loads(x, trial, d)
                if _caps_kept(loads, after, q):
                    assert _objective(after, w) >= base - EPS - 1e-9, (a, b, to)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    d=st.integers(1, 8),
    per=st.integers(1, 8),
    phases=st.integers(2, 4),
    tight=st.booleans(),
)
def test_refine_step_keeps_samples_caps_and_never_worsens(seed, d, per, phases, tight):
    """Every sample stays in exactly one of the step's groups, the objective never rises, and a
    cap holds as the definition says (``tight``: caps below some groups' loads already)."""
    rng = np.random.default_rng(seed)
    x, slot = _step(rng, d, per, phases)
    before = _loads(x, slot, d)
    q = before.max(axis=0).astype(np.int64) - (1 if tight else -1)
    q = np.maximum(q, 1)
    got = slot.copy()
    K._nb_refine_step(x, got, d, q, BIG)
    after = _loads(x, got, d)
    assert ((got >= 0) & (got < d)).all() and got.size == slot.size
    np.testing.assert_array_equal(after.sum(axis=0), before.sum(axis=0))
    w = _weights(before)
    assert _objective(after, w) <= _objective(before, w) + 1e-9
    assert _caps_kept(before, after, q)


@pytest.mark.parametrize("steps", [6, 7])
def test_refine_steps_refines_each_step_alone(steps):
    """``_nb_refine_steps`` over members grouped by step equals refining each step apart (an
    even and an odd count of steps): no sample crosses into another step, and the moves it
    reports are the steps' moves summed."""
    rng = np.random.default_rng(3)
    d, per = 4, 5
    xs, slots = zip(*(_step(rng, d, per, 3) for _ in range(steps)), strict=True)
    x = np.concatenate(xs)
    slot = np.concatenate(slots)
    perm = rng.permutation(len(x))  # the members of a step need not be contiguous rows
    x, slot = x[perm], slot[perm]
    step = np.repeat(np.arange(steps), d * per)[perm]
    members = np.argsort(step, kind="stable")
    starts = np.searchsorted(step[members], np.arange(steps + 1))
    q = np.full(3, 1 << 40)
    got = slot.copy()
    total = K._nb_refine_steps(x, members, starts, got, d, q, BIG)
    moves = 0
    for s in range(steps):
        idx = members[starts[s] : starts[s + 1]]
        alone = slot[idx].copy()
        moves += K._nb_refine_step(x[idx], alone, d, q, BIG)
        assert got[idx].tolist() == alone.tolist()
    assert total == moves > 0


@pytest.mark.parametrize("d", [2, 3])
def test_refine_step_finds_the_even_split_of_a_small_step(d):
    """Two phases of loads that split evenly in exactly one way (checked by enumerating every
    assignment): from every start the refinement ends at an exactly even step."""
    x = np.array([[3, 1], [1, 3], [2, 2], [2, 2], [3, 1], [1, 3]][: 2 * d], dtype=np.int64)
    sums = x.sum(axis=0) / d
    even = [
        a
        for a in itertools.product(range(d), repeat=len(x))
        if (_loads(x, np.array(a), d) == sums).all()
    ]
    assert even  # the instance has an even split
    for start in itertools.islice(itertools.product(range(d), repeat=len(x)), 0, None, 7):
        slot = np.array(start, dtype=np.int64)
        K._nb_refine_step(x, slot, d, np.full(2, 1 << 30), BIG)
        np.testing.assert_array_equal(_loads(x, slot, d), np.tile(sums, (d, 1)), str(start))


def test_a_phase_with_no_load_names_no_group_to_move():
    """Only a phase's heaviest group gives samples. Here the heavy group (9 units, one sample)
    cannot move under the cap of 6 and the other phase has no load at all: the refinement
    stops, although group 0 could still even itself with group 2 (a phase of zeros taken for
    one whose heaviest group is group 0 would move its 2-unit sample)."""
    x = np.array([[3, 0], [2, 0], [9, 0], [1, 0]], dtype=np.int64)
    slot = np.array([0, 0, 1, 2])
    assert K._nb_refine_step(x, slot, 3, np.array([6, 1]), BIG) == 0
    assert slot.tolist() == [0, 0, 1, 2]
    assert R.refine_step(x.tolist(), [0, 0, 1, 2], 3, [6, 1], BIG) == ([0, 0, 1, 2], 0)
