"""Real torch.distributed ranks (gloo) read uneven streams and never hang."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from shards.read.dataset import GroupDataset, RankInfo, open_generation
from tests.dist_helper import run_ranks


def _read(rank: int, world: int, root: str) -> list[str]:
    ds = GroupDataset(root, RankInfo(rank=rank, world_size=world))
    ids, steps = [], 0
    for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1):
        n = torch.tensor([len(batch["samples"])])
        dist.all_reduce(n)  # a collective every step: unequal step counts would hang here
        ids += [s.meta["sample_id"] for s in batch["samples"]]
        steps += 1
    counts = [None] * world
    dist.all_gather_object(counts, steps)
    assert len(set(counts)) == 1, counts
    return ids


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_with_uneven_streams_finish_and_cover_the_data(generation, world):
    m = open_generation(generation)
    got = run_ranks(_read, world, str(generation), timeout=180)
    ids = [i for r in got for i in r]
    assert len(ids) == len(set(ids)) == m.totals["samples"]
