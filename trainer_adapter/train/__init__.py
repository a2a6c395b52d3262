"""The reference pipelined trainer behind ``equishard train``: a VLM, DP x PP over
``torch.distributed.pipelining``, MMScale's microbatch ordering and adaptive recomputation.

A wing of :mod:`trainer_adapter`: it builds on the core's redistribution and never on the
Hugging Face wing (:mod:`trainer_adapter.hf`). :class:`Trainer` runs the steps (:mod:`.trainer`);
:mod:`.loop` is the per-rank entry point torchrun starts; the model is in :mod:`.model`, the
stage partition in :mod:`.partition`, the schedules in :mod:`.pipeline`.
"""

from trainer_adapter.train.config import TrainConfig
from trainer_adapter.train.model import VisionLanguageModel, VLMConfig
from trainer_adapter.train.partition import Partition, layer_count_partition, search_partition
from trainer_adapter.train.pipeline import SCHEDULES, plan_microbatches
from trainer_adapter.train.trainer import Trainer

__all__ = [
    "SCHEDULES",
    "Partition",
    "TrainConfig",
    "Trainer",
    "VLMConfig",
    "VisionLanguageModel",
    "layer_count_partition",
    "plan_microbatches",
    "search_partition",
]
