"""balancing: which samples train together, offline (ISF plan) and at run time (post-balancing).

Its names load on first use (PEP 562): a training job that imports the runtime balancer
(``post_balance``, ``nodewise_permutation``, ``prewarm``) does not import the offline planner,
its cost tables and pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_LAZY = {
    name: f"balancing.{module}"
    for module, names in {
        "auto_params": ("auto_isf_params",),
        "cost_model": ("CostModel", "PhaseCost", "sample_costs"),
        "first_call": ("prewarm",),
        "isf": ("Groups", "ISFParams", "isf_group"),
        "metrics": ("dist_ratio", "efficiency", "pad_ratio", "step_dist_ratios"),
        "nodewise": ("NodewiseResult", "locality_balance", "nodewise_permutation", "volume_matrix"),
        "plan": ("PLAN_SCHEMA", "BalanceConfig", "BalanceResult", "build_plan", "write_plan"),
        "reorder": (
            "PipelineTimes",
            "inter_microbatch_reorder",
            "intra_batch_reorder",
            "pipeline_times",
        ),
    }.items()
    for name in names
}

# the runtime balancer, imported now: its module shares the name of its function, which must be
# what ``balancing.post_balance`` is (a submodule imported later would otherwise take the name)
from balancing.post_balance import (  # noqa: E402
    METHODS,
    MemoryCapError,
    PostBalance,
    batch_loads,
    post_balance,
)

if TYPE_CHECKING:
    from balancing.auto_params import auto_isf_params
    from balancing.cost_model import CostModel, PhaseCost, sample_costs
    from balancing.first_call import prewarm
    from balancing.isf import Groups, ISFParams, isf_group
    from balancing.metrics import dist_ratio, efficiency, pad_ratio, step_dist_ratios
    from balancing.nodewise import (
        NodewiseResult,
        locality_balance,
        nodewise_permutation,
        volume_matrix,
    )
    from balancing.plan import PLAN_SCHEMA, BalanceConfig, BalanceResult, build_plan, write_plan
    from balancing.reorder import (
        PipelineTimes,
        inter_microbatch_reorder,
        intra_batch_reorder,
        pipeline_times,
    )


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'balancing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "METHODS",
    "PLAN_SCHEMA",
    "BalanceConfig",
    "BalanceResult",
    "CostModel",
    "Groups",
    "ISFParams",
    "MemoryCapError",
    "NodewiseResult",
    "PhaseCost",
    "PipelineTimes",
    "PostBalance",
    "auto_isf_params",
    "batch_loads",
    "build_plan",
    "dist_ratio",
    "efficiency",
    "inter_microbatch_reorder",
    "intra_batch_reorder",
    "isf_group",
    "locality_balance",
    "nodewise_permutation",
    "pad_ratio",
    "pipeline_times",
    "post_balance",
    "prewarm",
    "sample_costs",
    "step_dist_ratios",
    "volume_matrix",
    "write_plan",
]
