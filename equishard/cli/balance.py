"""``equishard balance``: cost table -> balanced plan."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from equishard.contracts.phases import REPORTED
from equishard.contracts.plan import PLAN_PARQUET, PLAN_REPORT

__all__ = ["add_parser", "print_report", "run"]

# the line the top-level --help shows
HELP = "group samples into balanced steps and ranks (plan)"

_DESCRIPTION = """\
Group the samples of a cost table into balanced mini-batches (OmniBal's ISF), order the groups
into global steps of DP groups whose vision and LLM loads are alike, shuffle the steps by seed,
and place each step's groups on (node, local rank) so that every node's load is even too.
Writes PLAN_DIR/plan.parquet (sample -> group -> step -> node -> local rank, with group loads)
and PLAN_DIR/report.json, and prints random batching against the balanced plan.

Nothing is dropped: samples larger than a cap get their own 'oversize' groups, samples left after
the last ISF round are packed best-fit ('leftover'), and when the group count is not a multiple
of DP the last groups are re-packed into one final, flagged step ('last-step').

examples:
  equishard balance build/cost.parquet --dp 8 -o build/plan
  equishard balance cost.parquet --dp 64 --nodes 8 --gpus-per-node 8 --target-batch 4 --seed 1 -o plan
  equishard balance cost.parquet --dp 8 --llm-hidden 8192 --llm-layers 80 -o plan
  equishard balance cost.parquet --dp 512 --nodes 64 --engine ray --partitions 32 -o plan
"""


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(
        name,
        help=HELP,
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from balancing.cost_model import CostModelOptions
    from balancing.plan import BalanceConfig
    from balancing.row_memory import RowMemory
    from equishard.common.options import add_options

    p.add_argument(
        "cost_table", metavar="COST_TABLE", help="cost table written by 'equishard prep'"
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="PLAN_DIR",
        help="directory for plan.parquet and report.json",
    )
    add_options(p, BalanceConfig)  # declared on its fields, as the cost model's below
    from balancing.parts import BalanceEngine

    add_options(p.add_argument_group("where the plan is made"), BalanceEngine)
    g = p.add_argument_group("modeled cost (alpha*tokens + beta*sum(len^2) per phase)")
    add_options(g, CostModelOptions)
    add_options(p.add_argument_group("row memory (the largest group's logits)"), RowMemory)
    p.add_argument("--json", action="store_true", help="print report.json instead of the table")
    p.set_defaults(run=run)


PHASE_LABELS = {p.report: p.label for p in REPORTED}


def shown_phases(metrics: dict) -> list[tuple[str, str]]:
    """(report name, label) of every phase the report's metrics show, vision and LLM always."""
    return [(k, v) for k, v in PHASE_LABELS.items() if f"dist_ratio_{k}" in metrics]


def print_report(report: dict, plan_dir: str) -> None:
    from equishard.cli._common import format_table

    c, m = report["counts"], report["metrics"]
    r, b = m["random"], m["balanced"]
    only = m.get("llm_only")  # OrchMLLM's ablation, for a table with an audio phase
    phases = shown_phases(b)
    rows = [(f"pad ratio, {label} (if padded)", f"pad_ratio_{k}") for k, label in phases]
    for what, suffix in (("tokens", ""), ("modeled cost", "_cost")):
        for measure in ("dist ratio", "efficiency"):
            key = measure.replace(" ", "_")
            rows += [(f"{measure}, {label} {what}", f"{key}_{k}{suffix}") for k, label in phases]
    p = report["parameters"]
    print(
        f"\nbalance: {c['in']} samples in = {c['out']} in the plan; {c['groups']} groups "
        f"(avg {c['avg_group_size']} samples) in {c['steps']} steps of {p['dp']} ranks "
        f"({p['nodes']} node(s) x {p['gpus_per_node']})"
    )
    flags = ", ".join(f"{k} {v}" for k, v in c["groups_by_flag"].items() if v)
    print(
        f"  groups by kind: {flags}; oversize samples {c['oversize_samples']}, "
        f"leftover samples {c['leftover_samples']}"
    )
    isf = p["isf"]
    audio = f", audio {isf['q_a']}" if "q_a" in isf else ""
    audio_t = f", {isf['qf_a']}" if "qf_a" in isf else ""
    print(
        f"  ISF caps: vision {isf['q_v']}{audio}, LLM {isf['q_t']} tokens (targets "
        f"{isf['qf_v']}{audio_t}, {isf['qf_t']}; "
        f"{'chosen from the data' if isf['auto'] else 'given'})"
    )
    engine = p.get("engine")
    if engine:
        print(f"  made over {engine['partitions']} partitions of the table (ISF within each)")
    ls = report["last_step"]
    if ls["short"]:
        print(
            f"  last step: {ls['samples']} samples re-packed over {p['dp']} ranks ({ls['empty_ranks']} empty)"
        )
    print(f"  plan: {plan_dir}/plan.parquet, report: {plan_dir}/report.json\n")
    head = ["metric (random batching vs balanced)", "random", "balanced"]
    table = [
        (label, f"{r[key]:.4f}", f"{b[key]:.4f}")
        + ((f"{only[key]:.4f}",) if only and key in only else ("",) * bool(only))
        for label, key in rows
        if key in b
    ]
    print(format_table([*head, "LLM-only"] if only else head, table))
    if only:
        gains = ", ".join(
            f"{PHASE_LABELS[k]} {v:.1f}x" for k, v in m["encoder_gain"].items() if v == v
        )
        print(f"\n  encoders' dist ratio, LLM-only plan over this plan: {gains}")
    tr = report["trend"]
    rho = {k: tr[k]["spearman"] for k, _ in phases}
    each = ", ".join(f"{v:+.3f} ({PHASE_LABELS[k]})" for k, v in rho.items())
    print(
        f"\n  step order: Spearman rho of step load vs step index = {each}: no trend over steps"
        if max(abs(v) for v in rho.values()) < 0.2
        else f"\n  step order: Spearman rho {each}"
    )
    nb = report["node_balance"]
    each = ", ".join(f"{nb[f'dist_ratio_{k}']:.4f} ({label})" for k, label in phases)
    print(f"  node balance: dist ratio of node totals {each}")
    print("  pad ratio: the plan packs each group into one sequence, so no padding is spent")


def run(args: argparse.Namespace) -> int:
    from balancing.cost_model import CostModelOptions
    from balancing.parts import BalanceEngine
    from balancing.plan import BalanceConfig
    from balancing.row_memory import RowMemory
    from equishard.cli._common import check_output_dir, fail
    from equishard.common.options import config_kwargs
    from equishard.contracts.columns import GROUP_LLM_TOKENS

    try:
        model = CostModelOptions(**config_kwargs(CostModelOptions, args)).build()
        cfg = BalanceConfig(**config_kwargs(BalanceConfig, args), cost_model=model)
        memory = RowMemory(**config_kwargs(RowMemory, args))
        engine = BalanceEngine(**config_kwargs(BalanceEngine, args))
        check_output_dir(args.output)
        for name in (PLAN_PARQUET, PLAN_REPORT):  # written there: never over the input
            out = Path(args.output) / name
            if out.is_file() and os.path.samefile(out, args.cost_table):
                raise ValueError(
                    f"{args.cost_table} is the plan's own {out}: balance would replace its cost "
                    "table with the plan; give another -o directory"
                )
    except (ValueError, OSError) as exc:
        return fail(str(exc))
    if engine.partitioned:
        code, result = _partitioned(args, cfg, engine)
    else:
        code, result = _whole(args, cfg)
    if result is None:
        return code
    largest = result.column_max(GROUP_LLM_TOKENS) or 0
    warning = memory.warning(int(largest))
    if args.json:  # report.json with the shape every command's --json has in front
        r = result.report
        counts = {**r["counts"], "rejected": 0}  # balance drops nothing: in == out
        warnings = {"warnings": [warning]} if warning else {}
        print(json.dumps({"command": "balance", "status": "ok", **r, "counts": counts, **warnings}))
    else:
        print_report(result.report, args.output)
    if warning:
        print(f"equishard balance: warning: {warning}", file=sys.stderr)
    return 0


def _whole(args: argparse.Namespace, cfg):
    """(exit code, the plan or None) of a plan made whole in this process."""
    from concurrent.futures import ThreadPoolExecutor

    from balancing.plan import build_plan, write_plan
    from equishard.cli._common import fail, os_failure
    from equishard.contracts.cost_table import (
        check_repeated_ids,
        read_cost_table,
        table_phases,
        validate_cost_table,
    )
    from equishard.contracts.phases import check_balanced, encoder_phases
    from equishard.contracts.shared_tower import fold_shared_towers

    try:
        table = read_cost_table(args.cost_table, required_only=True, validate=False)
        table_phases(table, args.cost_table)  # the columns agree with the recorded phases
        table = fold_shared_towers(table)  # video frames the vision tower runs: its load
        check_balanced(encoder_phases(table.column_names), args.cost_table)
        # every rule the balancer's counts depend on first; the repeated-id check (most of the
        # checking at 10M rows, and its hash table 8 bytes a slot) later, on the other core
        # while the plan is written, and before the plan is published
        validate_cost_table(table, args.cost_table, repeated_ids=False)
        ids = table.select(["sample_id"])  # all that check reads (the plan holds them too)
        # the plan is built holding only what it reads of the table: this frame lets go
        # (its ViT sequence lists, sources and counts: ~0.5 GB at 10M rows)
        held = [table]
        del table
        result = build_plan(held.pop(), cfg)
    except (ValueError, OSError) as exc:
        return fail(str(exc)), None
    try:
        with ThreadPoolExecutor(1) as pool:
            ids_checked = pool.submit(check_repeated_ids, ids, args.cost_table)
            write_plan(result, args.output, before_publish=ids_checked.result)
    except ValueError as exc:  # a repeated id: nothing published
        return fail(str(exc)), None
    except OSError as exc:  # a full disk, a directory taken away: a failed run
        return fail(f"{args.output}: {os_failure(exc, 'writing the plan')}", 1), None
    return 0, result


def _partitioned(args: argparse.Namespace, cfg, engine):
    """(exit code, the plan or None) of a plan over partitions (:mod:`balancing.partitioned`):
    the workers check the ids across partitions before anything is published."""
    from balancing.partitioned import build_partitioned_plan
    from balancing.parts import open_parts, repeated_ids_message
    from balancing.plan import write_plan
    from equishard.cli._common import fail, os_failure
    from equishard.contracts.cost_table import cost_table_rows

    path = args.cost_table

    def ids_checked() -> None:
        message = repeated_ids_message(path, parts.repeated_ids())
        if message:
            raise ValueError(message)

    try:
        n = cost_table_rows(path)
        if n == 0:
            raise ValueError(f"{path}: the cost table has no rows: nothing to balance")
        parts, bounds = open_parts(engine, path, n, cfg.cost_model)
    except (ValueError, OSError, ImportError) as exc:
        return fail(str(exc)), None
    with parts:
        try:
            result = build_partitioned_plan(path, cfg, parts, bounds)
        except (ValueError, OSError) as exc:
            return fail(str(exc)), None
        except RuntimeError as exc:  # a worker died or hung: a failed run
            return fail(str(exc), 1), None
        try:
            write_plan(result, args.output, before_publish=ids_checked)
        except ValueError as exc:  # a repeated id: nothing published
            return fail(str(exc)), None
        except RuntimeError as exc:
            return fail(str(exc), 1), None
        except OSError as exc:
            return fail(f"{args.output}: {os_failure(exc, 'writing the plan')}", 1), None
    return 0, result
