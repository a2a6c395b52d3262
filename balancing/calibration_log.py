"""Calibrating from training logs: the steps' phase times read back, warm-up steps left out,
the last steps held out to test the fit, every phase fitted, the file written.

A log is JSON lines, one record per step (``equishard train --log``, or a user's loop that
writes :mod:`equishard.contracts.phase_times` records). It is a user's file: a regular file
only, each line at most :data:`MAX_LINE` bytes, every record checked where it is read. Records
without phase times (another tool's, or a run before they were recorded) are counted and left
out; the summary says how many.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from balancing.calibration import CalibrationError, PhaseFit, fit_phase
from balancing.calibration_file import describe_machine, write_calibration
from equishard.common.local_files import regular_file
from equishard.contracts.phase_times import StepTimes, parse_step_times

__all__ = ["MAX_LINE", "Calibration", "calibrate", "read_step_times"]

MAX_LINE = 64 << 20  # bytes of one step record
MAX_RECORDS = 10_000_000


def read_step_times(paths) -> tuple[list[StepTimes], int]:
    """Every step record with phase times in ``paths`` (in order), and how many records had
    none. A line that is no JSON object, or whose phase times are wrong, is refused naming
    ``file:line``."""
    steps, skipped = [], 0
    for path in paths:
        regular_file(path, "training log")
        with open(path, "rb") as f:
            for lineno, line in enumerate(iter(lambda: f.readline(MAX_LINE + 1), b""), 1):
                where = f"{path}:{lineno}"
                if len(line) > MAX_LINE:
                    raise CalibrationError(f"{where}: a line longer than {MAX_LINE} bytes")
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    raise CalibrationError(f"{where}: not a JSON record ({exc})") from None
                if isinstance(record, dict) and "phase_times" not in record:
                    skipped += 1
                    continue
                steps.append(parse_step_times(record, where))
                if len(steps) > MAX_RECORDS:
                    raise CalibrationError(f"{path}: more than {MAX_RECORDS} step records")
    return steps, skipped


@dataclass(frozen=True, kw_only=True)
class Calibration:
    fits: dict  # phase -> PhaseFit
    heldout_errors: dict  # phase (and "step") -> median relative error on held-out steps
    fitted_steps: int
    heldout_steps: int
    warmup: int
    skipped: int
    hardware: str | None
    model: str | None = None  # what the log says was trained


def _observations(steps: list[StepTimes], phase: str):
    secs, items, padded = [], [], False
    for st in steps:
        ph = st.phases.get(phase)
        if ph is None:
            continue
        padded = padded or ph.padded
        secs.extend(ph.seconds)
        items.extend(ph.items)
    return secs, items, padded


def _heldout(fits: dict[str, PhaseFit], steps: list[StepTimes]) -> dict:
    """Median relative error of each phase's per-rank prediction on ``steps``, and of the
    per-rank compute of the step (every phase's prediction summed)."""
    out = {}
    total_pred, total_meas = [], []
    for name, fit in fits.items():
        secs, items, _ = _observations(steps, name)
        keep = [i for i, it in enumerate(items) if it and secs[i] > 0]
        if keep:
            out[name] = float(
                np.median(fit.errors([secs[i] for i in keep], [items[i] for i in keep]))
            )
    for st in steps:
        for r in range(st.ranks):
            pred = sum(f.predict(st.phases[n].items[r]) for n, f in fits.items() if n in st.phases)
            total_pred.append(pred)
            total_meas.append(sum(ph.seconds[r] for ph in st.phases.values()))
    meas = np.array(total_meas)
    if meas.size and np.all(meas > 0):
        out["step"] = float(np.median(np.abs(np.array(total_pred) - meas) / meas))
    return out


def calibrate(paths, *, warmup: int = 2, heldout: float = 0.25) -> Calibration:
    """Fit every phase the logs time: the first ``warmup`` steps of each run are left out
    (compilation, allocator growth), the last ``heldout`` share of the rest is predicted, not
    fitted. :class:`CalibrationError` when a phase has no usable fit."""
    if not 0.0 <= heldout < 1.0:
        raise CalibrationError(f"held-out share must be in [0, 1), got {heldout}")
    steps, skipped = read_step_times(paths)
    if not steps:
        raise CalibrationError(
            f"{', '.join(map(str, paths))}: no step records with phase times ({skipped} without)"
        )
    used = [st for st in steps if st.step >= warmup]
    if not used:
        raise CalibrationError(
            f"all {len(steps)} step records are warm-up steps (step < {warmup}); "
            "record more steps or lower --warmup"
        )
    n_held = int(len(used) * heldout)
    fit_steps, held_steps = used[: len(used) - n_held], used[len(used) - n_held :]
    fits = {}
    for name in ("vision", "audio", "llm"):
        secs, items, padded = _observations(fit_steps, name)
        if not any(items):
            if name == "audio":
                continue
            raise CalibrationError(
                f"{name}: no rank ran any item of this phase in the fitted steps; a calibration "
                "needs the vision and LLM phases measured"
            )
        fits[name] = fit_phase(name, secs, items, padded=padded)
    errors = _heldout(fits, held_steps) if held_steps else {}
    return Calibration(
        fits=fits,
        heldout_errors=errors,
        fitted_steps=len(fit_steps),
        heldout_steps=len(held_steps),
        warmup=warmup,
        skipped=skipped,
        hardware=next((st.hardware for st in steps if st.hardware), None),
        model=next((st.model for st in steps if st.model), None),
    )


def write(cal: Calibration, out: str | Path, paths, *, model: str | None = None) -> Path:
    """The calibration file of ``cal`` (what it was measured on, and the fit's errors)."""
    import hashlib

    digest = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    meta = {
        "fit": {n: {"heldout_median_rel_error": cal.heldout_errors.get(n)} for n in cal.fits},
        "measurements": {
            "logs": [str(p) for p in paths],
            "sha256": digest.hexdigest(),
            "fitted_steps": cal.fitted_steps,
            "heldout_steps": cal.heldout_steps,
            "heldout_step_median_rel_error": cal.heldout_errors.get("step"),
            "warmup": cal.warmup,
            "records_without_phase_times": cal.skipped,
        },
        "model": model or cal.model,
        # where the steps ran (the log says), else where this runs
        "hardware": cal.hardware or describe_machine(),
    }
    return write_calibration(out, cal.fits, meta)
