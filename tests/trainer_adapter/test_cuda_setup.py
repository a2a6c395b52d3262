"""Where a rank's NCCL collectives run: ``collective_device`` refuses a process whose current
CUDA device is not its ``LOCAL_RANK`` on a node of several GPUs (a script without
``torch.cuda.set_device`` puts every rank on cuda:0, where NCCL hangs or fails far from the
cause). Checked with CUDA's device queries replaced, since this machine has no GPU.

Planted bug this catches: the check dropped, or comparing against the global rank."""

from __future__ import annotations

import pytest
import torch

from trainer_adapter import exchange


@pytest.fixture
def nccl(monkeypatch):
    monkeypatch.setattr(exchange.dist, "get_backend", lambda group=None: "nccl")

    def node(current: int, count: int, local: str | None, rank: str = "5"):
        monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setenv("RANK", rank)
        if local is None:
            monkeypatch.delenv("LOCAL_RANK", raising=False)
        else:
            monkeypatch.setenv("LOCAL_RANK", local)

    return node


def test_a_rank_left_on_cuda0_is_refused_with_the_fix(nccl):
    nccl(current=0, count=8, local="3")
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=3 .* cuda:0.*set_device"):
        exchange.collective_device()


@pytest.mark.parametrize(
    "current,count,local",
    [(3, 8, "3"), (0, 1, "3"), (0, 8, None), (1, 2, "1")],
)
def test_set_device_one_gpu_per_process_or_no_launcher_pass(nccl, current, count, local):
    """set_device(LOCAL_RANK) done; one visible GPU per process (CUDA_VISIBLE_DEVICES);
    no torchrun variables at all."""
    nccl(current=current, count=count, local=local)
    assert exchange.collective_device() == torch.device("cuda", current)
