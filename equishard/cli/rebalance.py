"""``equishard rebalance``: the nightly job — fold new data into a new balanced generation."""

from __future__ import annotations

import argparse
import json
import sys

from equishard.cli._common import add_store_args
from equishard.common.options import add_options, config_kwargs
from shards.nightly.rebalance import RebalanceConfig

__all__ = ["add_parser", "run"]

# the line the top-level --help shows
HELP = "nightly: add new/updated samples, apply deletions, publish a new generation"

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(
        name,
        help=HELP,
        description="Measure only what is new (rows of unchanged samples are reused by id and\n"
        "cache key), keep the current generation's balanced steps, rebuild the short last step,\n"
        "leftover steps and steps that lost or changed a sample together with the new samples,\n"
        "copy kept groups from the current shards, and publish the new generation atomically\n"
        "(CURRENT moves by rename; readers of older generations keep reading). Re-running the\n"
        "same night does nothing; a crashed run is finished by the next one.\n\n"
        "exit codes: 0 published, nothing to do, or another rebalance of the root in progress;\n"
        "1 failed (CURRENT unchanged); 2 bad arguments (incl. a malformed deletion list)\n"
        "example: equishard rebalance --current /data/shards --new day-2.jsonl --delete gone.txt\n"
        "         equishard rebalance --current s3://bucket/shards --new day-2.jsonl --engine ray",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, RebalanceConfig, what="prep and write")  # declared on its fields
    p.add_argument(
        "--json", action="store_true", help="print only the JSON summary (for schedulers)"
    )
    add_store_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from shards.nightly.rebalance import RebalanceConfig, run_rebalance

    try:
        cfg = RebalanceConfig(**config_kwargs(RebalanceConfig, args), progress=not args.json)
    except ValueError as exc:
        print(f"equishard rebalance: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        r = run_rebalance(cfg)
    except Exception as exc:  # the scheduler needs one line and a non-zero exit
        summary = {
            "command": "rebalance",
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "counts": _counts({}),
        }
        print(json.dumps(summary))
        print(f"equishard rebalance: FAILED, CURRENT unchanged: {exc}", file=sys.stderr)
        return EXIT_FAILED
    summary = {"command": "rebalance", **r.as_dict(), "counts": _counts(r.counts)}
    if r.status == "in_progress":
        if args.json:
            print(json.dumps(summary))
        print(
            f"equishard rebalance: another rebalance of {args.current} is in progress; "
            "nothing done (run again after it ends)",
            file=sys.stderr,
        )
        return EXIT_OK
    if args.json:
        print(json.dumps(summary))
        return EXIT_OK
    c = r.counts
    print(f"\nrebalance: {r.status}: {r.generation} (parent {r.parent})")
    if c:
        print(
            f"  samples: {c.get('carried_in', 0)} carried + {c.get('new', 0)} new - "
            f"{c.get('deleted', 0)} deleted = {c.get('out', 0)} "
            f"({c.get('updated', 0)} updated, {c.get('unchanged_resubmitted', 0)} resubmitted "
            f"unchanged, {c.get('rejected', 0)} rejected, {c.get('not_reread', 0)} not re-read, "
            f"{c.get('deletions_not_found', 0)} deletions not found)"
        )
    if r.plan:
        print(
            f"  steps: {r.plan['kept_steps']} kept as they were, {r.plan['rebuilt_parent_steps']} "
            f"rebuilt ({r.plan['rebuilt_because']}), {r.plan['new_steps']} steps built now"
        )
    bal = r.balance.get("balanced", {})
    if bal:
        print(
            f"  balance: dist ratio {bal['dist_ratio_vit']:.4f} (vision) / "
            f"{bal['dist_ratio_llm']:.4f} (LLM), efficiency {bal['efficiency_vit']:.4f} / "
            f"{bal['efficiency_llm']:.4f}"
        )
    if r.flagged:
        f = r.flagged
        top = ", ".join(f"{s['step']} ({s['distance']:.0%})" for s in f["steps"]) or "none"
        print(
            f"  steps of {r.parent or r.generation} furthest from their plan (largest |measured/"
            f"predicted - 1| of a rank): {top}; {f['records']} step records read, "
            f"{f['other_generations']} of other generations"
        )
    if r.removed:
        print(f"  removed old generations: {', '.join(r.removed)}")
    print("  (--json prints this summary as one JSON line for a scheduler)")
    return EXIT_OK


def _counts(counts: dict) -> dict:
    """The night's counts in the shape every command's --json has in front: ``in`` (the
    generation's samples carried in and the new entries read), ``out``, ``rejected``; then the
    night's own (new, updated, deleted, ...)."""
    entered = counts.get("carried_in", 0) + counts.get("read", 0)
    front = {"in": entered, "out": counts.get("out", 0), "rejected": counts.get("rejected", 0)}
    return {**front, **counts}
