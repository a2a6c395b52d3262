"""trainer_adapter: runtime DP redistribution and pipelined training on equishard shards."""

from trainer_adapter.config import TrainConfig
from trainer_adapter.exchange import all_to_all_rows, gather_tables
from trainer_adapter.group_errors import StepRefused
from trainer_adapter.hf_balance import balance_model, global_targets, paused
from trainer_adapter.hf_inputs import HFPacker
from trainer_adapter.item_exchange import ItemRoute, plan_items
from trainer_adapter.model import VisionLanguageModel, VLMConfig
from trainer_adapter.partition import Partition, layer_count_partition, search_partition
from trainer_adapter.pipeline import SCHEDULES, plan_microbatches
from trainer_adapter.redistribute import LocalBatch, RedistributePolicy, Route, redistribute
from trainer_adapter.topology import Topology
from trainer_adapter.trainer import Trainer

__all__ = [
    "SCHEDULES",
    "HFPacker",
    "ItemRoute",
    "LocalBatch",
    "Partition",
    "RedistributePolicy",
    "Route",
    "StepRefused",
    "Topology",
    "TrainConfig",
    "Trainer",
    "VLMConfig",
    "VisionLanguageModel",
    "all_to_all_rows",
    "balance_model",
    "gather_tables",
    "global_targets",
    "layer_count_partition",
    "paused",
    "plan_items",
    "plan_microbatches",
    "redistribute",
    "search_partition",
]
