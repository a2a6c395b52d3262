"""The loader against a reference model of its sample sequence, under every order of calls a
user can make.

The model is written from the loader's contract, not from its code: an epoch is the plan's
steps in a seeded order (``numpy.random.default_rng([seed, epoch]).permutation`` of the full
steps, a short last step kept last), each step's ``dp`` groups are ``dp`` consecutive global
slots, and rank ``r`` of ``w`` reads slots ``c + r, c + r + w, ...`` from where the job
resumed (``c`` consumed slots, 0 at an epoch's start). A group is the plan's samples of one
(plan rank, plan step). Checked over random world sizes, epochs, seeds, DataLoader worker
counts, resume points, a DP size that changes at the resume, and the order of
``set_epoch`` / ``load_state_dict`` (a torchtitan-style loop calls ``load_state_dict`` first).

Planted bugs these catch: ``set_epoch`` after ``load_state_dict`` restarting the epoch (every
sample of the interrupted epoch trained twice), a resume that skips or repeats a step, another
step order than the seed gives."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shards.read.dataset import GroupDataset, RankInfo, merge_states, open_generation

ORDERS = ("set_epoch, load", "load, set_epoch", "load only")


class LoaderModel:
    """What each rank must read, from the plan table and the manifest's step count alone."""

    def __init__(self, plan_table, steps: int, dp: int, short_last: bool):
        self.steps, self.dp, self.short_last = steps, dp, short_last
        self.groups: dict[tuple[int, int], list[str]] = {}
        for sid, r, s in zip(
            plan_table["sample_id"], plan_table["rank"], plan_table["step"], strict=True
        ):
            self.groups.setdefault((int(r), int(s)), []).append(sid)

    def step_order(self, seed: int, epoch: int) -> list[int]:
        full = self.steps - 1 if self.short_last else self.steps
        order = [int(s) for s in np.random.default_rng([seed, epoch]).permutation(full)]
        return order + ([self.steps - 1] if self.short_last else [])

    def rank_steps(self, seed, epoch, rank, world, consumed=0) -> list[list[str]]:
        order = self.step_order(seed, epoch)
        total = self.steps * self.dp
        out = []
        for t in range(math.ceil((total - consumed) / world)):
            slot = consumed + t * world + rank
            if slot >= total:
                out.append([])  # past the end: an empty step keeps every rank in step
                continue
            out.append(sorted(self.groups.get((slot % self.dp, order[slot // self.dp]), [])))
        return out


def _model(generation, gen_inputs) -> LoaderModel:
    m = open_generation(generation)
    plan = pq.read_table(gen_inputs[2] / "plan.parquet").to_pydict()
    short = bool((m.report.get("last_step") or {}).get("short"))
    return LoaderModel(plan, m.steps, m.dp, short)


def _read(generation, rank, world, workers, seed, *, epoch=None, state=None, order=ORDERS[0]):
    """One rank's steps (sorted sample ids each), its workers read round-robin as a DataLoader
    does; the epoch and the resume state are given in ``order``."""
    streams = []
    for k in range(max(workers, 1)):
        info = RankInfo(rank=rank, world_size=world, worker_id=k, num_workers=max(workers, 1))
        ds = GroupDataset(generation, info, seed=seed)
        if order == "set_epoch, load":
            ds.set_epoch(epoch)
            if state is not None:
                ds.load_state_dict(state)
        elif order == "load, set_epoch":
            if state is not None:
                ds.load_state_dict(state)
            ds.set_epoch(epoch)
        else:
            ds.load_state_dict(state)
        streams.append(iter(ds))
    steps, k = [], 0
    while (b := next(streams[k % len(streams)], None)) is not None:
        steps.append(sorted(s.meta["sample_id"] for s in b["samples"]))
        k += 1
    return steps


@settings(max_examples=30, deadline=None)
@given(
    world=st.integers(1, 6),
    workers=st.integers(0, 3),
    epoch=st.integers(0, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_an_epoch_reads_what_the_model_says(generation, gen_inputs, world, workers, epoch, seed):
    model = _model(generation, gen_inputs)
    for rank in range(world):
        got = _read(generation, rank, world, workers, seed, epoch=epoch)
        assert got == model.rank_steps(seed, epoch, rank, world)


@settings(max_examples=30, deadline=None)
@given(
    world=st.integers(1, 6),
    new_world=st.integers(1, 6),
    workers=st.integers(0, 2),
    epoch=st.integers(0, 3),
    order=st.sampled_from(ORDERS),
    data=st.data(),
)
def test_a_resume_reads_the_rest_of_the_epoch_exactly_once(
    generation, gen_inputs, world, new_world, workers, epoch, order, data
):
    """Stop after some steps, save every rank's state, resume (maybe on another DP size) with
    the calls in any order: the resumed ranks read what the model says, and the epoch's samples
    are read exactly once across both parts."""
    model = _model(generation, gen_inputs)
    seed = data.draw(st.integers(0, 1000))
    n = len(model.rank_steps(seed, epoch, 0, world))
    done = data.draw(st.integers(0, n))
    states = []
    for rank in range(world):
        ds = GroupDataset(generation, RankInfo(rank=rank, world_size=world), seed=seed)
        ds.set_epoch(epoch)
        states.append(ds.state_dict(done))
    state = merge_states(states)
    consumed = min(done * world, model.steps * model.dp)
    assert state["consumed_slots"] == consumed and state["epoch"] == epoch
    before = [
        i for r in range(world) for s in model.rank_steps(seed, epoch, r, world)[:done] for i in s
    ]
    after = []
    for rank in range(new_world):
        got = _read(
            generation, rank, new_world, workers, seed, epoch=epoch, state=state, order=order
        )
        assert got == model.rank_steps(seed, epoch, rank, new_world, consumed)
        after += [i for s in got for i in s]
    everything = [i for g in model.groups.values() for i in g]
    assert sorted(before + after) == sorted(everything)


def test_the_model_is_not_the_identity(generation, gen_inputs):
    """The model's epochs differ by seed and epoch, so agreeing with it says something."""
    model = _model(generation, gen_inputs)
    assert model.steps > 3
    assert model.step_order(0, 0) != model.step_order(0, 1)
    assert model.step_order(0, 0) != model.step_order(1, 0)


@pytest.mark.parametrize(
    "key, value",
    [("epoch", -1), ("epoch", 1.5), ("epoch", True), ("epoch", 2**70), ("consumed_slots", -2),
     ("consumed_slots", "3"), ("consumed_slots", 2.0)],
)  # fmt: skip
def test_a_checkpointed_state_from_outside_is_checked(generation, key, value):
    """A loader state read back from a checkpoint is outside data: every number is a whole
    number in range, refused by name (bug: a negative or fractional epoch was taken and broke
    the schedule's seeds at the next iteration)."""
    ds = GroupDataset(generation, RankInfo(rank=0, world_size=2))
    state = {**ds.state_dict(0), key: value}
    with pytest.raises(ValueError, match=key):
        ds.load_state_dict(state)
    with pytest.raises(ValueError, match="epoch"):
        ds.set_epoch(-1)
