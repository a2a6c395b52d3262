"""Predicted against measured, every step: how even the step really was, how well the plan
predicted it, and who the straggler was and why.

From one step's phase times (:class:`~equishard.contracts.phase_times.StepTimes`, with the
plan's per-rank ``predicted`` loads), :func:`assess_step` gives:

* ``efficiency``: per phase and for the step's compute (phases summed), measured mean / max
  over ranks (1.0: no rank waited for another);
* ``prediction_error``: per phase, the median over ranks of ``|s * predicted - measured| /
  measured``, ``s`` the least-squares scale of predicted to measured (the plan's unit is FLOPs
  or a calibration's seconds; the scale makes them comparable, and is ~1 with a calibration);
* ``straggler``: the rank with the most compute, and ``attribution``, the first that holds of:
  ``loader`` (some rank waited for its next batch longer than the straggler's lead over the
  mean), ``exchange`` (the least any rank spent in the exchange, the transfer itself, exceeds
  that lead), ``data`` (the straggler also had the largest predicted load: the plan gave it the
  most), ``hardware`` (it took longer than its share of the prediction says).

:func:`persistent_stragglers` reads many steps: the ranks that took longer than predicted on
most steps (a slow GPU, a throttled host: no plan fixes that).
"""

from __future__ import annotations

import numpy as np

from equishard.contracts.phase_times import StepTimes

__all__ = ["assess_step", "persistent_stragglers"]


def _error(predicted: np.ndarray, measured: np.ndarray) -> float | None:
    keep = measured > 0
    if not keep.any() or not predicted[keep].any():
        return None
    p, m = predicted[keep], measured[keep]
    scale = float(p @ m / (p @ p))
    return float(np.median(np.abs(scale * p - m) / m))


def _efficiency(x: np.ndarray) -> float:
    return float(x.mean() / x.max()) if x.max() > 0 else 1.0


def assess_step(st: StepTimes) -> dict:
    """The step's measured efficiency, prediction error and straggler attribution."""
    ranks = st.ranks
    compute = np.zeros(ranks)
    pred_total = np.zeros(ranks)
    have_pred = True
    phases = {}
    for name, ph in st.phases.items():
        secs = np.array(ph.seconds)
        compute += secs
        entry = {"efficiency": _efficiency(secs), "max_s": float(secs.max())}
        if ph.predicted is not None:
            pred = np.array(ph.predicted)
            entry["predicted_efficiency"] = _efficiency(pred)
            entry["prediction_error"] = _error(pred, secs)
            # each phase's prediction in its own measured scale, so that phases add up
            tot = pred.sum()
            pred_total += pred / tot * secs.sum() if tot > 0 else 0.0
        else:
            have_pred = False
        phases[name] = entry
    straggler = int(np.argmax(compute))
    lead = float(compute[straggler] - compute.mean())
    loader = np.array(st.waits.get("loader", [0.0] * ranks))
    exchange = np.array(st.waits.get("exchange", [0.0] * ranks))
    if loader.max() > lead:
        why = "loader"
    elif exchange.min() > lead:
        why = "exchange"
    elif not have_pred:
        why = None
    elif int(np.argmax(pred_total)) == straggler:
        why = "data"
    else:
        why = "hardware"
    over = None
    if have_pred and compute.sum() > 0:
        # each rank's measured compute over its predicted share of the step's compute
        over = [float(c / p) if p > 0 else None for c, p in zip(compute, pred_total, strict=True)]
    return {
        "step": st.step,
        "efficiency": _efficiency(compute),
        "phases": phases,
        "straggler": straggler,
        "straggler_lead_s": lead,
        "attribution": why,
        "measured_over_predicted": over,
        "loader_wait_max_s": float(loader.max()),
        "exchange_min_s": float(exchange.min()),
    }


def persistent_stragglers(reports: list[dict], *, margin: float = 0.05) -> dict[int, int]:
    """Ranks whose measured compute exceeded their predicted share by more than ``margin`` on
    more than half of the steps: ``{rank: steps}`` (empty when none, or nothing predicted)."""
    counts: dict[int, int] = {}
    steps = 0
    for rep in reports:
        over = rep.get("measured_over_predicted")
        if not over:
            continue
        steps += 1
        for r, x in enumerate(over):
            if x is not None and x > 1 + margin:
                counts[r] = counts.get(r, 0) + 1
    return {r: n for r, n in sorted(counts.items()) if n * 2 > steps}
