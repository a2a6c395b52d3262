"""Choose ISF caps from the data's statistics and a target average group size B.

OmniBal searches caps by trial runs. Here the caps lie on the ray of the data's mean loads, ``q
= s * B * mean`` for every phase (vision, any other encoder such as audio, LLM), and the scale
``s`` is found by a fixed-point iteration ``s <- s * B / size(s)`` (the average group size grows
about linearly with the caps), which lands within ``tolerance`` of B in 2-5 trials; each trial
is one numba ISF run on a subsample of at most ``sample_size`` rows, so the search takes
milliseconds. The vision and other encoders' caps are rounded to the data's granularity
(e.g. 1024 patches per InternVL tile, 1,500 positions per Qwen2-Audio window). Filter targets
sit ``slack`` below the caps."""

from __future__ import annotations

from math import gcd

import numpy as np

from balancing.isf import ISFParams, isf_group

__all__ = ["SAMPLE_SIZE", "auto_isf_params", "sample_rows"]

SAMPLE_SIZE = 20_000  # rows whose loads choose the caps


def _granularity(x: np.ndarray) -> int:
    vals = np.unique(x[x > 0])[:64]
    g = 0
    for val in vals.tolist():
        g = gcd(g, int(val))
    return max(g, 1)


def _cap(s: float, b: float, mean: float, gran: int, slack: float) -> tuple[int, int]:
    """An encoder phase's (cap, target), both whole multiples of its granularity."""
    q = max(gran, round(s * b * mean / gran) * gran)
    return q, max(1, min(q, int(np.ceil(q * (1 - slack) / gran)) * gran))


def _params(
    s: float,
    b: float,
    mv: float,
    mt: float,
    gv: int,
    slack: float,
    rounds: int,
    extra: tuple[tuple[float, int], ...] = (),
) -> ISFParams:
    q_v, qf_v = _cap(s, b, mv, gv, slack)
    q_t = max(1, round(s * b * mt))
    qf_t = max(1, int(q_t * (1 - slack)))
    others = [_cap(s, b, m, g, slack) for m, g in extra]
    return ISFParams(
        q_v=q_v,
        q_t=q_t,
        qf_v=qf_v,
        qf_t=qf_t,
        rounds=rounds,
        q_e=tuple(q for q, _ in others),
        qf_e=tuple(qf for _, qf in others),
    )


def sample_rows(n: int, seed: int, sample_size: int = SAMPLE_SIZE) -> np.ndarray:
    """The rows (sorted) of ``n`` whose loads choose the caps: all where at most
    ``sample_size``, else a seeded subsample of that many (a plan over partitions gathers the
    same rows, so its caps are those of the whole table's plan)."""
    if n <= sample_size:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, sample_size, replace=False))


def auto_isf_params(
    v: np.ndarray,
    t: np.ndarray,
    *,
    extra: np.ndarray | None = None,
    target_batch: float,
    seed: int = 0,
    slack: float = 0.05,
    rounds: int = 10,
    sample_size: int = SAMPLE_SIZE,
    tolerance: float = 0.01,
    max_trials: int = 8,
) -> ISFParams:
    """ISF parameters giving an average group size of ``target_batch`` samples; ``extra``:
    the loads of each other encoder phase (shape (n, phases)), capped on the same ray."""
    if target_batch < 1:
        raise ValueError(f"target batch must be >= 1 sample per group, got {target_batch}")
    if not 0 <= slack < 1:
        raise ValueError(f"slack must be in [0, 1), got {slack}")
    v = np.asarray(v, dtype=np.int64)
    t = np.asarray(t, dtype=np.int64)
    if v.size == 0:
        raise ValueError("cannot choose caps for an empty cost table")
    if extra is not None:
        extra = np.asarray(extra, dtype=np.int64).reshape(v.size, -1)
    if v.size > sample_size:
        pick = sample_rows(v.size, seed, sample_size)
        v, t = v[pick], t[pick]
        extra = extra[pick] if extra is not None else None
    mv = max(float(v.mean()), 1.0)
    mt = max(float(t.mean()), 1.0)
    gv = _granularity(v)
    others = ()
    if extra is not None:
        others = tuple(
            (max(float(extra[:, j].mean()), 1.0), _granularity(extra[:, j]))
            for j in range(extra.shape[1])
        )
    # a group cannot hold more samples than there are: beyond that the caps only grow
    target_batch = min(target_batch, float(v.size))

    def avg_size(s: float) -> float:
        p = _params(s, target_batch, mv, mt, gv, slack, rounds, others)
        groups = isf_group(v, t, p, np.random.default_rng(seed), extra=extra)
        return v.size / groups.n_groups

    best, best_err = 1.0, np.inf
    scale = 1.0
    for _ in range(max_trials):
        size = avg_size(scale)
        err = abs(size - target_batch) / target_batch
        if err < best_err:
            best, best_err = scale, err
        if err <= tolerance or size >= v.size:  # on target, or one group holds everything
            break
        scale *= target_batch / size
    return _params(best, target_batch, mv, mt, gv, slack, rounds, others)
