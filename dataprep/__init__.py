"""dataprep: read VLM datasets and measure every sample's vision and text cost.

Names are imported on first use (PEP 562): ``dataprep.errors`` and the other light modules that
the loader needs load without the prep pipeline (pyarrow, numba, the readers, the policies), so a
training process that only streams shards starts fast.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and the docs site (griffe) read; no import at run time
    from dataprep.demo import make_demo
    from dataprep.errors import DataprepError, ErrorRateExceeded, SampleRejected
    from dataprep.merge import merge_cost_tables
    from dataprep.policies import FixedPolicy, InternVLPolicy, Qwen2VLPolicy, parse_vision_policy
    from dataprep.policies.anyres import OneVisionPolicy
    from dataprep.prep import PrepConfig, PrepResult, run_prep
    from equishard.contracts.cost_table import (
        COST_SCHEMA,
        ERRORS_SCHEMA,
        errors_path,
        read_cost_table,
        table_metadata,
    )

_LAZY = {
    "COST_SCHEMA": "equishard.contracts.cost_table",
    "ERRORS_SCHEMA": "equishard.contracts.cost_table",
    "errors_path": "equishard.contracts.cost_table",
    "read_cost_table": "equishard.contracts.cost_table",
    "table_metadata": "equishard.contracts.cost_table",
    "make_demo": "dataprep.demo",
    "DataprepError": "dataprep.errors",
    "ErrorRateExceeded": "dataprep.errors",
    "SampleRejected": "dataprep.errors",
    "merge_cost_tables": "dataprep.merge",
    "FixedPolicy": "dataprep.policies",
    "InternVLPolicy": "dataprep.policies",
    "Qwen2VLPolicy": "dataprep.policies",
    "parse_vision_policy": "dataprep.policies",
    "OneVisionPolicy": "dataprep.policies.anyres",
    "PrepConfig": "dataprep.prep",
    "PrepResult": "dataprep.prep",
    "run_prep": "dataprep.prep",
}

__all__ = [
    "COST_SCHEMA",
    "ERRORS_SCHEMA",
    "DataprepError",
    "ErrorRateExceeded",
    "FixedPolicy",
    "InternVLPolicy",
    "OneVisionPolicy",
    "PrepConfig",
    "PrepResult",
    "Qwen2VLPolicy",
    "SampleRejected",
    "errors_path",
    "make_demo",
    "merge_cost_tables",
    "parse_vision_policy",
    "read_cost_table",
    "run_prep",
    "table_metadata",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dataprep' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
