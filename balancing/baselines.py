"""The LLM-only baseline of a plan's report (OrchMLLM's ablation): the same samples balanced
by their LLM tokens alone, as a balancer that knows nothing of the encoders would, and every
phase's dist ratio and efficiency measured on it. Beside the plan's own metrics it shows what
balancing the encoder phases gains: an encoder's imbalance under the LLM-only plan over its
imbalance under the plan (``plan_quality.encoder_gain``).

It is reported for tables with an encoder phase beside the vision tower (audio), where a
balancer of two loads would leave one encoder to chance; an image + text report is as before.
"""

from __future__ import annotations

import numpy as np

from balancing.auto_params import auto_isf_params
from balancing.isf import isf_group
from balancing.plan_quality import REPORTED, extra_step_loads, metrics_of
from balancing.steps import assign_steps
from equishard.contracts.columns import LLM_TOKENS, VIT_TOKENS

__all__ = ["llm_only_metrics"]


def llm_only_metrics(
    loads: dict[str, np.ndarray],
    t_group: np.ndarray,
    *,
    target_batch: float,
    seed: int,
    slack: float,
    rounds: int,
    nodes: int,
    gpus_per_node: int,
) -> dict:
    """Metrics of the plan ISF and the step assembly make from the LLM loads ``t_group``
    alone (the encoders' loads hidden from both), measured in every phase of ``loads``."""
    none = np.zeros_like(t_group)
    params = auto_isf_params(
        none, t_group, target_batch=target_batch, seed=seed, slack=slack, rounds=rounds
    )
    rng = np.random.default_rng(seed)
    groups = isf_group(none, t_group, params, rng)
    blind = {k: loads[k] for k in (LLM_TOKENS, "llm_cost")}
    blind[VIT_TOKENS] = blind["vit_cost"] = np.zeros(t_group.size)
    a = assign_steps(
        groups.group_of,
        groups.n_groups,
        blind,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        rng=rng,
    )
    d = nodes * gpus_per_node
    rank = a.node * gpus_per_node + a.local_rank
    keys = [k for _, tokens, cost in REPORTED if tokens in loads for k in (tokens, cost)]
    step_loads = extra_step_loads(a.group_of, loads, keys, a.step, rank, a.n_steps, d)
    return metrics_of(step_loads, {})
