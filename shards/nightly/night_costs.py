"""What measured step times change in a night: a calibration re-plans the generation under the
measured costs, and the training logs flag the steps that ran furthest from their plan.

* ``--calibration FILE`` (``equishard calibrate``'s): when its coefficients differ from the
  cost model the current generation was planned with (its report records it), every step is
  balanced again under the measured costs (a kept step was even only for the old ones); the
  new generation's report records the calibration (its path and digest). The same
  coefficients change nothing.
* ``--step-log LOG``: training logs of the current generation (``equishard train --log``, or a
  loop's phase-time records). Each step record that names the current generation and the step
  it read is compared with its plan (:func:`balancing.step_report.assess_step`): its distance
  is the largest ``|measured / predicted - 1|`` over ranks of the step's compute. The steps
  with the largest distance (averaged over the epochs that ran them) are listed in the night's
  summary, with the records of other generations counted apart.
"""

from __future__ import annotations

from dataclasses import replace

__all__ = ["TOP_FLAGGED", "flag_steps", "with_calibration"]

TOP_FLAGGED = 10


def _coefficients(model) -> dict:
    return {k: v for k, v in model.describe().items() if k != "source"}


def with_calibration(bcfg, calibration: str | None):
    """``(bcfg, replan)``: the parent's balance settings with the calibration's cost model, and
    whether it differs from the one the parent was planned with."""
    if not calibration:
        return bcfg, False
    from balancing.cost_model import CostModel

    model = CostModel.from_calibration(calibration)
    return replace(bcfg, cost_model=model), _coefficients(model) != _coefficients(bcfg.cost_model)


def flag_steps(logs, generation: str, top: int = TOP_FLAGGED) -> dict:
    """The current generation's steps furthest from their plan in ``logs``."""
    from balancing.calibration_log import read_step_times
    from balancing.step_report import assess_step

    steps, without = read_step_times(logs)
    dist: dict[int, list[float]] = {}
    other = unplaced = 0
    for st in steps:
        if st.generation != generation:
            other += 1
            continue
        over = assess_step(st)["measured_over_predicted"]
        if st.generation_step is None or not over or None in over:
            unplaced += 1
            continue
        dist.setdefault(st.generation_step, []).append(max(abs(x - 1.0) for x in over))
    ranked = sorted(
        ((sum(v) / len(v), s, len(v)) for s, v in dist.items()), key=lambda t: (-t[0], t[1])
    )
    return {
        "steps": [{"step": s, "distance": d, "runs": n} for d, s, n in ranked[:top]],
        "records": len(steps),
        "other_generations": other,
        "without_a_plan": unplaced,
        "without_phase_times": without,
    }
