"""Balanced adaptive recomputation (OmniBal §4.3, appendix A.1.1), for GPU training.

Because ISF groups and the balanced partition fix every step's input sizes, a stage's memory
need is stable, so recomputation can be switched off exactly where memory allows:

1. recompute every ViT and LLM block; run a step; the remaining memory is M_r = budget - peak;
2. switch recomputation off for k ViT blocks, run a step; then for k LLM blocks, run a step;
3. the peak differences give the memory one block saves when it is recomputed (M_v, M_t);
4. switch off as many blocks as M_r allows (the kind that saves more time per byte first), run
   a step; on out-of-memory, recompute one more block and try again, stepwise.

A trial fails when it raises ``torch.OutOfMemoryError`` *or* when its measured peak is over
``budget``. The second is the usual case: with ``budget`` below the device's memory (e.g. 90 %),
an over-optimistic estimate is caught by measurement before the allocator runs out, which
matters under pipelining, where a real OOM on one stage leaves its peers waiting on a
send/recv that never comes.

``measure`` runs one training step and returns the peak memory in bytes; by default it is
``torch.cuda.max_memory_reserved`` around the step (what the allocator holds, fragmentation
included). ``agree`` makes every rank see the same outcome (an all_reduce of a flag) so all
ranks run the same trials; before each trial the ranks also agree that every rank's estimate
fits, so a configuration one rank expects to overflow is never tried by any (a real OOM inside
a collective would leave the peers waiting). The trials should run with the optimizer's state
already allocated (:func:`prime_optimizer_state`): it is memory every later step holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "RecomputeResult",
    "adaptive_recompute",
    "cuda_peak",
    "prime_optimizer_state",
    "scaled_peak",
    "set_recompute",
]


@dataclass(frozen=True, slots=True)
class RecomputeResult:
    vit_plain: int  # ViT blocks that run without recomputation
    llm_plain: int
    remaining: float  # M_r with everything recomputed
    saving_vit: float  # M_v per block
    saving_llm: float  # M_t per block
    trials: int
    peak: float


def set_recompute(blocks: Sequence, n_plain: int) -> None:
    """The first ``n_plain`` blocks keep activations; the rest recompute them in backward."""
    for i, b in enumerate(blocks):
        b.recompute = i >= n_plain


def prime_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Allocate the optimizer's state now (Adam's moments: twice the parameters' memory) without
    changing any parameter or the first real step: one step with zero gradients and lr 0, after
    which the step counters go back to 0 (the moments of zero gradients are zeros, as fresh)."""
    saved = []
    for group in optimizer.param_groups:
        saved.append({k: group[k] for k in ("lr", "weight_decay") if k in group})
        group["lr"] = 0.0
        if "weight_decay" in group:
            group["weight_decay"] = 0.0
        for p in group["params"]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    try:
        optimizer.step()
    finally:
        for group, old in zip(optimizer.param_groups, saved, strict=True):
            group.update(old)
        optimizer.zero_grad(set_to_none=True)
    for state in optimizer.state.values():
        step = state.get("step")
        if torch.is_tensor(step):
            step.zero_()
        elif step is not None:
            state["step"] = 0


