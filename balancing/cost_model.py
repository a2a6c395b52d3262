"""Modeled compute cost per phase: ``alpha * tokens + beta * sum(len^2) + gamma * sequences``.

A transformer layer spends ~24*h^2 FLOPs per token in its projections and MLP (linear in tokens)
and ~4*h*len^2 per sequence in attention (quadratic; half for causal attention). Per phase:

* vision: tokens are encoder patches; each image/tile is its own sequence (``vit_seq_lens``);
* audio (tables with the phase): tokens are encoder positions; each window or chunk the
  encoder runs is its own sequence (``audio_seq_lens``: Qwen2-Audio's padded 30-second
  window, Qwen2.5-Omni's chunks);
* LLM: each sample is one sequence of ``llm_tokens`` (packed, variable-length attention).

``alpha``/``beta`` come from model dimensions (hidden size, layers; ``gamma``, a per-sequence
constant, is 0 there) or from a calibration JSON ``{"vision": {"alpha": .., "beta": ..,
"gamma": ..}, "llm": {...}}`` (and ``"audio"`` where the data has recordings) fitted to measured
step times by ``equishard calibrate`` (:mod:`balancing.calibration`). Costs are in FLOPs (or the
calibration's seconds); only ratios matter for balance."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from balancing._kernels.tables import _nb_phase_costs, _nb_sample_costs
from equishard.common.errors import describe
from equishard.common.options import option
from equishard.common.values import check_count, is_count
from equishard.contracts.columns import LLM_TOKENS, VIT_SEQ_LENS, VIT_TOKENS
from equishard.contracts.phases import Phase

__all__ = ["CostModel", "CostModelOptions", "PhaseCost", "phase_costs", "sample_costs"]

MAX_HIDDEN, MAX_LAYERS = 1 << 24, 1 << 16  # far above any model: a typo, not a model
_COEFFICIENTS = ({"alpha", "beta"}, {"alpha", "beta", "gamma"})


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseCost:
    """One phase's cost of a sequence of ``n`` tokens: ``alpha * n + beta * n**2 + gamma``
    (``gamma``: a per-item constant, which only a calibration measures)."""

    alpha: float
    beta: float
    gamma: float = 0.0

    def __post_init__(self) -> None:
        coef = (self.alpha, self.beta, self.gamma)
        ok = all(
            isinstance(c, numbers.Real) and not isinstance(c, bool) and math.isfinite(c) and c >= 0
            for c in coef
        )
        if not ok or sum(coef) == 0 or not math.isfinite(sum(coef)):
            raise ValueError(
                f"cost coefficients must be finite numbers >= 0 and not all 0, got "
                f"{', '.join(map(repr, coef))}"
            )

    def of(self, tokens, squares, items):
        """The cost of ``items`` sequences of ``tokens`` tokens in all whose squared lengths sum
        to ``squares`` (numbers or numpy arrays of them)."""
        return self.alpha * tokens + self.beta * squares + self.gamma * items

    def describe(self) -> dict:
        """``{"alpha", "beta"}`` and ``"gamma"`` where it is not 0 (a plan report from before
        the constant existed reads the same)."""
        out = {"alpha": self.alpha, "beta": self.beta}
        return out | ({"gamma": self.gamma} if self.gamma else {})

    @classmethod
    def from_dims(cls, *, hidden: int, layers: int, causal: bool) -> PhaseCost:
        if not (is_count(hidden, 1, MAX_HIDDEN + 1) and is_count(layers, 1, MAX_LAYERS + 1)):
            raise ValueError(
                f"hidden size and layers must be whole numbers > 0, got {hidden!r}, {layers!r}"
            )
        return cls(
            alpha=24.0 * hidden * hidden * layers, beta=(2.0 if causal else 4.0) * hidden * layers
        )


def _whisper_encoder() -> PhaseCost:
    """Whisper-large-v3's encoder (Qwen2-Audio's, 1280 x 32): the default audio phase."""
    return PhaseCost.from_dims(hidden=1280, layers=32, causal=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class CostModel:
    """Cost coefficients of every phase. Defaults: InternViT-300M (1024 x 24), Whisper-large's
    encoder (1280 x 32, used where a table has audio) and a 7B LLM (4096 x 32)."""

    vision: PhaseCost = field(
        default_factory=lambda: PhaseCost.from_dims(hidden=1024, layers=24, causal=False)
    )
    llm: PhaseCost = field(
        default_factory=lambda: PhaseCost.from_dims(hidden=4096, layers=32, causal=True)
    )
    source: str = "model dimensions: vision 1024x24, llm 4096x32"
    audio: PhaseCost = field(default_factory=_whisper_encoder)

    def __post_init__(self) -> None:  # what a plan report records and a night reads back
        if not all(isinstance(p, PhaseCost) for p in (self.vision, self.llm, self.audio)):
            raise ValueError("vision, audio and llm must be PhaseCost(alpha=..., beta=...)")
        if not isinstance(self.source, str):
            raise ValueError(
                f"source must be a string saying where the costs come from, got {self.source!r}"
            )

    @classmethod
    def from_dims(
        cls,
        *,
        vit_hidden: int,
        vit_layers: int,
        llm_hidden: int,
        llm_layers: int,
        audio_hidden: int = 1280,
        audio_layers: int = 32,
    ) -> CostModel:
        audio = ""
        if (audio_hidden, audio_layers) != (1280, 32):
            audio = f", audio {audio_hidden}x{audio_layers}"
        return cls(
            vision=PhaseCost.from_dims(hidden=vit_hidden, layers=vit_layers, causal=False),
            llm=PhaseCost.from_dims(hidden=llm_hidden, layers=llm_layers, causal=True),
            audio=PhaseCost.from_dims(hidden=audio_hidden, layers=audio_layers, causal=False),
            source=f"model dimensions: vision {vit_hidden}x{vit_layers}, llm {llm_hidden}x"
            f"{llm_layers}{audio}",
        )

    @classmethod
    def from_calibration(cls, path: str | Path) -> CostModel:
        """The phases of a calibration file (:mod:`balancing.calibration_file`); its source
        names the file and its digest, so a plan records which calibration made it."""
        from balancing.calibration_file import read_calibration

        try:
            raw, digest = read_calibration(path)
            costs = {name: PhaseCost(**coef) for name, coef in raw.items()}
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ValueError(
                f"calibration file {path}: {describe(exc)}; expected what `equishard calibrate` "
                'writes, or {"vision": {"alpha": A, "beta": B}, "llm": {"alpha": A, "beta": B}} '
                'and, for data with recordings, "audio" alike'
            ) from None
        return cls(**costs, source=f"calibration {path} (sha256 {digest[:16]})")

    @classmethod
    def from_record(cls, record, where: str) -> CostModel:
        """The cost model a plan report recorded (:meth:`describe`'s form), checked: a
        ``ValueError`` naming ``where`` and the field for anything else."""
        try:
            keys = set(record) if isinstance(record, dict) else set()
            if keys not in ({"source", "vision", "llm"}, {"source", "vision", "audio", "llm"}):
                raise TypeError("expected exactly 'source', 'vision', 'llm' (and 'audio')")
            if not isinstance(record["source"], str):
                raise TypeError("'source' is not a string")
            phases = {}
            for name in sorted(keys - {"source"}):
                if not isinstance(record[name], dict) or set(record[name]) not in _COEFFICIENTS:
                    raise TypeError(f"'{name}' is not {{'alpha': A, 'beta': B (, 'gamma': C)}}")
                phases[name] = PhaseCost(**record[name])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: the recorded cost model is not valid ({exc})") from None
        return cls(**phases, source=record["source"])

    def describe(self) -> dict:
        """What a plan report records: every phase's coefficients (a report written before the
        audio phase existed has no ``audio``; :meth:`from_record` reads both)."""
        return {
            "source": self.source,
            "vision": self.vision.describe(),
            "audio": self.audio.describe(),
            "llm": self.llm.describe(),
        }

    @property
    def calibrated(self) -> bool:
        """Whether the coefficients were measured (a calibration file), not modeled."""
        return self.source.startswith("calibration ")

    def phase(self, name: str) -> PhaseCost:
        """The coefficients of the encoder phase ``name`` (``vision`` or ``audio``)."""
        return {"vision": self.vision, "audio": self.audio}[name]


def sample_costs(table: pa.Table, model: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """Modeled (vision, llm) cost of every row of a cost table, as float64 arrays."""
    col = table.column(VIT_SEQ_LENS)
    # one chunk (a table read from one file): used as it is; combine_chunks would copy 0.2 s of
    # lists at 10M rows
    col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return _nb_sample_costs(
        table.column(VIT_TOKENS).to_numpy(),
        table.column(LLM_TOKENS).to_numpy(),
        col.values.to_numpy(zero_copy_only=False),
        col.offsets.to_numpy(zero_copy_only=False),
        model.vision.alpha,
        model.vision.beta,
        model.vision.gamma,
        model.llm.alpha,
        model.llm.beta,
        model.llm.gamma,
    )


def phase_costs(table: pa.Table, phase: Phase, model: CostModel) -> np.ndarray:
    """Modeled cost of every row in one encoder ``phase`` (its tokens, and each sequence's
    length squared), as a float64 array."""
    col = table.column(phase.seq_lens)
    col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    cost = model.phase(phase.name)
    return _nb_phase_costs(
        table.column(phase.tokens).to_numpy(),
        col.values.to_numpy(zero_copy_only=False),
        col.offsets.to_numpy(zero_copy_only=False),
        cost.alpha,
        cost.beta,
        cost.gamma,
    )


@dataclass(frozen=True, kw_only=True)
class CostModelOptions:
    """How ``balance`` gets its cost model: from the model's dimensions, or from a calibration
    file measured on the hardware (which then replaces the dimensions)."""

    vit_hidden: int = field(
        default=1024, metadata=option("vision encoder hidden size (default: 1024)")
    )
    vit_layers: int = field(default=24, metadata=option("vision encoder layers (default: 24)"))
    llm_hidden: int = field(default=4096, metadata=option("LLM hidden size (default: 4096)"))
    llm_layers: int = field(default=32, metadata=option("LLM layers (default: 32)"))
    audio_hidden: int = field(
        default=1280,
        metadata=option("audio encoder hidden size, for tables with audio (default: 1280)"),
    )
    audio_layers: int = field(
        default=32, metadata=option("audio encoder layers, for tables with audio (default: 32)")
    )
    calibration: str | None = field(
        default=None,
        metadata=option("measured alpha/beta per phase instead of dimensions", metavar="JSON"),
    )

    def __post_init__(self) -> None:
        for name in ("vit_hidden", "llm_hidden", "audio_hidden"):
            check_count("--" + name.replace("_", "-"), getattr(self, name), 1, MAX_HIDDEN)
        for name in ("vit_layers", "llm_layers", "audio_layers"):
            check_count("--" + name.replace("_", "-"), getattr(self, name), 1, MAX_LAYERS)

    def build(self) -> CostModel:
        """The cost model (the calibration file read and checked here)."""
        if self.calibration:
            return CostModel.from_calibration(self.calibration)
        return CostModel.from_dims(
            vit_hidden=self.vit_hidden,
            vit_layers=self.vit_layers,
            llm_hidden=self.llm_hidden,
            llm_layers=self.llm_layers,
            audio_hidden=self.audio_hidden,
            audio_layers=self.audio_layers,
        )
