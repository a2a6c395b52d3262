"""Every distributed layout computes the gradient of a plain single-process forward/backward.

The reference is computed here, in the test process, with no process group: the same initial
parameters (same seed), the global batch collated in one piece, the model's modules called in
order, next-token targets shifted by this file's own loop (never across a sample boundary) and
a summed cross entropy over the global number of targets. Each layout — DP x PP = 1x1, 2x1,
4x1 (one rank empty), 2x2 with GPipe, 1F1B and interleaved 1F1B (samples cut across
microbatches, as the rows are sized by the step's mean load; and 1F1B with every sample whole),
each with and without runtime redistribution — must give the same loss and the same gradient
for every parameter (on every rank that holds it); the encoder's and projector's gradients must
not be zero, and with redistribution on, samples must really move."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.dist_helper import run_ranks

# the global batch: groups (plan rank, step) of the training generation, split unevenly
GROUPS = [(0, 0), (3, 0), (0, 1), (1, 0), (2, 0)]
SPLIT = {1: [GROUPS], 2: [GROUPS[:3], GROUPS[3:]], 4: [GROUPS[:3], GROUPS[3:4], GROUPS[4:], []]}
LAYOUTS = [  # (dp, pp, schedule, virtual stages per rank, samples may be cut across microbatches)
    (1, 1, "1f1b", 1, True),
    (2, 1, "1f1b", 1, True),
    (4, 1, "1f1b", 1, True),
    (2, 2, "gpipe", 1, True),
    (2, 2, "1f1b", 1, True),
    (2, 2, "1f1b", 1, False),
    (2, 2, "interleaved1f1b", 2, True),
]
RTOL = 2e-5  # of each parameter's largest gradient entry (float32, sums in other orders)


def _collate_and_model(gen):
    from shards import open_generation
    from trainer_adapter import TrainConfig, VLMConfig
    from trainer_adapter.train.loop import build_collator

    manifest = open_generation(gen)
    collate = build_collator(TrainConfig(shards=gen, dp=1), manifest)
    mcfg = VLMConfig.preset("tiny", vocab_size=collate.vocab_size, patch_dim=588, merge=2)
    return manifest, collate, mcfg


def _samples(manifest, groups):
    from shards import read_group

    index = manifest.group_index()
    out = []
    for r, s in groups:
        shard, g = index[(r, s)]
        out += read_group(manifest.path, shard, g)[0]
    return out


def _distributed(rank, world, gen, layouts, precision="fp32"):
    import torch.distributed as dist

    from trainer_adapter import TrainConfig, Trainer
    from trainer_adapter.train.trainer import empty_batch

    manifest, collate, mcfg = _collate_and_model(gen)
    lens = collate(_samples(manifest, GROUPS))["llm_lens"]
    total, longest = int(lens.sum()), int(lens.max())
    results = []
    for dp, pp, schedule, virtual, split, redistribute in layouts:
        cfg = TrainConfig(
            shards=gen, dp=dp, pp=pp, steps=1, schedule=schedule, microbatches=2 * pp,
            virtual_stages=virtual, redistribute=redistribute, method="lpt", seed=7,
            partition_top_k=1, split_samples=split, precision=precision,
        )  # fmt: skip
        # rows that hold what the heaviest replica reads (3 of the 5 groups), and any sample
        mb = max(longest, -(-int(0.8 * total) // cfg.n_microbatches))
        trainer = Trainer(cfg, mcfg, mb_tokens=-(-mb // 16) * 16, ranks_per_node=min(2, world))
        if trainer.stage == 0:
            batch = collate(_samples(manifest, SPLIT[dp][trainer.replica]))
        else:
            batch = empty_batch(mcfg.patch_dim, collate.image_token_id)
        for p in trainer.params:  # left by recomputation trials or a caller's own backward
            p.grad = torch.ones_like(p)
        out = trainer.forward_backward(batch)
        names = {id(p): n for n, p in trainer.model.named_parameters()}
        grads = {names[id(p)]: p.grad.detach().clone().numpy() for p in trainer.params}
        moved = sum(v["intra_node"] + v["inter_node"] for v in out["route"]["bytes"].values())
        held = sum(p.numel() for p in trainer.model.parameters())
        cut = out["pipeline"].get("cut_samples", 0)
        results.append(
            {
                "loss": out["loss"],
                "grads": grads,
                "moved": moved,
                "held": held,
                "cut": cut,
                "autocast": out["autocast"],
            }
        )
        dist.barrier()
    return results


def _reference(gen):
    """One process, no process group: the global batch through the model's modules."""
    from shards.read.collate import normalize_patches
    from trainer_adapter.train.model import VisionLanguageModel

    manifest, collate, mcfg = _collate_and_model(gen)
    b = collate(_samples(manifest, GROUPS))
    torch.manual_seed(7)
    model = VisionLanguageModel(mcfg)
    assert b["patches"].dtype == torch.uint8  # pixels travel as bytes; normalized as prep's float
    emb = model.encode_images(normalize_patches(b["patches"]), b["units_hw"])
    x = model.llm.embed(b["input_ids"], b["position_ids"], emb, b["image_token_id"])
    h = model.llm.forward_blocks(x, b["llm_lens"].tolist())
    logits = model.llm.logits(h)
    target = torch.full_like(b["labels"], -100)
    cu = b["cu_seqlens"].tolist()
    for a, z in itertools.pairwise(cu):  # token i predicts token i+1 of its sample
        target[a : z - 1] = b["labels"][a + 1 : z]
    n = int((target != -100).sum())
    loss = F.cross_entropy(logits, target, ignore_index=-100, reduction="sum") / n
    loss.backward()
    grads = {name: p.grad.detach().numpy() for name, p in model.named_parameters()}
    return float(loss.detach()), grads


