"""The encoder phases of a collated batch, one :class:`EncoderPhase` each, for
:func:`trainer_adapter.redistribute`.

A phase reads its items from the batch under its own keys: the payload rows its encoder takes
(``patches``; ``audio_features``, one row per feature frame), how many rows each sample has,
one row per *unit* the encoder runs (an image tile's patch grid; a recording's frames) and how
many units each sample has, and the token id its outputs fill in ``input_ids``. Its cost is
that of the attention sequences its encoder runs per unit (:meth:`EncoderPhase.sequences`):

* ``grid``: a unit is one sequence of ``h * w`` patches (the ViT);
* ``chunks``: a recording's frames in chunks of ``2 * n_window`` frames, each its own sequence
  after the stem (Qwen2.5-Omni's unpadded audio encoder);
* ``window``: every recording the whole padded window of ``window_frames`` (Whisper's and
  Qwen2-Audio's padded encoder: count x longest).

:data:`VISION` is the vision tower's phase; :func:`audio_phase` makes a Whisper-style audio
encoder's from the settings prep measured the generation with (its audio rule's ``n_window``
and ``chunk_length``), so the runtime plan prices a recording as the offline plan did.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataprep.media_rules.whisper_audio import chunk_positions
from equishard.common.values import check_count

__all__ = ["VISION", "EncoderPhase", "audio_phase"]

KINDS = ("grid", "chunks", "window")


@dataclass(frozen=True, kw_only=True, slots=True)
class EncoderPhase:
    """One encoder phase (see the module doc). ``cost``: its coefficients' name in a
    :class:`~balancing.CostModel` (``vision``, ``audio``)."""

    name: str
    cost: str
    payload: str
    rows: str
    units: str
    count: str
    token: str
    width: int
    kind: str = "grid"
    n_window: int = 0
    window_frames: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"phase {self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.cost not in ("vision", "audio"):
            raise ValueError(f"phase {self.name}: cost must be 'vision' or 'audio'")
        check_count(f"phase {self.name}: width", self.width, 1, 4)
        if self.kind == "chunks":
            check_count(f"phase {self.name}: n_window", self.n_window, 1)
        if self.kind == "window":
            check_count(f"phase {self.name}: window_frames", self.window_frames, 4)

    def sequences(self, units: np.ndarray) -> list[tuple[int, ...]]:
        """Per unit row (``[units, width]``), the lengths of the sequences its encoder runs."""
        units = np.asarray(units, dtype=np.int64).reshape(-1, self.width)
        if self.kind == "grid":
            return [(int(h * w),) for h, w in units[:, :2]]
        if self.kind == "chunks":
            return [chunk_positions(int(f), self.n_window) for f in units[:, 0]]
        whole = ((self.window_frames - 1) // 2 + 1,)
        return [whole] * len(units)

    def features(self, units: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per sample (``count`` units each, in order): (tokens, sum of squared sequence
        lengths, sequences), the terms of a phase cost."""
        if self.kind == "grid":  # one sequence a unit: vectorized (a step has many tiles)
            units = np.asarray(units, dtype=np.int64).reshape(-1, self.width)
            lens = (units[:, 0] * units[:, 1]).astype(np.float64)
            per_unit = np.stack([lens, lens * lens, np.ones_like(lens)], axis=1)
        else:
            seqs = self.sequences(units)
            per_unit = np.array(
                [(sum(s), sum(x * x for x in s), len(s)) for s in seqs], dtype=np.float64
            ).reshape(-1, 3)
        owner = np.repeat(np.arange(len(count)), np.asarray(count, dtype=np.int64))
        return tuple(
            np.bincount(owner, weights=per_unit[:, j], minlength=len(count)) for j in range(3)
        )


VISION = EncoderPhase(
    name="vision",
    cost="vision",
    payload="patches",
    rows="vit_lens",
    units="units_hw",
    count="num_units",
    token="image_token_id",
    width=2,
)


def audio_phase(*, n_window: int = 0, window_frames: int = 3000) -> EncoderPhase:
    """A Whisper-style audio encoder's phase: chunks of ``2 * n_window`` frames (Qwen2.5-Omni:
    100), or with ``n_window=0`` the padded window of ``window_frames`` (Qwen2-Audio's 30 s:
    3,000). Batch keys: ``audio_features`` (``[frames, mel]``), ``audio_frames`` (per
    sample), ``audio_lens`` (``[recordings, 1]``: each one's frames), ``num_audios`` (per
    sample), ``audio_token_id``."""
    return EncoderPhase(
        name="audio",
        cost="audio",
        payload="audio_features",
        rows="audio_frames",
        units="audio_lens",
        count="num_audios",
        token="audio_token_id",
        width=1,
        kind="chunks" if n_window else "window",
        n_window=n_window,
        window_frames=window_frames,
    )
