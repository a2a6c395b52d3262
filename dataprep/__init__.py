"""dataprep: read VLM datasets and measure every sample's vision and text cost."""

from dataprep.cost_table import (
    COST_SCHEMA,
    ERRORS_SCHEMA,
    errors_path,
    read_cost_table,
    table_metadata,
)
from dataprep.demo import make_demo
from dataprep.errors import DataprepError, ErrorRateExceeded, SampleRejected
from dataprep.merge import merge_cost_tables
from dataprep.policies import FixedPolicy, InternVLPolicy, Qwen2VLPolicy, parse_vision_policy
from dataprep.policies.anyres import OneVisionPolicy
from dataprep.prep import PrepConfig, PrepResult, run_prep

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
