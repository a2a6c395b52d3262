"""Every sample's load in every phase a plan balances, from a cost table: the one place that
reads a table's phases for balancing (fresh plans, a night's incremental plan, the reports).

A table's video frames are first folded into the vision phase where its metadata says the
vision tower runs them (:func:`~equishard.contracts.shared_tower.fold_shared_towers`). Then
each phase gives its tokens and its modeled cost (:mod:`balancing.cost_model`) under the keys
the plan's statistics use: ``vit_tokens``/``vit_cost``, ``audio_tokens``/``audio_cost`` for a
table with recordings, ``llm_tokens``/``llm_cost``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from balancing.cost_model import CostModel, phase_costs, sample_costs
from equishard.contracts.columns import LLM_TOKENS, VIT_TOKENS
from equishard.contracts.phases import VIDEO, VISION, Phase, check_balanced, encoder_phases
from equishard.contracts.shared_tower import fold_shared_towers, is_folded

__all__ = ["SampleLoads", "sample_loads"]


@dataclass(slots=True)
class SampleLoads:
    """``loads``: float64 per sample under each key; ``others``: the encoder phases beside the
    vision tower (audio), in the cost table's order; ``table``: the table as balanced (folded)."""

    loads: dict[str, np.ndarray]
    others: tuple[Phase, ...]
    table: pa.Table

    @property
    def extra_keys(self) -> tuple[tuple[str, str], ...]:
        """(tokens key, cost key) of each other encoder phase, as ``assign_steps`` takes them."""
        return tuple((p.tokens, cost_key(p)) for p in self.others)

    def tokens(self, key: str) -> np.ndarray:
        """A phase's tokens as int64 (what ISF caps)."""
        return self.table.column(key).to_numpy().astype(np.int64, copy=False)

    @property
    def has_media(self) -> bool:
        """Does the table hold videos (folded into the vision phase) or recordings?"""
        folded = VIDEO.tokens not in self.table.column_names and is_folded(self.table)
        return bool(self.others) or folded

    def extra_tokens(self) -> np.ndarray | None:
        """The other encoder phases' tokens, shape (n, phases); None for vision + LLM only."""
        if not self.others:
            return None
        return np.stack([self.tokens(p.tokens) for p in self.others], axis=1)


def cost_key(phase: Phase) -> str:
    """The loads' key of a phase's modeled cost (``vit_cost`` for the vision tower)."""
    return "vit_cost" if phase is VISION else f"{phase.name}_cost"


def sample_loads(table: pa.Table, model: CostModel, where: str = "the cost table") -> SampleLoads:
    """The loads of every row (see the module); a ``ValueError`` naming ``where`` for a phase
    balancing does not take."""
    table = fold_shared_towers(table)  # video frames the vision tower runs: its load
    phases = encoder_phases(table.column_names)
    check_balanced(phases, where)
    vc, tc = sample_costs(table, model)
    loads = {
        VIT_TOKENS: table.column(VIT_TOKENS).to_numpy().astype(np.float64),
        LLM_TOKENS: table.column(LLM_TOKENS).to_numpy().astype(np.float64),
        "vit_cost": vc,
        "llm_cost": tc,
    }
    others = tuple(p for p in phases if p is not VISION)
    for p in others:
        loads[p.tokens] = table.column(p.tokens).to_numpy().astype(np.float64)
        loads[cost_key(p)] = phase_costs(table, p, model)
    return SampleLoads(loads=loads, others=others, table=table)
