"""Balancing benchmarks on the real InternVL length data (issue 3's targets)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from balancing._kernels.partition import _nb_argsort_desc, _nb_lpt
from balancing.nodewise import (
    inter_node_volume,
    locality_balance,
    nodewise_permutation,
    volume_matrix,
)
from balancing.plan import BalanceConfig, build_plan
from balancing.post_balance import post_balance
from bench._internvl import cost_table, load_lengths

HERE = Path(__file__).resolve().parent


def _median_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _offline(lines: list[str], raw: dict) -> None:
    tiles, llm = load_lengths()
    table = cost_table(tiles, llm)
    cfg = BalanceConfig(dp=8, target_batch=4, seed=0)
    build_plan(table, cfg)  # compiled kernels loaded
    sec, r = _median_time(lambda: build_plan(table, cfg), 7)
    rep = r.report
    b, rnd, full = (
        rep["metrics"]["balanced"],
        rep["metrics"]["random"],
        rep["metrics"]["balanced_full_steps"],
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cost.parquet"
        pq.write_table(table, path)
        cmd = [
            sys.executable,
            "-m",
            "equishard",
            "balance",
            str(path),
            "--dp",
            "8",
            "-o",
            str(Path(tmp) / "plan"),
            "--json",
        ]
        subprocess.run(cmd, check=True, capture_output=True)  # numba cache warm
        cli = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            cli.append(time.perf_counter() - t0)
    cli_s = statistics.median(cli)
    c = rep["counts"]
    tr = rep["trend"]
    raw["offline"] = {"seconds_in_process": sec, "seconds_cli": cli_s, "report": rep}

    def ok(flag: bool) -> str:
        return "met" if flag else "**not met**"

    lines += [
        "### Offline plan on the real InternVL data",
        "",
        f"{c['in']:,} samples (ai2d 12k + chartqa 18k; 1 tile = 1024 patches, 256 LLM tokens), DP = 8, "
        f"target batch 4, seed 0. Caps chosen automatically: vision {rep['parameters']['isf']['q_v']}, "
        f"LLM {rep['parameters']['isf']['q_t']} tokens. OmniBal's public code on the same subsets: "
        "3.3 s parameter search + 0.25 s ISF, dist ratio 0.0065 (vision) / 0.045 (LLM), "
        "average group size 4.14.",
        "",
        "| measure | random batches of 4 | equishard (all steps) | equishard (full steps) | target | |",
        "|---|---|---|---|---|---|",
        f"| dist ratio, vision tokens | {rnd['dist_ratio_vit']:.4f} | {b['dist_ratio_vit']:.6f} | {full['dist_ratio_vit']:.6f} | <= 0.001 | {ok(b['dist_ratio_vit'] <= 0.001)} |",
        f"| dist ratio, LLM tokens | {rnd['dist_ratio_llm']:.4f} | {b['dist_ratio_llm']:.6f} | {full['dist_ratio_llm']:.6f} | <= 0.001 | {ok(b['dist_ratio_llm'] <= 0.001)} |",
        f"| efficiency, vision modeled cost | {rnd['efficiency_vit_cost']:.4f} | {b['efficiency_vit_cost']:.5f} | {full['efficiency_vit_cost']:.5f} | >= 0.995 | {ok(b['efficiency_vit_cost'] >= 0.995)} |",
        f"| efficiency, LLM modeled cost | {rnd['efficiency_llm_cost']:.4f} | {b['efficiency_llm_cost']:.5f} | {full['efficiency_llm_cost']:.5f} | >= 0.995 | {ok(b['efficiency_llm_cost'] >= 0.995)} |",
        f"| pad ratio (if padded), LLM | {rnd['pad_ratio_llm']:.4f} | {b['pad_ratio_llm']:.4f} (packed: 0) | | | |",
        f"| average group size | 4 | {c['avg_group_size']} | | 4 +- 10% | {ok(abs(c['avg_group_size'] - 4) <= 0.4)} |",
        f"| samples dropped | 0 | {c['in'] - c['out']} | | 0 | {ok(c['in'] == c['out'])} |",
        f"| time in process, parameters included | | {sec * 1000:.0f} ms | | <= 100 ms | {ok(sec <= 0.1)} |",
        f"| `equishard balance` command, interpreter start included | | {cli_s:.2f} s | | <= 2 s | {ok(cli_s <= 2)} |",
        "",
        f"Step order carries no trend: Spearman's rho between step index and step load is "
        f"{tr['vit']['spearman']:+.3f} (vision) and {tr['llm']['spearman']:+.3f} (LLM); the second half of "
        f"the epoch carries {tr['vit']['second_half_over_first']:.4f}x / {tr['llm']['second_half_over_first']:.4f}x "
        f"the first half's mean step load. Groups: {c['groups_by_flag']}; the last step "
        f"({rep['last_step']['samples']} samples re-packed over 8 ranks) is why 'all steps' differs from "
        "'full steps'. Modeled cost: " + rep["parameters"]["cost_model"]["source"] + ".",
        "",
    ]


def _scale(lines: list[str], raw: dict) -> None:
    rows = []
    for n, limit_s in ((1_200_000, 1.0), (10_000_000, 10.0)):
        out = subprocess.run(
            [sys.executable, str(HERE / "_scale_worker.py"), str(n)],
            check=True,
            capture_output=True,
            text=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["limit_s"] = limit_s
        rows.append(r)
        print(r, flush=True)
    raw["scale"] = rows
    lines += [
        "### Scale (rows resampled from the real data)",
        "",
        "| rows | time in process | target | peak RSS | target | dist ratio vision / LLM | phases (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        met = "met" if r["seconds"] <= r["limit_s"] else "**not met**"
        rss = f"{r['peak_rss_mb'] / 1024:.2f} GiB"
        rss_t = (
            "<= 4 GB, " + ("met" if r["peak_rss_mb"] <= 4000 else "**not met**")
            if r["rows"] >= 10_000_000
            else "-"
        )
        phases = ", ".join(f"{k} {v}" for k, v in r["phases"].items())
        lines.append(
            f"| {r['rows']:,} | {r['seconds']:.2f} s | <= {r['limit_s']:g} s, {met} | {rss} | {rss_t} | "
            f"{r['dist_ratio_vit']} / {r['dist_ratio_llm']} | {phases} |"
        )
    lines += [
        "",
        "Time in process is the median of three builds in one process; peak RSS includes the "
        "input table itself (here the caller keeps it; the command does not). The report's "
        "random-batching baseline runs on the second core while the steps are assigned (its "
        "kernel releases the GIL), and the plan's per-sample columns are made when the table "
        "is asked for (the command writes them a million rows at a time instead). What limits "
        "the 10M case: ISF's ten Fisher-Yates shuffles of the remaining (index, loads) records "
        "(37.6M records in all at 10M rows, about 2 s of random memory access: a "
        "cache-friendlier shuffle would draw another permutation, so another plan, for the "
        "same seed), the first touch of freshly allocated pages on this VM, and the sorts of "
        "the step assignment. The command adds reading the table (~1.2 s), the repeated-id "
        "check (1.25 s, on the second core while the plan is written) and writing plan.parquet "
        "(~1.4 s).",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="equishard-bench-") as work:
        out = subprocess.run(
            [sys.executable, str(HERE / "_command_worker.py"), "10000000", work],
            check=True,
            capture_output=True,
            text=True,
        )
    c = json.loads(out.stdout.strip().splitlines()[-1])
    print(c, flush=True)
    raw["commands"] = c
    b, i = c["balance"], c["import_lengths"]
    rate = c["rows"] / max(i.get("cpu_seconds", i["seconds"]), 1e-9)  # rows a CPU-second

    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    lines += [
        "### The commands at 10M rows, as a user runs them",
        "",
        "Each a fresh `python -m equishard` process, timed from outside; peak RSS is the "
        "process's own (`VmHWM`, read as it exits).",
        "",
        "| command | wall | target | peak RSS | target |",
        "|---|---|---|---|---|",
        f"| `equishard balance` (read the table, DP 64 on 8 nodes, write the plan) | "
        f"{b['seconds']:.1f} s | <= 8 s, {met(b['seconds'] <= 8)} | "
        f"{b['peak_rss_mb'] / 1024:.2f} GiB | <= 3 GB, {met(b['peak_rss_mb'] * 2**20 <= 3e9)} |",
        f"| `equishard import-lengths` ({i['json_mb']} MB JSON list) | {i['seconds']:.1f} s "
        f"({i['cpu_seconds']:.1f} CPU-s: {rate / 1e6:.2f}M rows/s a core) | >= 1M rows/s a core, "
        f"{met(rate >= 1e6)} | {i['peak_rss_mb'] / 1024:.2f} GiB | <= 1 GB, "
        f"{met(i['peak_rss_mb'] * 2**20 <= 1e9)} |",
        "",
        "import-lengths: each window of the list is decoded in one call by orjson (by the "
        "standard library's `json` where orjson refuses it, or where its entries are not all "
        "plain integers: orjson turns an integer past 64 bits into a float), its entries checked "
        "as whole int64 columns (a batch holding a value of another type checked entry by "
        "entry), sample ids joined in arrow. Tried on 2M rows (2026-12-07): `json` alone 3.7 s "
        "for the command, orjson 2.4 s; pyarrow's JSON reader (the list rewritten as JSON lines "
        "first) decoded no faster than `json`.",
        "",
    ]
    tch = c.get("touch")
    if tch:
        lines += [
            f"What stops 8 s on this machine is the price of fresh memory: a fresh process "
            f"touching {b['peak_rss_mb'] / 1024:.2f} GiB (the command's peak) takes "
            f"{tch['first']:.1f} s the first time ({tch['sys_seconds']:.1f} s of it in the "
            f"kernel, faulting the pages in) and {tch['again']:.2f} s again in the same process. "
            "The VM backs a page only when it is first touched (0.2-0.3 s per GB on bare metal), "
            "so a command pays it once per run, while the in-process build above (median of "
            "three, the later ones on pages already backed) does not. The command's own work is "
            "the in-process build plus reading (~1.2 s) and writing (~1.5 s); 8 s here would "
            "need a peak well under 1 GB. Since 2026-12-07 the plan is written a million rows "
            "at a time and the table's unread columns are let go (2.40 GiB before; the wall is "
            "within this VM's spread between runs, 12-16 s).",
            "",
        ]
    _one_machine(lines, raw, b)


PROJECTED_ROWS = 100_000_000
PROJECTED_LIMIT_GIB = 12.0


def _one_machine(lines: list[str], raw: dict, at_10m: dict) -> None:
    """The balance command's peak at 30M rows beside 10M's, and the line through them at 100M
    (issue 69: <= 12 GiB on one machine)."""
    with tempfile.TemporaryDirectory(prefix="equishard-bench-") as work:
        out = subprocess.run(
            [sys.executable, str(HERE / "_command_worker.py"), "30000000", work, "balance"],
            check=True,
            capture_output=True,
            text=True,
        )
    at_30m = json.loads(out.stdout.strip().splitlines()[-1])["balance"]
    points = [(10_000_000, at_10m), (30_000_000, at_30m)]
    per_row = (at_30m["peak_rss_mb"] - at_10m["peak_rss_mb"]) / 20_000_000  # MiB a row
    projected = (at_10m["peak_rss_mb"] + per_row * (PROJECTED_ROWS - 10_000_000)) / 1024
    raw["one_machine"] = {"30M": at_30m, "mib_per_million_rows": per_row * 1e6,
                          "projected_100m_gib": projected}  # fmt: skip
    verdict = "met" if projected <= PROJECTED_LIMIT_GIB else "**not met**"
    lines += [
        "### One machine at 100M rows (projected from 10M and 30M)",
        "",
        "| rows | `equishard balance` wall | peak RSS | target |",
        "|---|---|---|---|",
        *(
            f"| {n:,} | {r['seconds']:.1f} s | {r['peak_rss_mb'] / 1024:.2f} GiB | - |"
            for n, r in points
        ),
        f"| {PROJECTED_ROWS:,} (projected) | - | {projected:.1f} GiB "
        f"({per_row * 1e6:.0f} MiB a million rows) | <= {PROJECTED_LIMIT_GIB:g} GiB, {verdict} |",
        "",
        "The line through the two measured peaks. Since 2026-12-07 (2.46 GiB at 10M before): the "
        "plan's per-sample columns are made a million rows at a time as plan.parquet is written "
        "(`balancing.plan_rows`), the table's columns the plan does not read are let go before "
        "the build (the command passes its table on; arrow's pool returns the pages), the cost "
        "table's sum check runs a million rows at a time, ISF moves the samples a round "
        "leaves within one array of records, the random-batching baseline lets go of its "
        "permutation and batch table once read and runs beside the step assignment, and the "
        "repeated-id check (its hash table) runs while the plan is written. The peak is now "
        "while the steps are assigned: the four float64 loads (32 bytes a sample), the sample "
        "ids (~14), the assignment's keys and group columns, and the baseline's permutation and "
        "batch table on the second core.",
        "",
    ]


def _runtime(lines: list[str], raw: dict) -> None:
    _, llm = load_lengths()
    rng = np.random.default_rng(0)
    rows = []
    for d, limit_ms, limit_imb in ((2560, 10.0, 1.0001), (64, 1.0, 1.00005)):
        x = llm[rng.integers(0, llm.size, d * 60)].astype(np.float64)
        for method in ("auto", "lpt", "kk_equal", "best"):
            post_balance(x, d, method=method)
            sec, r = _median_time(lambda m=method, x=x, d=d: post_balance(x, d, method=m), 21)
            rows.append(
                {
                    "d": d,
                    "n": x.size,
                    "method": method,
                    "chosen": r.method,
                    "ms": sec * 1000,
                    "imbalance": r.imbalance,
                    "limit_ms": limit_ms,
                    "limit_imb": limit_imb,
                }
            )
        order = _nb_argsort_desc(x)
        plain = np.empty(x.size, dtype=np.int64)
        loads = _nb_lpt(x, order, d, plain)
        rows.append(
            {
                "d": d,
                "n": x.size,
                "method": "lpt, no refinement",
                "chosen": "lpt",
                "ms": float("nan"),
                "imbalance": float(loads.max() / loads.mean()),
                "limit_ms": limit_ms,
                "limit_imb": limit_imb,
            }
        )
    raw["runtime"] = rows
    lines += [
        "### Runtime post-balancing (real LLM lengths, 60 samples per rank)",
        "",
        "Plain-Python references from the issue: LPT ~140 ms at d = 2560 (max/mean 1.0022); "
        "Karmarkar-Karp ~0.9 s at d = 64 and ~26 s at d = 512 (1.00001).",
        "",
        "| d | sequences | method (ran) | median time | max/mean | targets (time, max/mean) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ms = "-" if np.isnan(r["ms"]) else f"{r['ms']:.2f} ms"
        if np.isnan(r["ms"]):
            target = "reference point: the LPT start before refinement"
        else:
            t_ok = "met" if r["ms"] <= r["limit_ms"] else "**not met**"
            i_ok = "met" if r["imbalance"] <= r["limit_imb"] else "**not met**"
            target = f"<= {r['limit_ms']:g} ms {t_ok}, <= {r['limit_imb']} {i_ok}"
        lines.append(
            f"| {r['d']} | {r['n']:,} | {r['method']} ({r['chosen']}) | {ms} | {r['imbalance']:.7f} | {target} |"
        )
    lines += [
        "",
        "`auto` is LPT followed by the move-and-swap refinement (the heaviest rank against the "
        "lightest that can take a move or swap); `best` also runs equal-count Karmarkar-Karp and "
        "keeps the better. What limits d = 2560: LPT's 153,600 dependent updates of a "
        "12-level tournament tree (~40 ns each, ~6 ms), then the swap refinement down to the 2e-5 tolerance (~5,000 swaps of ~1 us, each a merge walk over two ranks' sorted items); and the 59 merges of 2,560-wide partial solutions "
        "in KK, each needing a sort.",
        "",
    ]


def _nodewise(lines: list[str], raw: dict) -> None:
    _, llm = load_lengths()
    rng = np.random.default_rng(1)
    d, per = 512, 8
    x = llm[rng.integers(0, llm.size, d * 60)].astype(np.float64)
    src = np.repeat(np.arange(d), 60)
    lpt = post_balance(x, d, method="lpt")
    nodewise_permutation(src, lpt.dest, x, d, per)
    t_alg3, nw = _median_time(lambda: nodewise_permutation(src, lpt.dest, x, d, per), 11)
    locality_balance(x, src, d, per)
    t_loc, loc = _median_time(lambda: locality_balance(x, src, d, per), 11)
    t_perm, nw2 = _median_time(lambda: nodewise_permutation(src, loc.dest, x, d, per), 11)
    v_loc = volume_matrix(src, loc.dest, x, d)
    after = inter_node_volume(v_loc, nw2.rank_of_batch, per)[0]
    base = nw.inter_node_identity
    red = 1 - after / base
    raw["nodewise"] = {
        "alg3_on_lpt": {"ms": t_alg3 * 1000, "reduction": nw.reduction},
        "locality_then_alg3": {
            "ms": (t_loc + t_perm) * 1000,
            "reduction": red,
            "imbalance": loc.imbalance,
        },
    }
    lines += [
        "### Node-wise rearrangement (d = 512, 8 ranks per node, real LLM lengths)",
        "",
        "| approach | inter-node volume vs LPT batches placed as is | time | max/mean | target |",
        "|---|---|---|---|---|",
        f"| LPT + Alg. 3 permutation ({nw.method}) | -{nw.reduction:.1%} | {t_alg3 * 1000:.2f} ms | {lpt.imbalance:.6f} | |",
        f"| locality-first balancing + Alg. 3 permutation | -{red:.1%} | {(t_loc + t_perm) * 1000:.2f} ms | "
        f"{loc.imbalance:.6f} | >= 50% less, <= 10 ms: {'met' if red >= 0.5 and (t_loc + t_perm) <= 0.01 else '**not met**'} |",
        "",
        "LPT builds every new batch from samples of all 512 ranks, so no placement of those batches "
        "keeps much traffic inside a node (Alg. 3 alone saves the few percent above). Balancing with "
        "locality — each rank keeps its samples up to the balanced load, overflow goes to a rank of "
        "the same node first — moves only the excess and keeps it mostly inside nodes, at the same "
        "balance after swap refinement.",
        "",
    ]


def run() -> dict:
    lines: list[str] = []
    raw: dict = {}
    _offline(lines, raw)
    _runtime(lines, raw)
    _nodewise(lines, raw)
    _scale(lines, raw)
    for line in lines:
        print(line)
    return {
        "title": "Balancing",
        "markdown": "\n".join(lines),
        "raw": json.loads(json.dumps(raw, default=float)),
    }