@pytest.fixture(scope="module")
def reference(train_generation):
    return _reference(str(train_generation))


def _check(result, reference, layout):
    loss, grads = reference
    assert result["loss"] == pytest.approx(loss, rel=1e-5), layout
    for name, g in result["grads"].items():
        ref = grads[name]
        scale = float(np.abs(ref).max())
        err = float(np.abs(g - ref).max())
        assert err <= RTOL * scale + 1e-8, (layout, name, err, scale)
    for prefix in ("vision.", "projector."):
        held = [n for n in result["grads"] if n.startswith(prefix)]
        assert held and all(np.abs(result["grads"][n]).max() > 0 for n in held), (layout, prefix)


def test_every_layout_gives_the_single_process_gradient(train_generation, reference):
    gen = str(train_generation)
    by_world: dict[int, list] = {}
    for layout in LAYOUTS:
        for redistribute in (True, False):
            by_world.setdefault(layout[0] * layout[1], []).append((*layout, redistribute))
    for world, layouts in sorted(by_world.items()):
        per_rank = run_ranks(_distributed, world, gen, layouts, timeout=480)
        for k, layout in enumerate(layouts):
            covered: set[str] = set()
            for rank_results in per_rank:
                _check(rank_results[k], reference, layout)
                covered |= set(rank_results[k]["grads"])
            assert covered == set(reference[1]), (layout, set(reference[1]) - covered)
            moved = sum(r[k]["moved"] for r in per_rank)
            dp, pp, split, redistribute = layout[0], layout[1], layout[4], layout[5]
            # with pp > 1 these rows cannot hold the step's samples whole: cut samples are
            # covered where allowed (their attention and gradient carried across the cut)
            cut = per_rank[0][k]["cut"]
            assert (cut > 0) if (pp > 1 and split) else (cut == 0), (layout, cut)
            total = sum(g.size for g in reference[1].values())
            for rank_results in per_rank:  # PP divides the weights: a rank holds its stages only
                assert (
                    (rank_results[k]["held"] < total)
                    if pp > 1
                    else (rank_results[k]["held"] == total)
                )
            if redistribute and dp > 1:
                assert moved > 0, layout  # samples really moved


