"""Simulated 8-rank DP on one device: run each rank's share of a step for real, take the slowest
rank as the step time. Three ways to form the steps from the real InternVL lengths:

* random batching: 4 random samples per rank;
* ISF shards: the steps of an equishard plan (``build_plan``, DP 8, target batch 4);
* ISF + runtime redistribution: the same steps, then the vision and the LLM phase re-split over
  the 8 ranks by ``balancing.post_balance`` on each sample's modeled cost (as
  ``trainer_adapter.redistribute`` does), so a rank runs the encoder on one set of samples and
  the LLM on another.

A rank's time is measured: the VLM's encoder forward + backward over its tiles (1024 patches
each) plus the LLM forward + backward over its packed tokens (image tokens included), best of
two runs, one thread. Efficiency = sum over steps of the mean rank time / sum of the max.
"""

from __future__ import annotations

import numpy as np
import torch

from bench._timing import Memo, best_time

RANKS, BATCH, STEPS = 8, 4, 12


def _timer(model, device):
    cfg = model.cfg
    memo = Memo()

    def vit(tiles: int) -> float:
        if tiles == 0:
            return 0.0

        def run():
            patches = torch.randn(tiles * 1024, cfg.patch_dim, device=device)
            hw = torch.tensor([[32, 32]] * tiles)
            return best_time(
                lambda: model.encode_images(patches, hw).square().mean().backward(), device=device
            )

        return memo(("v", tiles), run)

    def llm(lens: tuple[int, ...]) -> float:
        if not lens:
            return 0.0

        def run():
            n = int(sum(lens))
            ids = torch.randint(0, cfg.vocab_size, (n,), device=device)
            pos = torch.cat([torch.arange(x) for x in lens]).to(device)

            def once():
                x = model.llm.tok(ids) + model.llm.pos(pos)
                h = model.llm.forward_blocks(x, list(lens))
                torch.nn.functional.cross_entropy(model.llm.logits(h), ids).backward()

            return best_time(once, device=device)

        return memo(("l", tuple(sorted(lens))), run)

    return vit, llm


def _efficiency(step_times: list[np.ndarray]) -> float:
    return float(sum(t.mean() for t in step_times) / sum(t.max() for t in step_times))


def simulate(seed: int = 0, device: str = "cpu", model_size: str = "tiny") -> dict:
    from balancing import CostModel, post_balance
    from balancing.plan import BalanceConfig, build_plan
    from bench._internvl import cost_table, load_lengths
    from trainer_adapter.train.model import VisionLanguageModel, VLMConfig

    torch.set_num_threads(1)
    dev = torch.device(device)
    torch.manual_seed(seed)
    model = VisionLanguageModel(VLMConfig.preset(model_size, vocab_size=2048)).to(dev)
    vit_t, llm_t = _timer(model, dev)
    tiles, llm = load_lengths()
    rng = np.random.default_rng(seed)
    cm = CostModel.from_dims(
        vit_hidden=model.cfg.vit_hidden,
        vit_layers=model.cfg.vit_layers,
        llm_hidden=model.cfg.llm_hidden,
        llm_layers=model.cfg.llm_layers,
    )

    def rank_time(v_idx, l_idx) -> float:
        return vit_t(int(tiles[v_idx].sum())) + llm_t(tuple(int(x) for x in llm[l_idx]))

    # random batching
    rand_steps = []
    for _ in range(STEPS):
        pick = rng.choice(tiles.size, RANKS * BATCH, replace=False).reshape(RANKS, BATCH)
        rand_steps.append([pick[r] for r in range(RANKS)])
    # ISF plan over all samples; a random choice of its full steps
    plan = build_plan(
        cost_table(tiles, llm), BalanceConfig(dp=RANKS, target_batch=BATCH, seed=seed)
    ).plan
    sid = plan.column("sample_id").to_numpy(zero_copy_only=False).astype(np.int64)
    step = plan.column("step").to_numpy()
    rank = plan.column("rank").to_numpy()
    full = np.unique(step)[:-1]
    isf_steps = []
    for s in rng.choice(full, STEPS, replace=False):
        here = step == s
        isf_steps.append([sid[here & (rank == r)] for r in range(RANKS)])

    def run_steps(steps, redistribute: bool):
        out, tokens = [], 0
        for groups in steps:
            idx = np.concatenate(groups)
            tokens += int(llm[idx].sum())
            if redistribute:
                v_cost = cm.vision.alpha * tiles[idx] * 1024 + cm.vision.beta * tiles[idx] * 1024**2
                l_cost = cm.llm.alpha * llm[idx] + cm.llm.beta * llm[idx].astype(float) ** 2
                vd = post_balance(v_cost, RANKS, method="best").dest
                ld = post_balance(l_cost, RANKS, method="best").dest
                times = [rank_time(idx[vd == r], idx[ld == r]) for r in range(RANKS)]
            else:
                times = [rank_time(g, g) for g in groups]
            out.append(np.array(times))
        return out, tokens

    rows = {}
    for name, steps, redis in (
        ("random batching", rand_steps, False),
        ("ISF shards", isf_steps, False),
        ("ISF + runtime redistribution", isf_steps, True),
    ):
        st, tokens = run_steps(steps, redis)
        total_max = float(sum(t.max() for t in st))
        rows[name] = {
            "efficiency": _efficiency(st),
            "tokens_per_s": tokens / total_max,
            "step_time_ms": 1000 * total_max / len(st),
            "tokens_per_step": tokens / len(st),
        }
    return rows
