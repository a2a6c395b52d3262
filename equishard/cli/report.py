"""``equishard report``: a self-contained HTML page with plots of what balancing did."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]

# the line the top-level --help shows
HELP = "write an HTML balance report of a generation (plots, no network needed)"


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    from equishard.cli._common import add_json_arg

    p = sub.add_parser(
        name,
        help=HELP,
        description="One self-contained HTML page (PNG plots inline) for a generation:\n"
        "distributions of vision/LLM tokens and images per sample; per-step, per-rank loads of\n"
        "both phases for random batching vs the plan; dist ratio and efficiency per step; group\n"
        "and shard sizes; and for a nightly generation, what changed since its parent.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "generation",
        metavar="GEN",
        nargs="?",
        help="a generation directory, or a root with CURRENT",
    )
    p.add_argument(
        "--steps",
        nargs="+",
        metavar="LOG",
        default=None,
        help="instead of a generation: training logs with phase times (equishard train --log); "
        "the page draws each rank's predicted against measured time per phase and step, the "
        "step efficiency, and the stragglers' causes",
    )
    p.add_argument("-o", "--output", default="report.html", help="HTML file (default report.html)")
    add_json_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from equishard.cli._common import check_output, fail, print_json
    from shards.read.report import render_report

    if (args.generation is None) == (args.steps is None):
        return fail("give a generation (GEN) or training logs (--steps LOG ...), one of them")
    if args.steps:
        return _steps(args)
    try:
        check_output(args.output)
        out = render_report(args.generation, args.output, progress=not args.json)
    except ValueError as exc:
        return fail(str(exc))
    if args.json:
        from shards.store.manifest import open_generation

        m = open_generation(args.generation)
        n = m.totals["samples"]
        fields = {"generation": m.generation, "output": str(out), "bytes": out.stat().st_size}
        print_json("report", ok=True, n_in=n, n_out=n, rejected=0, **fields)
        return 0
    print(f"report: {out} ({out.stat().st_size / 1024:.0f} KiB, self-contained)")
    return 0


def _steps(args: argparse.Namespace) -> int:
    from equishard.cli._common import check_output, fail, print_json
    from equishard.common.local_files import regular_file
    from shards.read.steps_report import render_steps_report

    try:
        check_output(args.output)
        for log in args.steps:
            regular_file(log, "training log")
    except (ValueError, FileNotFoundError) as exc:
        return fail(str(exc))
    try:
        out, drawn, without = render_steps_report(args.steps, args.output)
    except ValueError as exc:
        return fail(str(exc), 1)
    if args.json:
        size = out.stat().st_size
        # in = the records read; out = those drawn; rejected = those without phase times
        n_in = drawn + without
        print_json("report", ok=True, n_in=n_in, n_out=drawn, rejected=without, output=str(out),
                   bytes=size)  # fmt: skip
        return 0
    print(f"report: {out} ({out.stat().st_size / 1024:.0f} KiB, self-contained)")
    return 0
