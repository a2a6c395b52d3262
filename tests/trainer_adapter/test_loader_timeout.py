"""``equishard train`` reads each rank's groups through DataLoader workers; a worker stuck on one
group (a read from a hung mount blocks forever, and no storage timeout covers a local file)
used to hold its rank, and every rank waiting on it in the next collective, without end. The
run now fails after ``--loader-timeout`` seconds naming the generation and the rank."""

from __future__ import annotations

import time

import pytest

from shards import GroupDataset, RankInfo
from shards.write.writer import WriteConfig, write_generation
from tests.shards.conftest import build_inputs
from trainer_adapter.train.loop import group_batches


class StuckAfter:
    """A transform that hangs (a blocked read) from its ``n``-th group on."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def __call__(self, samples):
        self.seen += 1
        if self.seen > self.n:
            time.sleep(60)
        return samples


@pytest.fixture(scope="module")
def generation(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader-timeout")
    _, cost, plan_dir = build_inputs(root, samples=40)
    write_generation(WriteConfig(plan_dir=str(plan_dir), cost_table=str(cost), out=str(root / "g")))
    return root / "g"


def test_a_stuck_worker_fails_the_run_naming_it(generation):
    ds = GroupDataset(generation, RankInfo(rank=1, world_size=4), transform=StuckAfter(1))
    batches = group_batches(ds, workers=1, timeout=5.0)
    assert next(batches)["rank"] == 1  # the first group arrives
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"worker of rank 1 took more than 5 s for one group"):
        next(batches)
    assert time.monotonic() - t0 < 30  # the timeout, not the stuck read, ended the wait


def test_groups_within_the_timeout_are_read_epoch_after_epoch(generation):
    ds = GroupDataset(generation, RankInfo(rank=0, world_size=4), transform=StuckAfter(10**9))
    batches = group_batches(ds, workers=1, timeout=30.0)
    steps = len(ds)
    got = [next(batches) for _ in range(2 * steps)]
    assert [b["epoch"] for b in got] == [0] * steps + [1] * steps
