"""The plan contract: what ``equishard balance`` (or a night) writes into a plan directory and
``equishard write`` reads from it.

A plan directory holds :data:`PLAN_PARQUET` (one row per sample: its group, the group's step and
(node, local rank, rank), the group's size and loads; schema :data:`PLAN_SCHEMA`) and
:data:`PLAN_REPORT` (the balance report: parameters, counts, last step, metrics). A night's
incremental plan adds ``parent_step`` (:data:`INCREMENTAL_PLAN_SCHEMA`). The writer is
:func:`balancing.write_plan`; the reader, which checks a plan from outside against itself and the
cost table, is :func:`shards.write.plan_input.read_plan`.
"""

from __future__ import annotations

import pyarrow as pa

from equishard.contracts.columns import (
    GROUP_LLM_COST,
    GROUP_LLM_TOKENS,
    GROUP_VIT_COST,
    GROUP_VIT_TOKENS,
    SAMPLE_ID,
)

__all__ = ["INCREMENTAL_PLAN_SCHEMA", "PLAN_PARQUET", "PLAN_REPORT", "PLAN_SCHEMA"]

PLAN_PARQUET = "plan.parquet"
PLAN_REPORT = "report.json"

PLAN_SCHEMA = pa.schema(
    [
        (SAMPLE_ID, pa.string()),
        ("group_id", pa.int64()),
        ("step", pa.int64()),
        ("node", pa.int32()),
        ("local_rank", pa.int32()),
        ("rank", pa.int32()),
        ("group_flag", pa.string()),
        ("group_size", pa.int32()),
        (GROUP_VIT_TOKENS, pa.int64()),
        (GROUP_LLM_TOKENS, pa.int64()),
        (GROUP_VIT_COST, pa.float64()),
        (GROUP_LLM_COST, pa.float64()),
    ]
)
INCREMENTAL_PLAN_SCHEMA = PLAN_SCHEMA.append(pa.field("parent_step", pa.int64()))
