"""The layout of a balanced tower's input rows comes from the ranks that bring them.

A rank with no images of its own joins each round with an empty block and receives the rows
the plan gives it into a buffer of its block's shape. Where that shape came from the tower's
config (``[0, C, image_size, image_size]`` tiles, ``[0, C*T*p*p]`` patch rows), a tower fed rows
of another layout broke: Molmo2's crops (``[n, patches, p*p*C]``) arrived reinterpreted as
images, silently wrong (same bytes per row), Kimi-K2.5's ``[N, C, p, p]`` patches as flat rows
(its Conv2d refused them), and a tower whose config has no ``image_size`` (UnlimitedOCR's)
failed on the joining rank alone, outside any agreement, while the others waited. The layout
now travels in the round's item table; ranks that bring rows of different layouts stop the
step on every rank. Checked here on small stand-in towers against the tower run alone in one
process; test_hf_tower_sweep runs the real Kimi-K2.5 and Molmo2 towers with an empty rank."""

from __future__ import annotations

import types

import pytest
import torch

from tests.dist_helper import run_ranks


class _CropsTower(torch.nn.Module):
    """Molmo2-style: ``[crops, patches, width]`` rows, a per-patch Linear and a mean over
    patches; a config with no ``image_size`` (as UnlimitedOCR's)."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(hidden_size=4, num_hidden_layers=1)
        self.proj = torch.nn.Linear(6, 4)

    def forward(self, pixel_values, **kwargs):
        x = torch.tanh(self.proj(pixel_values))
        return x, x.mean(1)


class _ConvPatchTower(torch.nn.Module):
    """Kimi-style: ``[N, C, p, p]`` patch rows into a Conv2d, then per-image attention-like
    mixing inside each image (so each image's rows depend on each other)."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(hidden_size=4, num_hidden_layers=1)
        self.patch_embed = torch.nn.Conv2d(3, 4, kernel_size=2, stride=2)

    def forward(self, hidden_states, grid_thw=None, **kwargs):
        x = self.patch_embed(hidden_states).reshape(len(hidden_states), -1)
        out, start = [], 0
        for n in grid_thw.prod(-1).tolist():
            block = x[start : start + n]
            out.append(block + block.mean(0, keepdim=True))
            start += n
        return torch.cat(out)


def _inputs(kind: str, rank: int, n: int, layout: str = "own"):
    g = torch.Generator().manual_seed(10 + rank)
    if kind == "crops":
        return (torch.randn(n, 5, 6, generator=g, dtype=torch.float64),), {}
    grid = torch.tensor([[1, 2, 1 + (i + rank) % 3] for i in range(n)], dtype=torch.int64)
    rows = torch.randn(int(grid.prod(-1).sum()), 3, 2, 2, generator=g, dtype=torch.float64)
    if layout == "flat":  # the same bytes per row, another layout
        rows = rows.reshape(len(rows), -1)
    return (rows,), {"grid_thw": grid.reshape(-1, 3)}


def _step(tower, args, kw, settle: bool):
    outs = tower(*args, **kw) if args else ()
    outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
    loss = sum(
        (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in outs
    )
    if settle:
        loss = loss + tower.equishard_settle().sum()
    tower.zero_grad()
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in tower.parameters()])
    return [o.detach() for o in outs], grads


def empty_rank_main(rank, world, kind):
    import torch.distributed as dist

    from trainer_adapter.hf.towers import balance_tiles, balance_vision
    from trainer_adapter.redistribute import RedistributePolicy

    torch.manual_seed(0)
    tower = (_CropsTower() if kind == "crops" else _ConvPatchTower()).double()
    n = (3, 0)[rank]
    args, kw = _inputs(kind, rank, n) if n else ((), {})
    ref = _step(tower, args, kw, settle=False) if n else ([], None)
    wrap = balance_tiles if kind == "crops" else balance_vision
    wrap(tower, policy=RedistributePolicy(placement="identity"))
    outs, grads = _step(tower, args, kw, settle=True)
    ref_grads = ref[1] if n else torch.zeros_like(grads)
    dist.all_reduce(ref_grads)
    dist.all_reduce(grads)
    return ref[0], outs, ref_grads, grads, tower.last_route.moved


@pytest.mark.parametrize("kind", ["crops", "conv_patches"])
def test_rank_without_images_receives_rows_of_the_senders_layout(kind):
    results = run_ranks(empty_rank_main, 2, kind, timeout=120)
    assert results[0][4] > 0, "no image moved to the empty rank: nothing was checked"
    for ref_outs, outs, ref_grads, grads, _ in results:
        assert len(outs) == len(ref_outs)
        for out, want in zip(outs, ref_outs, strict=True):
            torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grads, ref_grads, rtol=1e-12, atol=1e-12)


def mixed_layouts_main(rank, world):
    from trainer_adapter.group_errors import StepRefused
    from trainer_adapter.hf.towers import balance_vision

    torch.manual_seed(0)
    tower = _ConvPatchTower().double()
    args, kw = _inputs("conv_patches", rank, 2, layout=("own", "flat")[rank])
    balance_vision(tower)
    try:
        tower(*args, **kw)
    except StepRefused as e:
        return str(e)
    return None


def test_ranks_giving_rows_of_different_layouts_refused_on_every_rank():
    """Rank 0 gives ``[N, 3, 2, 2]`` patch rows, rank 1 the same bytes as ``[N, 12]``: moved
    rows would be read in the receiver's layout. Every rank stops, naming both shapes."""
    for message in run_ranks(mixed_layouts_main, 2, timeout=120):
        assert message is not None, "the step ran where it must be refused"
        assert "patch rows of different shapes" in message
        assert "(3, 2, 2)" in message and "(12,)" in message
