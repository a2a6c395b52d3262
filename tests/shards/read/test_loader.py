"""The loader: exactly-once, equal step counts, seeded epochs, deterministic resume, elastic."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shards.read.collate import Collator
from shards.read.dataset import MAX_EPOCH, GroupDataset, RankInfo, merge_states, open_generation


def _ids(batch) -> list[str]:
    return [s.meta["sample_id"] for s in batch["samples"]]


def _run(gen, world, workers, *, epoch=0, state=None, seed=0, stop=None):
    """Per rank: the list of steps (each a list of sample ids), reading workers in round-robin."""
    out = {}
    for r in range(world):
        streams = []
        for k in range(max(workers, 1)):
            ds = GroupDataset(
                gen,
                RankInfo(rank=r, world_size=world, worker_id=k, num_workers=max(workers, 1)),
                seed=seed,
            )
            ds.set_epoch(epoch)
            if state is not None:
                ds.load_state_dict(state)
            streams.append(iter(ds))
        steps, k = [], 0
        while stop is None or len(steps) < stop:  # the DataLoader's round-robin over workers
            b = next(streams[k % len(streams)], None)
            if b is None:
                break
            steps.append(_ids(b))
            k += 1
        out[r] = steps
    return out


@settings(max_examples=25, deadline=None)
@given(world=st.integers(1, 7), workers=st.integers(0, 3), epoch=st.integers(0, 3))
def test_exactly_once_and_equal_steps(generation, world, workers, epoch):
    m = open_generation(generation)
    got = _run(generation, world, workers, epoch=epoch)
    all_ids = [i for steps in got.values() for step in steps for i in step]
    assert len(all_ids) == len(set(all_ids)) == m.totals["samples"]
    assert len({len(steps) for steps in got.values()}) == 1  # every rank the same number of steps


def test_same_dp_reads_own_stream_with_the_plans_groups(generation, gen_inputs):
    plan = pq.read_table(gen_inputs[2] / "plan.parquet").to_pandas()
    m = open_generation(generation)
    ds = GroupDataset(generation, RankInfo(rank=1, world_size=m.dp), shuffle=False)
    for b in ds:
        want = sorted(plan[(plan["rank"] == 1) & (plan["step"] == b["step"])].sample_id)
        assert sorted(_ids(b)) == want


def test_epochs_reshuffle_steps_but_keep_each_steps_groups(generation):
    m = open_generation(generation)
    e0 = _run(generation, m.dp, 0, epoch=0)
    e1 = _run(generation, m.dp, 0, epoch=1)
    assert e0 != e1
    steps0 = sorted(tuple(sorted(e0[r][t] for r in range(m.dp))) for t in range(len(e0[0])))
    steps1 = sorted(tuple(sorted(e1[r][t] for r in range(m.dp))) for t in range(len(e1[0])))
    assert steps0 == steps1  # the same D groups train together, in another step order


@settings(max_examples=20, deadline=None)
@given(world=st.integers(1, 6), workers=st.integers(0, 3), data=st.data())
def test_resume_any_point_any_workers_twice_equals_uninterrupted(generation, world, workers, data):
    full = _run(generation, world, 0, epoch=2)
    n = len(full[0])
    cut1 = data.draw(st.integers(0, n))
    cut2 = data.draw(st.integers(cut1, n))
    states, first = [], {}
    for r in range(world):
        ds = GroupDataset(generation, RankInfo(rank=r, world_size=world))
        ds.set_epoch(2)
        states.append(ds.state_dict(cut1))
    s1 = merge_states(states)
    part2 = _run(generation, world, workers, state=s1, stop=cut2 - cut1)
    states = []
    for r in range(world):
        ds = GroupDataset(generation, RankInfo(rank=r, world_size=world))
        ds.load_state_dict(s1)
        states.append(ds.state_dict(cut2 - cut1))
    s2 = merge_states(states)
    part3 = _run(generation, world, data.draw(st.integers(0, 3)), state=s2)
    for r in range(world):
        first[r] = full[r][:cut1]
        assert first[r] + part2[r] + part3[r] == full[r]


def test_real_dataloader_workers_and_resume(generation):
    m = open_generation(generation)
    full = [
        _ids(b)
        for b in DataLoader(
            GroupDataset(generation, RankInfo(rank=0, world_size=m.dp)),
            batch_size=None,
            num_workers=2,
        )
    ]
    ds = GroupDataset(generation, RankInfo(rank=0, world_size=m.dp))
    head = []
    for t, b in enumerate(DataLoader(ds, batch_size=None, num_workers=2)):
        head.append(_ids(b))
        if t == 4:
            break
    state = ds.state_dict(5)
    ds2 = GroupDataset(generation, RankInfo(rank=0, world_size=m.dp))
    ds2.load_state_dict(state)
    tail = [_ids(b) for b in DataLoader(ds2, batch_size=None, num_workers=1)]
    assert head + tail == full


def test_elastic_resume_with_another_dp_size(generation):
    m = open_generation(generation)
    n_old, n_new, done = 4, 3, 3
    assert n_old == m.dp
    full = _run(generation, n_old, 0, epoch=1)
    consumed = {i for r in range(n_old) for step in full[r][:done] for i in step}
    states = []
    for r in range(n_old):
        ds = GroupDataset(generation, RankInfo(rank=r, world_size=n_old))
        ds.set_epoch(1)
        states.append(ds.state_dict(done))
    rest = _run(generation, n_new, 2, state=merge_states(states))
    rest_ids = [i for r in rest.values() for step in r for i in step]
    remaining = {i for r in range(n_old) for step in full[r][done:] for i in step}
    assert len(rest_ids) == len(set(rest_ids)) and set(rest_ids) == remaining
    assert not consumed & set(rest_ids)
    with pytest.raises(ValueError, match="one per rank"):
        merge_states(states[:-1])
    bad = dict(states[1], consumed_slots=0)
    with pytest.raises(ValueError, match="disagree"):
        merge_states([states[0], bad, *states[2:]])
    # states read back from a checkpoint: a world_size of 10**12 made a list of that size
    huge = [dict(s, world_size=10**12) for s in states]
    with pytest.raises(ValueError, match="one per rank"):
        merge_states(huge)
    with pytest.raises(ValueError, match="rank must be a whole number"):
        merge_states([dict(s, rank=None) for s in states])
    with pytest.raises(ValueError, match="one per rank"):
        merge_states([dict(s, world_size="3") for s in states])
    with pytest.raises(ValueError, match="incomplete"):
        GroupDataset(generation, RankInfo(rank=0, world_size=2)).load_state_dict({"epoch": 0})


def test_collation_matches_the_cost_table(generation, gen_inputs):
    demo, cost, _ = gen_inputs
    table = pq.read_table(cost).to_pandas().set_index("sample_id")
    col = Collator(tokenizer=str(demo / "tokenizer.json"))
    ds = GroupDataset(generation, RankInfo(rank=0, world_size=4), transform=col)
    b = next(iter(ds))["samples"]
    assert b["cu_seqlens"][-1] == b["input_ids"].numel() == b["labels"].numel()
    assert (
        b["patch_cu_seqlens"][-1] == b["patches"].shape[0] and b["patches"].shape[1] == 3 * 14 * 14
    )
    for sid, llm, vit in zip(
        b["sample_ids"], b["llm_lens"].tolist(), b["vit_lens"].tolist(), strict=True
    ):
        assert (table.loc[sid].llm_tokens, table.loc[sid].vit_tokens) == (llm, vit)
    assert (b["labels"] != -100).any() and (b["labels"] == -100).any()


def test_persistent_workers_follow_set_epoch_and_resume(generation):
    m = open_generation(generation)

    def order(epoch, state=None, **kw):
        ds = GroupDataset(generation, RankInfo(rank=0, world_size=m.dp))
        ds.set_epoch(epoch)
        if state:
            ds.load_state_dict(state)
        return [_ids(b) for b in DataLoader(ds, batch_size=None, **kw)]

    ds = GroupDataset(generation, RankInfo(rank=0, world_size=m.dp))
    dl = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    seen = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        seen.append([_ids(b) for b in dl])
    assert seen[0] == order(0) and seen[1] == order(1) and seen[0] != seen[1]
    ds.load_state_dict(ds.state_dict(0) | {"epoch": 1, "consumed_slots": 3 * m.dp})
    assert [_ids(b) for b in dl] == order(1)[3:]


def test_memory_stays_flat_over_epochs(generation):
    """Reliability case 15: a reader holds no per-epoch state that grows (Python allocations
    after epoch 2 and after epoch 6 stay within a small margin)."""
    import gc
    import tracemalloc

    ds = GroupDataset(generation, RankInfo(rank=0, world_size=1), verify=True)
    tracemalloc.start()
    try:
        sizes = []
        for epoch in range(6):
            ds.set_epoch(epoch)
            n = sum(len(b["samples"]) for b in ds)
            assert n == ds.manifest.totals["samples"]
            gc.collect()
            sizes.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert sizes[-1] - sizes[1] < 256 * 1024, sizes


def test_uint8_pixels_normalize_to_the_float_collation(generation, gen_inputs):
    """Patches collated as raw bytes (what the trainer moves between ranks) are the resized
    image's own pixels, and normalized on the device they equal the float collation."""
    import io

    import numpy as np
    import torch
    from PIL import Image

    from shards.read.collate import normalize_patches

    demo, _, _ = gen_inputs
    ds = GroupDataset(generation, RankInfo(rank=0, world_size=4))
    samples = next(iter(ds))["samples"]
    tok = str(demo / "tokenizer.json")
    # a small fixed size (not the generation's policy, so its cost check is off) keeps it quick
    small = {"tokenizer": tok, "vision_policy": "fixed:56/14", "check_costs": False}
    raw = Collator(**small, pixels="uint8")(samples)
    flt = Collator(**small)(samples)
    assert raw["patches"].dtype == torch.uint8 and flt["patches"].dtype == torch.float32
    assert raw["patches"].shape == flt["patches"].shape and raw["patches"].shape[0] > 0
    assert torch.allclose(normalize_patches(raw["patches"]), flt["patches"], atol=1e-6)
    assert normalize_patches(raw["patches"], torch.bfloat16).dtype == torch.bfloat16
    first = next(s for s in samples if s.images)  # patch 0 = the resized image's top-left 14x14
    img = Image.open(io.BytesIO(first.images[0])).convert("RGB")
    pixels = np.asarray(img.resize((56, 56), Image.Resampling.BICUBIC))
    start = int(
        raw["patch_cu_seqlens"][sum(len(s.images) for s in samples[: samples.index(first)])]
    )
    assert np.array_equal(raw["patches"][start].numpy(), pixels[:14, :14].reshape(-1))
    with pytest.raises(ValueError, match="pixels"):
        Collator(tokenizer=tok, pixels="fp8")
    # a group without images keeps its mode's dtype: the ranks' patches are exchanged and
    # concatenated together, and a float block among uint8 ones would be read as normalized
    text_only = next([s] for b in ds for s in b["samples"] if not s.images)
    for col, dtype in (
        (Collator(**small, pixels="uint8"), torch.uint8),
        (Collator(**small), torch.float32),
    ):
        empty = col(text_only)["patches"]
        assert empty.shape == (0, 3 * 14 * 14) and empty.dtype == dtype


