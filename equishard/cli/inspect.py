"""``equishard inspect``: manifest summary and per-stream loads of a generation."""

from __future__ import annotations

import argparse
import json

from equishard.cli._common import add_store_args

__all__ = ["add_parser", "run"]

# the line the top-level --help shows
HELP = "summarize a generation: layout, totals, per-stream loads"


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(
        name,
        help=HELP,
        description="Print a generation's manifest summary and one line per stream.",
    )
    p.add_argument(
        "generation", metavar="GEN", help="a generation directory, or a root with CURRENT"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    add_store_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from equishard.cli._common import fail, format_table
    from shards.read.verify import inspect_generation
    from shards.store.manifest import ManifestError

    try:
        info = inspect_generation(args.generation)
    except ManifestError as exc:
        return fail(str(exc))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    t, lay = info["totals"], info["layout"]
    print(
        f"generation {info['generation']} (parent {info['parent'] or '-'})\n  {info['path']}\n"
        f"  {lay['nodes']} node(s) x {lay['gpus_per_node']} ranks, {lay['steps']} steps; "
        f"{t['samples']} samples, "
        f"{t['groups']} groups, {t['shards']} shards, {t['bytes'] / 2**20:.1f} MiB"
    )
    b = info["balance"]
    if b:
        from equishard.cli.balance import shown_phases

        shown = shown_phases(b)
        print(
            "  plan balance: dist ratio "
            + " / ".join(f"{b[f'dist_ratio_{k}']:.4f}" for k, _ in shown)
            + f" ({' / '.join(v for _, v in shown)}), efficiency "
            + " / ".join(f"{b[f'efficiency_{k}']:.4f}" for k, _ in shown)
        )
    prep = info.get("prep") or {}
    if prep:
        t = prep.get("template") or {}
        tok = prep.get("tokenizer") or {}
        pol = prep.get("vision_policy") or {}
        family = f", images: {t['image_tokens']}" if t.get("image_tokens") else ""
        content = f", content: {t['content']}" if t.get("content") else ""
        print(f"  measured with: vision policy {pol.get('spec', '?')}")
        print(
            f"                 template {t.get('source') or t.get('name', '?')}"
            f" ({t.get('kind', 'builtin')}{family}{content}"
            + (f", sha256 {t['sha256'][:12]}" if t.get("sha256") else "")
            + ")"
        )
        if tok.get("mode") == "tokenizer":
            print(
                f"                 tokenizer {tok.get('path')} (sha256 {tok.get('sha256', '')[:12]})"
            )
        elif tok:
            print(f"                 tokenizer estimate, {tok.get('chars_per_token')} chars/token")
        ro = prep.get("read_options") or {}
        # image_roots: [input, root] pairs, one per night's input (shards/nightly/night_inputs.py)
        pairs = ro.get("image_roots") if isinstance(ro.get("image_roots"), list) else []
        where = {p[1] for p in pairs if isinstance(p, list | tuple) and len(p) == 2}
        where |= {ro.get("image_root")} if ro.get("image_root") else set()
        if where:
            print(f"                 image root(s) {', '.join(sorted(map(str, where)))}")
    night = info.get("nightly")
    if night:
        c, p = night["counts"], night["plan"]
        print(
            f"  nightly: {c['carried_in']} carried + {c['new']} new - {c['deleted']} deleted = "
            f"{c['out']} ({c['updated']} updated); {p['kept_steps']} steps kept from the parent, "
            f"{p['rebuilt_parent_steps']} rebuilt, {p['new_steps']} built that night"
        )
    rows = [
        (
            f"{s['node']}/{s['local_rank']}",
            s["rank"],
            s["shards"],
            s["groups"],
            s["samples"],
            f"{s['bytes'] / 2**20:.1f}",
        )
        for s in info["streams"]
    ]
    print()
    print(format_table(["node/local", "rank", "shards", "groups", "samples", "MiB"], rows))
    return 0
