"""Padding of the pipeline's microbatch slots: one fixed row size (sized for the largest sample
and group of the data) against row sizes from a ladder chosen per step (the trainer's
``plan_step``), with every sample whole and with samples cut across rows, on the demo generation
and on a plan of the real InternVL lengths.

Every step of the plan is packed as the trainer packs it: each replica's samples (its group, as
planned, or after the trainer's LLM-phase redistribution: LPT over the step's samples under the
replicas' token cap) into ``microbatches`` rows, MMScale-ordered. Padding = 1 - real tokens /
(rows x row size), over all steps and replicas.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from balancing import post_balance
from balancing.plan import BalanceConfig, build_plan
from bench._internvl import cost_table as internvl_table
from bench._internvl import load_lengths
from dataprep import PrepConfig, make_demo, read_cost_table, run_prep
from trainer_adapter.train.pipeline import bucket_ladder, plan_step
from trainer_adapter.train.trainer import auto_mb_tokens

DP, NODES, TARGET = 8, 2, 0.10
LAYOUTS = [(2, 4), (4, 8)]  # (pp, microbatches): the default 2 x pp, and PP4 with 8


def _demo_table():
    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "raw"
        make_demo(raw, samples=1000, seed=0)
        cost = Path(d) / "cost.parquet"
        run_prep(
            PrepConfig(
                inputs=(str(raw / "demo.jsonl"),),
                output=str(cost),
                tokenizer=str(raw / "tokenizer.json"),
                image_root=str(raw),
            )
        )
        return read_cost_table(cost)


def _steps(table, plan):
    """Per step, the LLM lengths of each rank's group: [step][rank] -> array."""
    llm = dict(
        zip(table["sample_id"].to_pylist(), table["llm_tokens"].to_numpy().tolist(), strict=True)
    )
    steps: dict[int, list[list[int]]] = {}
    for sid, step, rank in zip(
        plan["sample_id"].to_pylist(),
        plan["step"].to_pylist(),
        plan["rank"].to_pylist(),
        strict=True,
    ):
        steps.setdefault(step, [[] for _ in range(DP)])[rank].append(llm[sid])
    return [[np.array(r, dtype=np.float64) for r in steps[s]] for s in sorted(steps)]


def _padding(steps, n_micro, pp, mb_max, ratio, redistribute, split=False):
    """Padding share of all microbatch slots, empty-row share, samples cut per replica-step and
    the mean longest chain of rows joined by cut samples."""
    buckets = bucket_ladder(mb_max, ratio)
    tokens = slots = empty = rows = cut = chain = plans = 0
    for ranks in steps:
        if redistribute:
            x = np.concatenate(ranks)
            pb = post_balance(x, DP, method="lpt", memory_cap=float(n_micro * mb_max))
            ranks = [x[pb.dest == r] for r in range(DP)]
        for lens in ranks:
            mb, plan = plan_step(lens, n_micro, buckets, pp, split=split)
            tokens += lens.sum()
            slots += n_micro * mb
            empty += sum(1 for r in plan.rows if not r)
            rows += n_micro
            cut += plan.n_cut
            chain += max(plan.chains)
            plans += 1
    return {
        "padding": 1.0 - tokens / slots,
        "empty": empty / rows,
        "cut_per_step": cut / plans,
        "longest_chain": chain / plans,
    }