def _sizes(samples):
    """A transform whose output default_convert would change (numpy arrays)."""
    return {"ids": [s.key for s in samples], "sizes": np.array([len(s.images) for s in samples])}


def test_loader_hands_groups_over_as_the_transform_made_them(generation):
    """``ds.loader()`` reads the same groups in the same order as ``DataLoader(batch_size=None)``
    (here with two workers and a resume), without converting the transform's output; it refuses
    the settings it fixes. Catches a loader that batches, reorders or converts groups."""
    m = open_generation(generation)
    rank = RankInfo(rank=1, world_size=m.dp)
    plain = list(DataLoader(GroupDataset(generation, rank, transform=_sizes), batch_size=None))
    ds = GroupDataset(generation, rank, transform=_sizes)
    got = list(ds.loader(num_workers=2))
    assert [b["samples"]["ids"] for b in got] == [b["samples"]["ids"] for b in plain]
    assert all(isinstance(b["samples"]["sizes"], np.ndarray) for b in got)
    assert all(isinstance(b["samples"]["sizes"], torch.Tensor) for b in plain)  # converted
    ds.load_state_dict(ds.state_dict(3))
    assert [b["samples"]["ids"] for b in ds.loader(num_workers=1)] == [
        b["samples"]["ids"] for b in plain[3:]
    ]
    with pytest.raises(ValueError, match="loader\\(\\) sets batch_size itself"):
        ds.loader(batch_size=4)


