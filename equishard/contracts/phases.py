"""The phases of a training step that a sample costs, one :class:`Phase` each.

A step runs each encoder on the items of its modality (the vision tower on images and tiles, on
video frames where the family runs them through the same tower, an audio encoder on audio
windows), then the LLM on every sample's whole sequence. A sample's cost in an encoder phase is
its tokens there and the length of each sequence the encoder runs (its attention is quadratic
per sequence, or padded to the longest in a batch); in the LLM phase, its sequence length.

The cost table holds each phase's columns (:data:`ENCODER_PHASES`): ``vision`` always (the
required ``num_images``, ``vit_tokens``, ``vit_seq_lens``), ``video`` and ``audio`` where the
table has their three columns. Its metadata may say which phases prep measured (``phases``);
it must then agree with the columns. A table written before phases existed has the vision phase
and the LLM, as it always had. Balancing takes the phases in :data:`BALANCED` today and refuses
a table with any other (:func:`check_balanced`), so that no phase's cost is silently left out
of a plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from equishard.contracts.columns import (
    AUDIO_SEQ_LENS,
    AUDIO_TOKENS,
    LLM_TOKENS,
    NUM_AUDIOS,
    NUM_IMAGES,
    NUM_VIDEOS,
    VIDEO_SEQ_LENS,
    VIDEO_TOKENS,
    VIT_SEQ_LENS,
    VIT_TOKENS,
)

__all__ = [
    "AUDIO",
    "BALANCED",
    "ENCODER_PHASES",
    "LLM",
    "REPORTED",
    "VIDEO",
    "VISION",
    "Phase",
    "check_balanced",
    "encoder_phases",
]

ATTENTION = ("varlen", "padded", "causal")


@dataclass(frozen=True, kw_only=True)
class Phase:
    """One phase: ``tokens`` (the column of a sample's tokens in it), ``seq_lens`` (the column
    of each sequence's length; None for the LLM, one sequence a sample) and ``items`` (the
    column counting the sample's items of ``modality``); ``attention``: ``varlen`` (each
    sequence attends within itself: cost grows with the sum of squared lengths), ``padded``
    (a batch is padded to its longest sequence: count x longest, Whisper's encoder) or
    ``causal`` (the LLM). ``report``: its key in a plan's report (``dist_ratio_<report>``,
    ``<report>_cost``); ``label``: its name where a person reads it."""

    name: str
    modality: str
    tokens: str
    seq_lens: str | None
    items: str | None
    attention: str
    report: str = ""
    label: str = ""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION:
            raise ValueError(f"phase {self.name}: attention must be one of {ATTENTION}")
        if not (self.report and self.label):
            raise ValueError(f"phase {self.name}: give its report key and its label")

    @property
    def cost_key(self) -> str:
        """Its cost's key in a report's loads (``vit_cost``, ``audio_cost``, ``llm_cost``)."""
        return f"{self.report}_cost"

    @property
    def columns(self) -> tuple[str, ...]:
        """The cost-table columns that describe the phase."""
        return tuple(c for c in (self.items, self.tokens, self.seq_lens) if c is not None)


VISION = Phase(
    name="vision",
    modality="image",
    tokens=VIT_TOKENS,
    seq_lens=VIT_SEQ_LENS,
    items=NUM_IMAGES,
    attention="varlen",
    report="vit",
    label="vision",
)
VIDEO = Phase(
    name="video",
    modality="video",
    tokens=VIDEO_TOKENS,
    seq_lens=VIDEO_SEQ_LENS,
    items=NUM_VIDEOS,
    attention="varlen",
    report="video",
    label="video",
)
AUDIO = Phase(
    name="audio",
    modality="audio",
    tokens=AUDIO_TOKENS,
    seq_lens=AUDIO_SEQ_LENS,
    items=NUM_AUDIOS,
    attention="padded",
    report="audio",
    label="audio",
)
LLM = Phase(
    name="llm",
    modality="text",
    tokens=LLM_TOKENS,
    seq_lens=None,
    items=None,
    attention="causal",
    report="llm",
    label="LLM",
)
ENCODER_PHASES: tuple[Phase, ...] = (VISION, VIDEO, AUDIO)
BALANCED: frozenset[str] = frozenset(
    {"vision", "audio", "llm"}
)  # the phases ISF and the steps take
# the phases a plan's report, ``balance``, ``inspect`` and the HTML report show, in that order
# (a video phase is folded into vision before balancing: it is never reported apart)
REPORTED: tuple[Phase, ...] = (VISION, AUDIO, LLM)


def encoder_phases(columns: Iterable[str], recorded=None, where: str = "") -> tuple[Phase, ...]:
    """The encoder phases a cost table of these ``columns`` describes: vision always, another
    where its columns are there (all of them: a ``ValueError`` naming the missing ones for a
    phase half there). ``recorded``: the ``phases`` its metadata lists, if any (names, the LLM
    among them or not): they must be the ones the columns give."""
    names = set(columns)
    found = [VISION]
    for phase in ENCODER_PHASES[1:]:
        present = [c for c in phase.columns if c in names]
        if present and len(present) < len(phase.columns):
            missing = [c for c in phase.columns if c not in names]
            raise ValueError(
                f"{where}: the {phase.name} phase has columns {present} but not {missing}; a "
                f"phase is described by all of {list(phase.columns)}"
            )
        if present:
            found.append(phase)
    if recorded is not None:
        if not isinstance(recorded, list) or not all(isinstance(p, str) for p in recorded):
            raise ValueError(f"{where}: the metadata's phases is not a list of names")
        listed = sorted(set(recorded) - {LLM.name})
        if listed != sorted(p.name for p in found) or len(set(recorded)) != len(recorded):
            raise ValueError(
                f"{where}: the metadata lists phases {recorded} but the columns describe "
                f"{[p.name for p in found]} (and the LLM)"
            )
    return tuple(found)


def check_balanced(phases: Iterable[Phase], where: str) -> None:
    """``ValueError`` for a phase balancing does not take yet: its cost would be left out of the
    plan, and the step's straggler would be whichever rank got the most of it."""
    left = [p.name for p in phases if p.name not in BALANCED]
    if left:
        raise ValueError(
            f"{where}: the table has the {' and '.join(left)} encoder phase(s); balancing "
            f"takes the {' and '.join(sorted(BALANCED))} phases only so far, and would leave "
            "their cost out of the plan: keep those samples out of this table"
        )