def test_pipeline_stages_under_bf16_autocast_stay_close_to_the_fp32_reference(
    train_generation, reference
):
    """PP 2 with samples cut across microbatches, bf16 autocast on the CPU (the GPU's mixed
    precision: bf16 products, fp32 weights, residuals and loss) against the single-process fp32
    gradient: close, not equal. Catches a stage or the schedule's carried activations and
    gradients losing their dtype between stages (a bf16 tensor where the schedule expects fp32
    fails the shape/dtype check, or the gradient reaches the wrong stage)."""
    layout = (2, 2, "1f1b", 1, True, False)
    per_rank = run_ranks(_distributed, 4, str(train_generation), [layout], "bf16", timeout=300)
    loss, grads = reference
    covered: set[str] = set()
    for rank_results in per_rank:
        res = rank_results[0]
        assert res["autocast"] is True and res["cut"] > 0
        assert res["loss"] == pytest.approx(loss, rel=2e-2)
        for name, g in res["grads"].items():
            ref = grads[name].ravel().astype(np.float64)
            cos = float(g.ravel() @ ref / (np.linalg.norm(g) * np.linalg.norm(ref) + 1e-30))
            assert cos > 0.98, (name, cos)
        covered |= set(res["grads"])
    assert covered == set(grads)
    bf16 = {n: g for r in per_rank for n, g in r[0]["grads"].items()}
    assert any(not np.array_equal(bf16[n], grads[n]) for n in bf16), "bf16 changed nothing"


STEPS = 10


def _trajectory(rank, world, gen, layouts):
    """Parameters after each of STEPS optimizer steps (the ones this rank holds), per layout."""
    from trainer_adapter import TrainConfig, Trainer
    from trainer_adapter.train.trainer import empty_batch

    manifest, collate, mcfg = _collate_and_model(gen)
    runs = []
    for dp, pp, schedule, virtual in layouts:
        cfg = TrainConfig(
            shards=gen, dp=dp, pp=pp, steps=STEPS, schedule=schedule, microbatches=2 * pp,
            virtual_stages=virtual, method="lpt", seed=7, lr=1e-3, partition_top_k=1,
        )  # fmt: skip
        lens = collate(_samples(manifest, [(r, s) for r in range(4) for s in range(3)]))["llm_lens"]
        trainer = Trainer(cfg, mcfg, mb_tokens=-(-int(lens.max()) * 3 // 16) * 16, ranks_per_node=1)
        names = {id(p): n for n, p in trainer.model.named_parameters()}
        history = [{names[id(p)]: p.detach().clone().numpy() for p in trainer.params}]
        for k in range(STEPS):
            if trainer.stage == 0:
                batch = collate(_samples(manifest, [(k % 4, k // 4)]))
            else:
                batch = empty_batch(mcfg.patch_dim, collate.image_token_id)
            trainer.step(batch)
            history.append({names[id(p)]: p.detach().clone().numpy() for p in trainer.params})
        runs.append(history)
    return runs


# make test-slow (CI): ten optimizer steps of every layout; make test checks one step's gradients
# (test_every_layout_gives_the_single_process_gradient)
@pytest.mark.slow
def test_pipelined_updates_follow_the_flat_run_over_ten_steps(train_generation):
    """Per-parameter update direction of every step under each schedule against pp = 1."""
    gen = str(train_generation)
    (flat,) = run_ranks(_trajectory, 1, gen, [(1, 1, "1f1b", 1)], timeout=480)[0]
    piped = [(1, 2, "gpipe", 1), (1, 2, "1f1b", 1), (1, 2, "interleaved1f1b", 2)]
    per_rank = run_ranks(_trajectory, 2, gen, piped, timeout=480)
    for k, layout in enumerate(piped):
        worst = 1.0
        for history in (per_rank[0][k], per_rank[1][k]):
            for step in range(1, STEPS + 1):
                for name, value in history[step].items():
                    mine = (value - history[step - 1][name]).ravel()
                    ref = (flat[step][name] - flat[step - 1][name]).ravel()
                    if not np.abs(ref).max() > 0:
                        continue
                    cos = float(mine @ ref / (np.linalg.norm(mine) * np.linalg.norm(ref) + 1e-30))
                    worst = min(worst, cos)
                    assert cos > 0.99, (layout, step, name, cos)
        assert worst > 0.99, (layout, worst)
