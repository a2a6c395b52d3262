"""Per-sample and per-group tables of the offline plan: modeled sample costs, group maxima and
statistics, and a counting sort by key.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _nb_phase_costs(tokens, values, offsets, a, b, c):
    """Modeled cost of every sample in one encoder phase: ``a * tokens + b * sum of squared
    sequence lengths + c * sequences`` (``values``/``offsets``: the list column of its
    sequences; ``c`` a calibration's per-item constant)."""
    n = tokens.shape[0]
    out = np.empty(n)
    for i in range(n):
        acc = 0.0
        for k in range(offsets[i], offsets[i + 1]):
            acc += float(values[k]) * float(values[k])
        out[i] = a * float(tokens[i]) + b * acc + c * float(offsets[i + 1] - offsets[i])
    return out


@njit(cache=True)
def _nb_sample_costs(vit, llm, values, offsets, a_v, b_v, c_v, a_t, b_t, c_t):
    """Modeled cost of every sample in the vision phase (:func:`_nb_phase_costs` of the image
    sequences) and the LLM (``a_t * llm + b_t * llm**2 + c_t``: one sequence a sample)."""
    vc = _nb_phase_costs(vit, values, offsets, a_v, b_v, c_v)
    tc = np.empty(llm.shape[0])
    for i in range(llm.shape[0]):
        x = float(llm[i])
        tc[i] = a_t * x + b_t * x * x + c_t
    return vc, tc


@njit(cache=True)
def _nb_group_max(ids, x, n_groups):
    out = np.zeros(n_groups)
    for i in range(ids.shape[0]):
        if x[i] > out[ids[i]]:
            out[ids[i]] = x[i]
    return out


@njit(cache=True)
def _nb_counting_argsort(keys, n_keys):
    """Stable argsort of small non-negative integer keys in O(n + n_keys)."""
    count = np.zeros(n_keys + 1, dtype=np.int64)
    for k in keys:
        count[k + 1] += 1
    for j in range(n_keys):
        count[j + 1] += count[j]
    out = np.empty(keys.shape[0], dtype=np.int64)
    for i in range(keys.shape[0]):
        out[count[keys[i]]] = i
        count[keys[i]] += 1
    return out


# Per-group statistics: columns of the packed (n_groups, 7) result. One row per group keeps each
# sample's updates in one or two cache lines, which at 10M samples is what the time is spent on.
STAT_COUNT, STAT_SUM_V, STAT_SUM_T, STAT_SUM_VC, STAT_SUM_TC, STAT_MAX_V, STAT_MAX_T = range(7)


@njit(cache=True, inline="always")
def _add_to_stats(out, g, v, t, vc, tc):
    """Count one sample with loads (v, t, vc, tc) into row ``g`` of a stats table."""
    out[g, 0] += 1.0
    out[g, 1] += v
    out[g, 2] += t
    out[g, 3] += vc
    out[g, 4] += tc
    if v > out[g, 5]:
        out[g, 5] = v
    if t > out[g, 6]:
        out[g, 6] = t


@njit(cache=True)
def _nb_group_stats(ids, v, t, vc, tc, n_groups):
    """Count, sums (v, t, vc, tc) and maxima (v, t) of the samples of each group ``ids[i]``."""
    out = np.zeros((n_groups, 7))
    for i in range(ids.shape[0]):
        _add_to_stats(out, ids[i], v[i], t[i], vc[i], tc[i])
    return out


@njit(cache=True, nogil=True)  # nogil: the random baseline runs beside ISF, in a thread
def _nb_block_stats(perm, b, v, t, vc, tc):
    """``_nb_group_stats`` for the groups ``perm[k*b:(k+1)*b]`` (the last may be short): random
    batching, read in batch order, without materializing each sample's batch id."""
    n = perm.shape[0]
    out = np.zeros(((n + b - 1) // b, 7))
    for i in range(n):
        j = perm[i]
        _add_to_stats(out, i // b, v[j], t[j], vc[j], tc[j])
    return out


@njit(cache=True)
def _nb_stats_pad_ratios(stats):
    """Mean pad ratio (count * max - sum) / (count * max) of the vision and the LLM tokens over
    the groups of a ``_nb_group_stats`` table whose maximum is > 0."""
    ra = 0.0
    na = 0
    rb = 0.0
    nb = 0
    for g in range(stats.shape[0]):
        c = stats[g, 0]
        if stats[g, 5] > 0:
            ra += (c * stats[g, 5] - stats[g, 1]) / (c * stats[g, 5])
            na += 1
        if stats[g, 6] > 0:
            rb += (c * stats[g, 6] - stats[g, 2]) / (c * stats[g, 6])
            nb += 1
    return ra / max(na, 1), rb / max(nb, 1)
