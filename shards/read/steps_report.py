"""``equishard report --steps LOG``: predicted against measured, per rank and per phase, as one
self-contained HTML page (PNG plots inline, no network needed).

From the phase-time records of training logs (:mod:`equishard.contracts.phase_times`):

* per phase, each rank-step's **predicted share** (its load over the step's mean load) against
  its **measured share** (its time over the step's mean time): on the diagonal, the plan
  predicted that rank's time; above it, the rank took longer than its plan said;
* per step, the **measured efficiency** of the step's compute (mean over max) beside the
  **planned** one (the plan's own mean over max): the gap is what the cost proxy missed;
* per rank, measured compute over its predicted share across steps: a rank above 1 on most
  steps is a persistent straggler (hardware), named in the table;
* the stragglers' attribution counted: data, hardware, exchange, loader.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from balancing.step_report import assess_step, persistent_stragglers

__all__ = ["render_steps_report"]

_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def _shares(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / x.mean() if x.mean() > 0 else np.ones_like(x)


def _figures(steps, reports) -> list[tuple[str, str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from shards.read.report import _png

    figs = []
    names = [n for n in ("vision", "audio", "llm") if any(n in st.phases for st in steps)]
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4.5), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        top = 1.0
        for st in steps:
            ph = st.phases.get(name)
            if ph is None or ph.predicted is None or sum(ph.seconds) == 0:
                continue
            pred, meas = _shares(ph.predicted), _shares(ph.seconds)
            for r in range(len(pred)):
                ax.scatter(pred[r], meas[r], s=10, color=_COLORS[r % len(_COLORS)], alpha=0.6)
            top = max(top, float(pred.max()), float(meas.max()))
        ax.plot([0, top], [0, top], color="#888", lw=1)
        ax.set(title=f"{name}: each rank-step", xlabel="predicted share (load / step mean)",
               ylabel="measured share (time / step mean)")  # fmt: skip
    figs.append(
        (
            "Predicted against measured, per rank and phase",
            "One point per rank and step, colored by rank. On the diagonal the plan predicted the "
            "rank's time; above it the rank took longer than planned.",
            _png(fig),
        )
    )
    fig, ax = plt.subplots(figsize=(10, 3.5))
    x = [rep["step"] for rep in reports]
    ax.plot(x, [rep["efficiency"] for rep in reports], label="measured (compute)", color="#c44e52")
    for name in names:
        planned = [rep["phases"].get(name, {}).get("predicted_efficiency") for rep in reports]
        if any(p is not None for p in planned):
            ax.plot(x, [np.nan if p is None else p for p in planned], label=f"planned ({name})",
                    lw=1, alpha=0.8)  # fmt: skip
    ax.set(title="step efficiency (mean / max over ranks)", xlabel="step", ylim=(0, 1.02))
    ax.legend(loc="lower right")
    figs.append(("Efficiency per step", "", _png(fig)))
    over = [rep["measured_over_predicted"] for rep in reports if rep["measured_over_predicted"]]
    if over:
        ranks = max(len(o) for o in over)
        fig, ax = plt.subplots(figsize=(max(4, 0.6 * ranks + 2), 3.5))
        data = [[o[r] for o in over if r < len(o) and o[r] is not None] for r in range(ranks)]
        ax.boxplot(data, tick_labels=[str(r) for r in range(ranks)])
        ax.axhline(1.0, color="#888", lw=1)
        ax.set(title="measured compute / predicted share, per rank", xlabel="rank")
        figs.append(("Ranks against their prediction", "", _png(fig)))
    return figs


def render_steps_report(logs, output: str | Path) -> tuple[Path, int, int]:
    """Write the page for the step records of ``logs`` to ``output``; returns it with the
    number of step records drawn and of records without phase times (left out)."""
    from balancing.calibration import CalibrationError
    from balancing.calibration_log import read_step_times

    steps, without = read_step_times(logs)
    if not steps:
        raise CalibrationError(
            f"{', '.join(map(str, logs))}: no step records with phase times ({without} without)"
        )
    reports = [assess_step(st) for st in steps]
    why: dict[str, int] = {}
    for rep in reports:
        key = rep["attribution"] or "no prediction"
        why[key] = why.get(key, 0) + 1
    slow = persistent_stragglers(reports)
    eff = [rep["efficiency"] for rep in reports]
    rows = [
        ("logs", ", ".join(map(str, logs))),
        ("step records", f"{len(steps)} ({without} without phase times)"),
        ("ranks", steps[0].ranks),
        ("measured step efficiency", f"mean {np.mean(eff):.3f}, worst {min(eff):.3f}"),
        ("stragglers by cause", ", ".join(f"{k}: {v}" for k, v in sorted(why.items()))),
        (
            "persistent stragglers (slower than predicted on most steps)",
            ", ".join(f"rank {r} ({n} steps)" for r, n in slow.items()) or "none",
        ),
    ]
    for name in ("vision", "audio", "llm"):
        errs = [
            e
            for rep in reports
            if (e := rep["phases"].get(name, {}).get("prediction_error")) is not None
        ]
        if errs:
            rows.append((f"prediction error, {name} (median over steps)", f"{np.median(errs):.1%}"))
    table = (
        "<table>"
        + "".join(
            f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
            for k, v in rows
        )
        + "</table>"
    )
    sections = "".join(
        f"<h2>{html.escape(t)}</h2><p>{html.escape(x)}</p><img alt='{html.escape(t)}' src='{s}'>"
        for t, x, s in _figures(steps, reports)
    )
    data = {"attribution": why, "persistent_stragglers": slow, "steps": reports}
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>equishard step report</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 10px;
text-align:left}}img{{max-width:100%}}</style></head><body>
<h1>equishard step report: predicted against measured</h1>{table}{sections}
<script type="application/json" id="report-data">{html.escape(json.dumps(data))}</script>
</body></html>"""
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    return out, len(steps), without