def run() -> dict:
    tiles, llm = load_lengths()
    scenarios = {
        "demo generation (make shards: 1,000 samples, InternVL policy)": _demo_table(),
        "real InternVL lengths (ai2d + chartqa, 30,730 samples)": internvl_table(tiles, llm),
    }
    lines = [
        "Padding share of the LLM microbatch slots (lower is better; target <= 10 %), DP 8 on 2 "
        "nodes, plans with target batch 4. *fixed*: every step runs rows sized for the data's "
        "largest sample and group; *whole*: the smallest of a ladder of row sizes (each 1.08x "
        "the last) that holds the step with every sample whole; *cut*: the same ladder, samples "
        "cut across rows where whole ones leave rows uneven (`equishard train`'s default; "
        "attention and gradient carried across the cut). *as planned*: each replica runs its "
        "planned group; *redistributed*: after the trainer's LLM-phase balancing (LPT under the "
        "token cap). Samples cut and the longest chain of rows joined by cuts are means per "
        "replica and step (a chain runs its backwards last row first, so under 1F1B its rows' "
        "activations are held together).",
        "",
        "| data | PP | microbatches | rows | fixed | whole, as planned | whole, redistributed | "
        "cut, as planned | cut, redistributed | empty rows (cut, redistributed) | "
        "samples cut / longest chain | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    raw = {}
    runs = [(name, table, None) for name, table in scenarios.items()]
    real = list(scenarios.items())[-1]
    runs += [(f"{real[0]}, target batch 4 x microbatches", real[1], m) for _, m in LAYOUTS]
    for name, table, batch_per_micro in runs:
        layouts = [x for x in LAYOUTS if batch_per_micro in (None, x[1])]
        target = 4 if batch_per_micro is None else 4 * batch_per_micro
        plan = build_plan(table, BalanceConfig(dp=DP, nodes=NODES, target_batch=target)).plan
        steps = _steps(table, plan)
        loads = {
            "max_sample_llm_tokens": int(pc.max(table["llm_tokens"]).as_py()),
            "max_group_llm_tokens": int(pc.max(plan["group_llm_tokens"]).as_py()),
        }
        for pp, n_micro in layouts:
            mb_max = auto_mb_tokens(loads, n_micro)
            r = {
                "fixed": _padding(steps, n_micro, pp, mb_max, 1.0, False),
                "whole": _padding(steps, n_micro, pp, mb_max, 1.08, False),
                "whole_redistributed": _padding(steps, n_micro, pp, mb_max, 1.08, True),
                "cut": _padding(steps, n_micro, pp, mb_max, 1.08, False, split=True),
                "cut_redistributed": _padding(steps, n_micro, pp, mb_max, 1.08, True, split=True),
            }
            worst = max(r["cut"]["padding"], r["cut_redistributed"]["padding"])
            met = "met" if worst <= TARGET else "**not met**"
            c = r["cut_redistributed"]
            lines.append(
                f"| {name} | {pp} | {n_micro} | up to {mb_max:,} tok | "
                + " | ".join(
                    f"{r[k]['padding']:.1%}"
                    for k in ("fixed", "whole", "whole_redistributed", "cut", "cut_redistributed")
                )
                + f" | {c['empty']:.1%} | {c['cut_per_step']:.2f} / {c['longest_chain']:.2f} "
                f"| {met} |"
            )
            raw[f"{name} pp{pp} m{n_micro}"] = {"mb_max": mb_max, **r}
    lines += [
        "",
        "With every sample whole, a replica holding about 4 samples per step for 2 x PP rows "
        "puts one sample or none in a row, and every row must fit the step's longest sample. "
        "Cutting samples sizes the rows by the step's mean load instead: what is left is the "
        "ladder's rounding (rows come in steps of 8 %) and replicas whose step is smaller than "
        "the ladder's smallest row. The price is memory, not bubble: a chain's rows run their "
        "forwards in order and their backwards in reverse, so at small groups (every row "
        "boundary cuts a sample, one chain over all rows) 1F1B holds every row's activations as "
        "GPipe does; `--whole-samples` keeps 1F1B's memory bound and pays in padding.",
    ]
    lines += ["", *_weights_table(raw)]
    return {"title": "Pipeline microbatch padding", "markdown": "\n".join(lines), "raw": raw}


_BUILD = """
import resource, sys, torch
from trainer_adapter.train.model import VisionLanguageModel, VLMConfig
keep = set(sys.argv[1].split(',')) if sys.argv[1] else None
cfg = VLMConfig.preset('1b', vocab_size=151_646, patch_dim=588)
m = VisionLanguageModel(cfg, keep_llm=None if keep is None else keep.__contains__)
n = sum(p.numel() for p in m.parameters())
print(n, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def _weights_table(raw: dict) -> list[str]:
    """Parameters a rank builds for the 1b preset, and the peak memory of building them: the
    encoder and projector on every rank, plus its pipeline stages' LLM layers (embeddings on
    stage 0, norm and head on the last; layer-count partition, the largest rank), each built in
    a fresh process as the trainer builds it (``VisionLanguageModel(keep_llm=...)``)."""
    import subprocess
    import sys

    from trainer_adapter.train.partition import layer_count_partition, stage_ranges

    n_blocks = 16  # the 1b preset's LLM layers
    names = ["tok,pos"] + [f"block{i}" for i in range(n_blocks)] + ["norm,head"]
    out = [
        "Weights a pipeline rank builds, `1b` preset (vocabulary 151,646), the largest rank of a "
        "layer-count partition: a rank builds the encoder and projector (every rank encodes "
        "images) and only its stages' LLM layers; the others are dropped as they are built, so "
        "the peak host memory of building (fp32, measured in a fresh process) follows the share.",
        "",
        "| PP | parameters built | peak memory while building |",
        "|---|---|---|",
    ]
    for pp in (1, 2, 4):
        ranges = stage_ranges(layer_count_partition(len(names), pp), len(names))
        best = None
        for lo, hi in ranges:
            keep = "" if pp == 1 else ",".join(names[lo:hi])
            res = subprocess.run(
                [sys.executable, "-c", _BUILD, keep], capture_output=True, text=True, check=True
            )
            n, peak = (int(v) for v in res.stdout.split())
            best = max(best or (0, 0), (n, peak))
            if pp == 1:
                break
        out.append(f"| {pp} | {best[0] / 1e9:.2f} B | {best[1] / 2**30:.1f} GiB |")
        raw[f"weights pp{pp}"] = {"parameters": best[0], "peak_bytes": best[1]}
    return out


if __name__ == "__main__":
    print(run()["markdown"])
