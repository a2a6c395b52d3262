"""balancing: which samples train together, offline (ISF plan) and at run time (post-balancing)."""

from balancing.auto_params import auto_isf_params
from balancing.cost_model import CostModel, PhaseCost, sample_costs
from balancing.first_call import prewarm
from balancing.isf import Groups, ISFParams, isf_group
from balancing.metrics import dist_ratio, efficiency, pad_ratio, step_dist_ratios
from balancing.nodewise import NodewiseResult, locality_balance, nodewise_permutation, volume_matrix
from balancing.plan import PLAN_SCHEMA, BalanceConfig, BalanceResult, build_plan, write_plan
from balancing.post_balance import METHODS, MemoryCapError, PostBalance, batch_loads, post_balance
from balancing.reorder import (
    PipelineTimes,
    inter_microbatch_reorder,
    intra_batch_reorder,
    pipeline_times,
)

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