BAD_RANKS = {
    "worker past the workers": dict(rank=0, world_size=2, worker_id=2, num_workers=2),
    "worker without a count": dict(rank=0, world_size=2, worker_id=1),
    "count without a worker": dict(rank=0, world_size=2, num_workers=2),
    "rank a float": dict(rank=1.0, world_size=2),
    "rank a bool": dict(rank=True, world_size=2),
    "no ranks": dict(rank=0, world_size=0),
    "negative node": dict(rank=0, world_size=1, node=-1),
    "negative local rank": dict(rank=0, world_size=1, local_rank=-1),
}


@pytest.mark.parametrize("case", BAD_RANKS, ids=list(BAD_RANKS))
def test_a_rank_description_that_would_read_other_slots_is_refused(case):
    """RankInfo decides which slots a reader takes; a worker id past the worker count (or one
    given without it) read no slot at all, silently: those samples were never trained."""
    with pytest.raises(ValueError, match=r"RankInfo|rank must|worker|node"):
        RankInfo(**BAD_RANKS[case])


@pytest.mark.parametrize("saved", [True, False])
def test_a_state_resumed_with_another_shuffle_is_refused(generation, saved):
    """The order of the steps follows ``shuffle`` as well as the seed; a state saved with one
    and loaded into a loader with the other was accepted (bug: the resumed loader counted its
    consumed slots in another order, so some groups came twice and others never). The anchor:
    resumed with the same setting, before and after hold every sample once."""
    m = open_generation(generation)
    done = 2

    def run(shuffle, state=None):
        ds = GroupDataset(generation, RankInfo(rank=0, world_size=1), shuffle=shuffle)
        if state is not None:
            ds.load_state_dict(state)
        return ds, [_ids(b) for b in ds]

    ds, full = run(saved)
    state = ds.state_dict(done)
    assert state["shuffle"] is saved
    head = [i for step in full[:done] for i in step]
    _, tail = run(saved, state)
    assert sorted(head + [i for step in tail for i in step]) == sorted(
        i for step in full for i in step
    )  # the same setting: every sample once
    other = GroupDataset(generation, RankInfo(rank=0, world_size=1), shuffle=not saved)
    with pytest.raises(ValueError, match="shuffle"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle"):
        other.load_state_dict(merge_states([state]))
    assert m.steps > done


@pytest.mark.parametrize("epoch", [MAX_EPOCH - 1, MAX_EPOCH, MAX_EPOCH + 1, 2**63, -1])
def test_epoch_limit_at_below_and_above(generation, epoch):
    """set_epoch and a checkpoint's epoch take [0, 2**62]: 2**63 was accepted, then failed as
    an int64 overflow at the first step. At the limit a step is still read (its order seeded
    by the epoch)."""
    ds = GroupDataset(generation, RankInfo(rank=0, world_size=1), seed=0)
    if 0 <= epoch <= MAX_EPOCH:
        ds.set_epoch(epoch)
        assert ds.epoch == epoch and next(iter(ds))["epoch"] == epoch
        state = ds.state_dict(0)
        fresh = GroupDataset(generation, RankInfo(rank=0, world_size=1), seed=0)
        fresh.load_state_dict(state)
        assert fresh.epoch == epoch
    else:
        with pytest.raises(ValueError, match=r"epoch must be a whole number in \[0, 2\*\*62\]"):
            ds.set_epoch(epoch)
        state = {
            **GroupDataset(generation, RankInfo(rank=0, world_size=1), seed=0).state_dict(0),
            "epoch": epoch,
        }
        with pytest.raises(ValueError, match=r"loader state epoch is .* in \[0, 2\*\*62\]"):
            ds.load_state_dict(state)


def test_reading_a_plan_with_another_world_size_warns_naming_both_sizes(generation):
    """A plan for DP d read by w != d ranks: every group still once, but steps mix plan steps
    (and the short last step's empty groups become empty steps): said once, not silently."""
    import warnings

    dp = open_generation(generation).dp
    with pytest.warns(
        UserWarning, match=rf"balanced for DP {dp} and this job reads it with world size 1"
    ) as got:
        ds = GroupDataset(generation, RankInfo(rank=0, world_size=1))
    assert "--dp 1" in str(got[0].message) and str(generation) in str(got[0].message)
    assert len(ds) == ds.slots_per_epoch  # one rank runs every slot
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GroupDataset(generation, RankInfo(rank=0, world_size=dp))  # the plan's DP: no warning
