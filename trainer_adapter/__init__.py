"""trainer_adapter: runtime DP redistribution and pipelined training on equishard shards.

The top level is the thin, model-agnostic core: :mod:`.topology` (who is where),
:mod:`.exchange` (the collectives), :mod:`.redistribute` (equishard's collated batches, with
:mod:`.phase_plan` planning each phase and :mod:`.encoder_phases` the encoder phases beyond
vision), :mod:`.item_exchange` and :mod:`.item_outputs` (any module's items, there and back) and
:mod:`.group_errors` (one rank's error raised on every rank). Two wings build on it and never
on each other: :mod:`trainer_adapter.hf` (Hugging Face models in the user's own loop) and
:mod:`trainer_adapter.train` (the reference pipelined trainer behind ``equishard train``).
"""

from trainer_adapter.encoder_phases import VISION, EncoderPhase, audio_phase
from trainer_adapter.exchange import all_to_all_rows, gather_tables
from trainer_adapter.group_errors import StepRefused
from trainer_adapter.hf import HFPacker, balance_model, global_targets, paused
from trainer_adapter.item_exchange import ItemRoute, plan_items
from trainer_adapter.redistribute import LocalBatch, RedistributePolicy, Route, redistribute
from trainer_adapter.topology import Topology
from trainer_adapter.train import (
    SCHEDULES,
    Partition,
    TrainConfig,
    Trainer,
    VisionLanguageModel,
    VLMConfig,
    layer_count_partition,
    plan_microbatches,
    search_partition,
)

__all__ = [
    "SCHEDULES",
    "VISION",
    "EncoderPhase",
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
    "audio_phase",
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
