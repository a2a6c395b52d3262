"""Runtime balancing under FSDP2 sharded per block, as torchtitan and accelerate shard a VLM
(``fully_shard`` on each block HF names in ``_no_split_modules``, vision and decoder, then on
the model; ``set_reduce_scatter_unused_params(True)``, FSDP2's ``find_unused_parameters`` for
ranks without images). A sharded block's forward all-gathers its parameters and its backward
reduce-scatters the gradients: collectives every rank must join as often as the others. A
rank that receives no image (or no sample) in a balanced round runs a copy of one and drops
its results (``RedistributePolicy(idle_ranks="auto")``); before, it skipped the blocks and the
group hung (the scenario "sparse": one image and two samples over 4 ranks).

On 4 gloo ranks, for every tower wrapper (Qwen-style patches, tiles, Pixtral's images, NaFlex
rows, Gemma 4's patch positions) and decoders with 4-D masks, per-token inputs, deepstack and
MoE router logits: loss and gradients (FSDP2's are the group's mean: times 4) equal a single
process's over the concatenated batch, balanced and not."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.dist_helper import run_ranks
from tests.sweeps import sweep
from tests.trainer_adapter import test_hf_parity as parity

pytest.importorskip("transformers")

FAMILIES = ("qwen2vl", "internvl", "gemma3", "mistral3", "lfm2vl", "gemma4", "qwen3vl_moe")
# one launch serves both tests of a family: make test launches a dense decoder and a MoE one
SWEPT = sweep("balanced under FSDP2", FAMILIES, fast=("qwen2vl", "qwen3vl_moe"))


def sparse_layout(family: str) -> list:
    """One image (the family's first) and two samples in all: ranks 2 and 3 get none (where
    the family takes an empty row; else a short text sample each)."""
    layout = parity.LAYOUTS[family]
    image = next(s for rows in layout for s in rows if s[1] is not None)
    filler = [] if any(rows == [] for rows in layout) else [(2, None, 1)]
    return [[image], [(3, None, 2)], list(filler), list(filler)]


def shard_blocks(model) -> None:
    from torch.distributed.fsdp import fully_shard

    names = set(model._no_split_modules or ())
    for block in [m for m in model.modules() if type(m).__name__ in names]:
        fully_shard(block)
    fully_shard(model)
    model.set_reduce_scatter_unused_params(True)


def rank_step(rank, world, family, balanced, layout, checkpointing=False):
    import torch
    import torch.distributed as dist

    from trainer_adapter.hf.balance import balance_model, global_targets
    from trainer_adapter.redistribute import RedistributePolicy

    model = parity.build_model(family)
    batches = parity.make_batches(family, model, layout)
    if checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    policy = RedistributePolicy(enabled=balanced, placement="identity")
    balance_model(model, encoder=True, llm=True, policy=policy)
    shard_blocks(model)
    batch = batches[rank]
    loss = parity._step(model, batch, global_targets(batch["labels"]))
    dist.all_reduce(loss)
    params = dict(model.named_parameters())  # DTensors: each rank holds a shard
    flat = torch.cat(
        [
            (
                p.grad.full_tensor() if p.grad is not None else torch.zeros(p.shape, dtype=p.dtype)
            ).reshape(-1)
            for _, p in sorted(params.items())
        ]
    )
    inner = getattr(model, "model", model)
    tower = getattr(inner, "visual", None) or getattr(inner, "vision_tower", None)
    vision, llm = tower.last_route, parity._decoder(model).last_route
    return {
        "loss": float(loss),
        "grads": (flat * world).numpy(),  # FSDP2 averages over the group
        "moved": (vision.moved, llm.moved),
        "copies": (int(vision.copy_of.size), int(llm.copy_of.size)),
    }


def rank_scenarios(rank, world, family):
    sparse = sparse_layout(family)
    out = {
        "balanced": rank_step(rank, world, family, True, None),
        "sparse": rank_step(rank, world, family, True, sparse),
        "sparse_plain": rank_step(rank, world, family, False, sparse),
    }
    if family == "internvl":  # no image anywhere: the tower's parameters, sharded, get none
        out["no_image"] = rank_step(rank, world, family, True, parity.NO_IMAGE_LAYOUT)
    if family == "qwen2vl":  # two tower rounds (images, videos); activation checkpointing
        out["videos"] = rank_step(rank, world, family, True, parity.VIDEO_LAYOUT)
        out["checkpointing"] = rank_step(rank, world, family, True, sparse, True)
    return out


@functools.cache
def scenarios(family: str) -> dict:
    runs = run_ranks(rank_scenarios, 4, family, timeout=300)
    return {k: [r[k] for r in runs] for k in runs[0]}


def _equal_to_reference(runs, family, layout):
    ref_loss, ref_grads, _ = parity.reference(family, layout)
    atol = 1e-7 if family in parity.GEMMA4 else 1e-9  # see test_hf_parity
    for r in runs:
        assert r["loss"] == pytest.approx(ref_loss, rel=1e-6)
        np.testing.assert_allclose(r["grads"], ref_grads, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("family", SWEPT)
def test_balanced_under_fsdp2_per_block_equals_single_process(family):
    runs = scenarios(family)["balanced"]
    _equal_to_reference(runs, family, None)
    assert runs[0]["moved"][0] > 0 and runs[0]["moved"][1] > 0


@pytest.mark.parametrize("family", SWEPT)
def test_idle_ranks_run_copies_and_nobody_hangs(family):
    """One image and two samples over 4 ranks: the tower (and, where ranks hold no sample, the
    decoder) runs on copies on the idle ranks, balanced and not; the step equals one
    process's (the copies' results dropped)."""
    sparse = sparse_layout(family)
    runs = scenarios(family)
    for kind in ("sparse", "sparse_plain"):
        _equal_to_reference(runs[kind], family, sparse)
        vision_copies, llm_copies = runs[kind][0]["copies"]
        assert vision_copies > 0
        if sparse[2] == []:  # ranks 2 and 3 hold no sample
            assert llm_copies > 0
    assert runs["sparse_plain"][0]["moved"] == (0, 0)


def test_step_without_any_image_under_fsdp2():
    """No rank has an image: the tower runs nowhere (no round moves anything), its sharded
    parameters are left out of the zero that ties the skipped tower into the graph (a DTensor
    beside plain tensors would fail), and the step equals one process's."""
    runs = scenarios("internvl")["no_image"]
    _equal_to_reference(runs, "internvl", parity.NO_IMAGE_LAYOUT)
    assert runs[0]["moved"][0] == 0 and runs[0]["copies"] == (0, 0)


def test_images_and_videos_under_fsdp2():
    runs = scenarios("qwen2vl")["videos"]
    _equal_to_reference(runs, "qwen2vl", parity.VIDEO_LAYOUT)
    assert runs[0]["moved"][0] > 0


def test_activation_checkpointing_under_fsdp2():
    """Non-reentrant checkpointing (what FSDP2 runs pair it with) recomputes each block in the
    backward, copies included."""
    runs = scenarios("qwen2vl")["checkpointing"]
    _equal_to_reference(runs, "qwen2vl", sparse_layout("qwen2vl"))
    assert runs[0]["copies"][0] > 0
