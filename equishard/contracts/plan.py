"""The plan contract: what ``equishard balance`` (or a night) writes into a plan directory and
``equishard write`` reads from it.

A plan directory holds :data:`PLAN_PARQUET` (one row per sample: its group, the group's step and
(node, local rank, rank), the group's size and loads; schema :data:`PLAN_SCHEMA`, with each
other encoder phase's loads after it: :func:`plan_schema`) and
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

__all__ = [
    "INCREMENTAL_PLAN_SCHEMA",
    "PLAN_PARQUET",
    "PLAN_REPORT",
    "PLAN_SCHEMA",
    "phase_fields",
    "plan_schema",
]

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


def phase_fields(phase) -> list[pa.Field]:
    """The plan's columns of an encoder phase beside the vision tower (the audio encoder's):
    ``group_<tokens column>`` (whole tokens) and ``group_<phase>_cost``."""
    return [
        pa.field(f"group_{phase.tokens}", pa.int64()),
        pa.field(f"group_{phase.name}_cost", pa.float64()),
    ]


def plan_schema(others=()) -> pa.Schema:
    """:data:`PLAN_SCHEMA`, then each other encoder phase's columns (``others``: the phases
    beside the vision tower a cost table has, :func:`~equishard.contracts.phases.encoder_phases`).
    A plan of an image + text table is exactly :data:`PLAN_SCHEMA`, as before phases existed."""
    return pa.schema([*PLAN_SCHEMA, *(f for p in others for f in phase_fields(p))])
