"""Nightly rebalancing against rebuilding everything.

A 4,000-sample demo set arrives over two days (day 1: 60%; day 2: the other 40%, 5 updates, 3
deletions). Day 1 goes through prep -> balance -> write. Then day 2 either through
``equishard rebalance`` (prep of the new inputs only, with the cache; incremental plan; kept
groups copied from the current shards) or through a full rebuild (prep of everything, balance,
write a new generation from the raw data). Both end with the same samples; we compare time and
balance, and how much of the work the nightly path skipped.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

SAMPLES = 4000


def run() -> dict:
    from balancing.plan import BalanceConfig, build_plan, write_plan
    from dataprep import PrepConfig, make_demo, read_cost_table, run_prep
    from dataprep.demo import split_days
    from shards import WriteConfig, open_generation, write_generation
    from shards.nightly.rebalance import RebalanceConfig, run_rebalance

    cfg = BalanceConfig(dp=8, nodes=2, target_batch=4)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        raw = root / "raw"
        make_demo(raw, samples=SAMPLES, seed=3, images=1500)
        split_days(raw, days=2, seed=3)
        tok = str(raw / "tokenizer.json")

        def full(inputs, out, deletions=()):
            t0 = time.perf_counter()
            cost = out / "cost.parquet"
            run_prep(
                PrepConfig(
                    inputs=tuple(inputs),
                    output=str(cost),
                    tokenizer=tok,
                    image_root=str(raw),
                    workers=2,
                )
            )
            table = read_cost_table(cost)
            if deletions:
                import pyarrow as pa
                import pyarrow.compute as pc

                ids = table.column("sample_id")
                # day 2 re-submits updated ids: the later row wins, deletions go
                last = {s: i for i, s in enumerate(ids.to_pylist())}
                keep = [last[s] == i and s not in deletions for i, s in enumerate(ids.to_pylist())]
                table = table.filter(pa.array(keep))
                assert pc.count_distinct(table.column("sample_id")).as_py() == table.num_rows
            write_plan(build_plan(table, cfg), out / "plan")
            if deletions:
                import pyarrow.parquet as pq

                from equishard.contracts.cost_table import METADATA_KEY

                meta = pq.read_metadata(cost).metadata
                pq.write_table(
                    table.replace_schema_metadata({METADATA_KEY: meta[METADATA_KEY]}), cost
                )
            write_generation(
                WriteConfig(
                    plan_dir=str(out / "plan"),
                    cost_table=str(cost),
                    out=str(out / "shards"),
                    shard_size=256 << 20,
                    workers=2,
                )
            )
            return time.perf_counter() - t0

        day1 = root / "day1"
        t_day1 = full([raw / "day-1.jsonl"], day1)
        t0 = time.perf_counter()
        r = run_rebalance(
            RebalanceConfig(
                current=str(day1 / "shards"),
                new=(str(raw / "day-2.jsonl"),),
                delete=str(raw / "day-2.delete"),
                workers=2,
            )
        )
        t_nightly = time.perf_counter() - t0
        gone = set((raw / "day-2.delete").read_text().split())
        rebuild = root / "rebuild"
        t_full = full([raw / "day-1.jsonl", raw / "day-2.jsonl"], rebuild, gone)
        m_night = open_generation(day1 / "shards")
        m_full = open_generation(rebuild / "shards")
    assert m_night.totals["samples"] == m_full.totals["samples"]
    bn, bf = m_night.report["metrics"]["balanced"], m_full.report["metrics"]["balanced"]
    c, p = r.counts, r.plan
    md = [
        f"{SAMPLES:,}-sample demo set arriving over two days (day 2: {c['new']:,} new samples, "
        f"{c['updated']} updates, {c['deleted']} deletions), DP 8 on 2 nodes, 2 workers.",
        "",
        "| day 2 through | seconds | samples | dist ratio vision / LLM | efficiency vision / LLM |",
        "|---|---|---|---|---|",
        f"| `equishard rebalance` | {t_nightly:.2f} | {m_night.totals['samples']:,} | "
        f"{bn['dist_ratio_vit']:.4f} / {bn['dist_ratio_llm']:.4f} | "
        f"{bn['efficiency_vit']:.4f} / {bn['efficiency_llm']:.4f} |",
        f"| full rebuild (prep, balance, write everything) | {t_full:.2f} | "
        f"{m_full.totals['samples']:,} | {bf['dist_ratio_vit']:.4f} / {bf['dist_ratio_llm']:.4f} | "
        f"{bf['efficiency_vit']:.4f} / {bf['efficiency_llm']:.4f} |",
        "",
        f"Day 1 alone (prep, balance, write {c['carried_in']:,} samples): {t_day1:.2f} s. The "
        f"nightly run measured {c['read']:,} records ({c['not_reread']} taken from the cache), "
        f"kept {p['kept_steps']} of the parent's steps as they were ({p['kept_samples']:,} "
        f"samples) and rebuilt {p['rebuilt_parent_steps']} "
        f"({', '.join(f'{k}: {v}' for k, v in sorted(p['rebuilt_because'].items()))}) into "
        f"{p['new_steps']} new steps with the {c['new']:,} new samples; carried samples were "
        "copied from the parent's shards, not read from the raw files again.",
        "",
        "Where the nightly seconds go: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in r.phases.items())
        + f" (of {r.seconds:.2f} s). On this small set with a warm page cache both paths are "
        "dominated by writing the whole generation and by process start-up, so the nightly path "
        + (
            "wins little"
            if t_nightly < t_full
            else "is no faster (it also checks every kept "
            "group's samples and the parent's carried tables)"
        )
        + "; what it saves grows with the share of prep in a rebuild: prep touches only "
        "the new and changed records (tokenizing long conversations, opening images on network "
        "storage), and kept groups are byte copies that need no raw data at all (each group's "
        "samples are first checked as the loader reads them: about 0.2 ms a sample here).",
    ]
    return {
        "title": "Nightly rebalancing",
        "markdown": "\n".join(md),
        "raw": {"nightly_s": t_nightly, "full_s": t_full, "day1_s": t_day1, "counts": c, "plan": p},
    }
