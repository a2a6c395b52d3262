"""``equishard calibrate``: fit each phase's cost to the phase times a training run measured."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]

# the line the top-level --help shows
HELP = "fit per-phase costs to measured step times (a calibration file for balance/train)"


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    from equishard.cli._common import add_json_arg

    p = sub.add_parser(
        name,
        help=HELP,
        description=(
            "Fit, per phase (vision encoder, audio encoder, LLM), the cost of an item from the\n"
            "phase times a training run recorded (`equishard train --log`, or your loop's\n"
            "PhaseTimer records): seconds = alpha*tokens + beta*sum(len^2) + gamma*items +\n"
            "a per-call constant, by robust least squares (padded phases: every item as long\n"
            "as the longest). The first --warmup steps of each run are left out; the last\n"
            "--heldout share of steps is predicted, not fitted, and the error reported. The\n"
            "file records the fit's errors, the model, the hardware and the software; pass it\n"
            "to balance, rebalance or train as --calibration. A fit that is not usable (too few\n"
            "points, a negative coefficient, times that do not grow with the items) writes\n"
            "nothing and exits 1: balancing keeps the model's dimensions (the proxy)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("logs", nargs="+", metavar="LOG", help="JSON-lines step logs, in order")
    p.add_argument(
        "-o", "--output", required=True, metavar="JSON", help="calibration file to write"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="steps at the start of each run left out (default 2: compilation, allocator)",
    )
    p.add_argument(
        "--heldout",
        type=float,
        default=0.25,
        help="share of the last steps predicted instead of fitted, in [0, 1) (default 0.25)",
    )
    p.add_argument("--model", default=None, help="what was trained, recorded in the file")
    add_json_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from balancing.calibration import CalibrationError
    from balancing.calibration_log import calibrate, write
    from equishard.cli._common import check_output, fail, os_failure, print_json
    from equishard.common.local_files import regular_file
    from equishard.common.values import check_count, check_real

    try:
        check_count("--warmup", args.warmup, 0, 1 << 30)
        check_real("--heldout", args.heldout, 0.0, 1.0, hi_open=True)
        check_output(args.output)
        for log in args.logs:  # a missing log, a FIFO or a directory is a bad argument
            regular_file(log, "training log")
    except (ValueError, FileNotFoundError) as exc:
        return fail(str(exc))
    try:
        cal = calibrate(args.logs, warmup=args.warmup, heldout=args.heldout)
    except (CalibrationError, ValueError, OSError) as exc:
        msg = os_failure(exc, "reading the logs")
        return fail(f"{msg}; no calibration written (balancing keeps the model's dimensions)", 1)
    try:
        out = write(cal, args.output, args.logs, model=args.model)
    except OSError as exc:
        return fail(f"{args.output}: {os_failure(exc, 'writing the calibration')}", 1)
    if args.json:
        fields = {
            "output": str(out),
            "phases": {
                n: {**f.cost.describe(), "gamma": f.cost.gamma, **f.describe()}
                for n, f in cal.fits.items()
            },
            "heldout": cal.heldout_errors,
        }
        n = cal.fitted_steps + cal.heldout_steps
        print_json(
            "calibrate", ok=True, n_in=n + cal.skipped, n_out=n, rejected=cal.skipped, **fields
        )
        return 0
    print(
        f"calibrate: {cal.fitted_steps} steps fitted, {cal.heldout_steps} held out "
        f"({cal.warmup} warm-up steps a run left out, {cal.skipped} records without phase times)"
    )
    for name, f in cal.fits.items():
        held = cal.heldout_errors.get(name)
        print(
            f"  {name:6s} alpha {f.cost.alpha:.4g} s/token  beta {f.cost.beta:.4g} s/token^2  "
            f"gamma {f.cost.gamma:.4g} s/item  + {f.intercept:.3g} s a call; "
            f"{f.points} points, error median {f.median_rel_error:.1%} p90 {f.p90_rel_error:.1%}"
            + (f", held out {held:.1%}" if held is not None else "")
            + (f" ({', '.join(f.dropped)} read as 0)" if f.dropped else "")
        )
    if "step" in cal.heldout_errors:
        print(
            f"  per-rank step compute on held-out steps: median error {cal.heldout_errors['step']:.1%}"
        )
    print(f"calibrate: wrote {out}")
    return 0
