"""Runtime balancing inside Hugging Face ``transformers`` VLMs, in the user's own loop.

A wing of :mod:`trainer_adapter`: it builds on the model-agnostic core (the exchange, the
item routes, the group errors) and never on the reference trainer (:mod:`trainer_adapter.train`).
:func:`balance_model` wraps a model's vision tower, audio tower and language model
(:mod:`.balance`, with one module per kind of tower input: :mod:`.towers`, :mod:`.pixtral`,
:mod:`.naflex`, :mod:`.patch_positions`, :mod:`.audio`; the decoder in :mod:`.decoder`);
:class:`HFPacker` packs shard samples into a model's processor inputs (:mod:`.inputs`).
"""

from trainer_adapter.hf.balance import (
    balance_audio,
    balance_decoder,
    balance_model,
    balance_tiles,
    balance_vision,
    global_targets,
    paused,
)
from trainer_adapter.hf.inputs import HFPacker

__all__ = [
    "HFPacker",
    "balance_audio",
    "balance_decoder",
    "balance_model",
    "balance_tiles",
    "balance_vision",
    "global_targets",
    "paused",
]
