"""The tile tower wrapper on its own, against the unwrapped tower in one process: per-tile
outputs of mixed dtypes (what a tower returns under autocast: bf16 matrix products, float32
norms and embeddings) come back to their own rank with their own dtypes and values, and the
gradients of every rank's loss reach the weights as in one process."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

from tests.dist_helper import run_ranks

pytest.importorskip("transformers")

TILES = [3, 0, 1]  # per rank; rank 1 has none of its own and joins


class MixedTower(torch.nn.Module):
    """A tile tower whose outputs differ in dtype: last state in bf16, per-layer states and
    the pooled output in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.config = type("Cfg", (), {"image_size": 4, "num_channels": 2, "patch_size": 2})()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(2 * 4 * 4, 6)

    def forward(self, pixel_values, output_hidden_states=False, return_dict=True):
        h = self.proj(pixel_values.flatten(1))
        states = (
            (pixel_values.flatten(1)[:, :6].float(), h.float()) if output_hidden_states else None
        )
        return BaseModelOutputWithPooling(
            last_hidden_state=(h * 2).to(torch.bfloat16),
            pooler_output=h.float().tanh(),
            hidden_states=states,
        )


def _tiles(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(TILES[rank], 2, 4, 4, generator=g)


def _loss(out) -> torch.Tensor:
    return out.last_hidden_state.float().square().sum() + out.pooler_output.sum()


def rank_main(rank, world):
    import torch.distributed as dist

    from trainer_adapter.hf.balance import balance_tiles
    from trainer_adapter.redistribute import RedistributePolicy

    tower = balance_tiles(MixedTower(), policy=RedistributePolicy(placement="identity"))
    x = _tiles(rank)
    if len(x):
        out = tower(x, output_hidden_states=True)
        loss = _loss(out)
        got = {
            k: (v.detach().float().numpy(), str(v.dtype))
            for k, v in (("last", out.last_hidden_state), ("pooled", out.pooler_output))
        }
    else:
        loss, got = tower.equishard_join(), {}
    loss.backward()
    grad = tower.proj.weight.grad.clone()
    dist.all_reduce(grad)
    return {"got": got, "grad": grad.numpy(), "moved": tower.last_route.moved}


def test_mixed_dtype_outputs_come_home_with_their_dtypes():
    runs = run_ranks(rank_main, len(TILES))
    tower = MixedTower()
    loss = 0
    for rank, r in enumerate(runs):
        if not TILES[rank]:
            continue
        want = tower(_tiles(rank), output_hidden_states=True)
        loss = loss + _loss(want)
        assert r["got"]["last"][1] == "torch.bfloat16" and r["got"]["pooled"][1] == "torch.float32"
        np.testing.assert_array_equal(r["got"]["last"][0], want.last_hidden_state.float().detach())
        np.testing.assert_allclose(r["got"]["pooled"][0], want.pooler_output.detach(), rtol=1e-6)
    loss.backward()
    for r in runs:
        np.testing.assert_allclose(r["grad"], tower.proj.weight.grad, rtol=1e-5, atol=1e-6)
    assert runs[0]["moved"] > 0  # tiles went to the rank without its own