def cuda_peak(step: Callable[[], object]) -> float:
    """Peak memory the caching allocator *reserved* during ``step`` (what the device must hold:
    allocated bytes plus the allocator's fragmentation), after emptying its cache."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return float(torch.cuda.max_memory_reserved())


def scaled_peak(
    measure: Callable[[Callable[[], object]], float], static: float, ratio: float
) -> Callable[[Callable[[], object]], float]:
    """A ``measure`` that predicts the peak of a step ``ratio`` times as heavy as the one it
    runs: the memory held before the step (weights, optimizer state) stays, the rest (the
    activations) grows with the step's tokens, linearly (attention keeps no score matrix).
    The trials run on the first batch; a later one may be heavier (seen on an H100: the first
    batch's plan fitted 71.3 GiB, later steps reserved up to 77.6 GiB of a 79 GiB card), so
    the trainer plans for the largest group the generation holds."""
    if ratio < 1.0:
        raise ValueError(f"ratio must be >= 1 (the largest step over the measured), got {ratio}")

    def scaled(step: Callable[[], object]) -> float:
        peak = measure(step)
        return static + ratio * max(peak - static, 0.0)

    return scaled


def adaptive_recompute(
    step: Callable[[], object],
    vit_blocks: Sequence,
    llm_blocks: Sequence,
    budget: float,
    *,
    probe_layers: int = 1,
    time_per_layer: tuple[float, float] = (1.0, 1.0),
    safety: float = 0.9,
    measure: Callable[[Callable[[], object]], float] | None = None,
    agree: Callable[[bool], bool] = lambda oom: oom,
    max_trials: int = 64,
) -> RecomputeResult:
    """Choose how many ViT and LLM blocks run without recomputation (see the module docstring)."""
    if budget <= 0:
        raise ValueError(f"memory budget must be > 0 bytes, got {budget}")
    if measure is None:
        if not torch.cuda.is_available():
            raise ValueError("adaptive recomputation measures GPU memory: it needs a CUDA device")
        measure = cuda_peak
    nv, nt = len(vit_blocks), len(llm_blocks)

    def run(v_plain: int, t_plain: int) -> float | None:
        set_recompute(vit_blocks, v_plain)
        set_recompute(llm_blocks, t_plain)
        try:
            peak = measure(step)
            oom = peak > budget
        except torch.OutOfMemoryError:
            peak, oom = None, True
        if agree(oom):
            return None
        return peak

    base = run(0, 0)
    if base is None:
        raise RuntimeError(
            f"with every block recomputed the step needs more than the memory budget "
            f"({budget / 2**30:.2f} GiB): lower the batch caps or raise memory_fraction"
        )
    remaining = budget - base
    kv, kt = min(probe_layers, nv), min(probe_layers, nt)
    # every rank runs every trial, even with no block of a kind: ``agree`` is a collective. A
    # probe keeps a block's activations, an amount not known yet: it runs only when every rank
    # has the safety margin of the budget free, so no rank meets a real OOM mid-collective.
    if agree(remaining < (1.0 - safety) * budget):
        pv = pt = None
        trials = 1
    else:
        pv = run(kv, 0)
        pt = run(0, kt)
        trials = 3
    m_v = (pv - base) / kv if kv and pv is not None else float("inf")
    m_t = (pt - base) / kt if kt and pt is not None else float("inf")
    # Step 4: spend the free memory on the blocks that save the most time per byte
    free = remaining * safety
    v_plain = t_plain = 0
    kinds = sorted(
        [("v", m_v, time_per_layer[0], nv), ("t", m_t, time_per_layer[1], nt)],
        key=lambda k: -(k[2] / k[1]) if k[1] > 0 else -float("inf"),
    )
    for kind, cost, _, count in kinds:
        n = count if cost <= 0 else int(min(count, max(free // cost, 0)))
        free -= n * max(cost, 0)
        if kind == "v":
            v_plain = n
        else:
            t_plain = n
    peak = None

    def fewer(v: int, t: int) -> tuple[int, int]:
        """Recompute one more block, of the kind that saves more memory per block."""
        if t and (m_t >= m_v or not v):
            return v, t - 1
        return (v - 1, t) if v else (v, t)

    def predicted(v: int, t: int) -> float:
        return base + (v * m_v if v else 0.0) + (t * m_t if t else 0.0)

    while trials < max_trials:
        # agree before trying: while any rank's estimate is over the budget, every rank steps
        # back without running a step (a rank already at "all recomputed" stays there)
        for _ in range(nv + nt):  # ends at "all recomputed", whose peak was measured to fit
            if not agree(predicted(v_plain, t_plain) > budget):
                break
            v_plain, t_plain = fewer(v_plain, t_plain)
        trials += 1
        peak = run(v_plain, t_plain)
        if peak is not None:
            break
        # measured over the budget (or OOM) although the estimate fitted: step back; a rank
        # already at "all recomputed" (which fitted in the first trial) repeats it while its
        # peers fall back, so every rank runs the same number of trials
        v_plain, t_plain = fewer(v_plain, t_plain)
    if peak is None:  # out of trials: everything recomputed, which fitted in the first trial
        v_plain = t_plain = 0
        set_recompute(vit_blocks, 0)
        set_recompute(llm_blocks, 0)
    return RecomputeResult(v_plain, t_plain, remaining, m_v, m_t, trials, peak or base)
