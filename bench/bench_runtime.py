"""Runtime post-balancing over the issue-41 grid: d ranks x B samples per rank, on the real
InternVL LLM lengths as token counts and as modeled cost (a 2B LLM: alpha * n + beta * n^2).

For every cell: ``auto`` against the most even of every other method (target: within 0.1 %),
its median time, and ``locality_balance`` against ``post_balance`` at B >= 4 (target: within
0.5 %), with the share of moved bytes that stays inside a node once Alg. 3 places the batches.
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from balancing.nodewise import locality_balance, nodewise_permutation
from balancing.post_balance import lower_bound, post_balance
from bench._internvl import load_lengths

GRID_D = (8, 64, 512, 2560)
GRID_B = (1, 4, 16, 64)
PER_NODE = 8
KK_MAX_ITEMS = 2048  # unequal KK takes seconds beyond this (d-wide merges per item)


def _modeled(n: np.ndarray) -> np.ndarray:
    h, layers = 1536, 28
    return 24.0 * h * h * layers * n + 2.0 * h * layers * n * n


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def _cell(llm: np.ndarray, cost: str, d: int, b: int, rng) -> dict:
    reps = 5 if d <= 64 else 2
    auto, rival, ms, loc, pb, inside = [], [], [], [], [], []
    loc_ms, moved_share, over_lpt, above_bound = [], [], [], []
    for _ in range(reps):
        x = llm[rng.integers(0, llm.size, d * b)].astype(np.float64)
        if cost == "modeled":
            x = _modeled(x)
        methods = ["lpt", "kk_equal", "best"] + (["kk"] if x.size <= KK_MAX_ITEMS else [])
        got = post_balance(x, d, method="auto")
        auto.append(got.imbalance)
        others = [post_balance(x, d, method=m).imbalance for m in methods]
        src = np.repeat(np.arange(d), b)
        if b >= 4 and d >= PER_NODE:  # the locality start (its plan, whatever it keeps)
            others.append(locality_balance(x, src, d, PER_NODE).imbalance)
        rival.append(min(others))
        ms.append(_median_ms(lambda x=x: post_balance(x, d, method="auto"), 7))
        bound = lower_bound(x, np.argsort(-x, kind="stable"), d)
        above_bound.append(float(got.loads.max() / bound))
        if got.method == "lpt":  # auto kept LPT's plan: what the rest of auto cost
            lpt_ms = _median_ms(lambda x=x: post_balance(x, d, method="lpt"), 7)
            over_lpt.append(ms[-1] / lpt_ms)
        if b >= 4 and d >= PER_NODE:
            r = locality_balance(x, src, d, PER_NODE)
            loc_ms.append(_median_ms(lambda x=x, src=src: locality_balance(x, src, d, PER_NODE), 3))
            rank = nodewise_permutation(src, r.dest, x, d, PER_NODE).rank_of_batch[r.dest]
            moved = rank != src
            loc.append(r.imbalance)
            pb.append(auto[-1])
            same = (rank // PER_NODE) == (src // PER_NODE)
            inside.append(float(x[moved & same].sum() / max(x[moved].sum(), 1e-300)))
            moved_share.append(float(x[moved].sum() / x.sum()))
    row = {
        "cost": cost,
        "d": d,
        "B": b,
        "auto": float(np.mean(auto)),
        "best_other": float(np.mean(rival)),
        "worst_ratio": float(max(a / r for a, r in zip(auto, rival, strict=True))),
        "auto_ms": float(np.median(ms)),
        "above_bound": float(np.mean(above_bound)),
        "over_lpt": float(max(over_lpt)) if over_lpt else None,
    }
    if loc:
        row |= {"locality": float(np.mean(loc)), "post_balance": float(np.mean(pb))}
        row |= {
            "locality_ratio": float(np.mean(loc) / np.mean(pb)),
            "inside": float(np.mean(inside)),
            "moved": float(np.mean(moved_share)),
            "locality_ms": float(np.median(loc_ms)),
        }
    return row


def run() -> dict:
    _, llm = load_lengths()
    post_balance(np.arange(1.0, 40.0), 4)  # compile outside the timings
    rng = np.random.default_rng(0)
    rows = [_cell(llm, c, d, b, rng) for c in ("tokens", "modeled") for d in GRID_D for b in GRID_B]
    lines = [
        "### Runtime post-balancing over the grid (real InternVL lengths; mean of 5 draws at d <= 64, 2 above)",
        "",
        "| cost | d | B | auto max/mean | most even other method | worst auto / other | auto time | "
        "auto / lpt time, lpt's plan kept | auto above the bound | "
        "locality_balance vs post_balance | its time | bytes moved | moved bytes kept in a node |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = "met" if r["worst_ratio"] <= 1.001 else "**not met**"
        lpt_x = "-"
        if r["over_lpt"] is not None:
            lpt_x = f"{r['over_lpt']:.1f}x " + (
                "(met)" if r["over_lpt"] <= 2.0 else "(**not met**)"
            )
        loc = "-"
        if "locality" in r:
            met = "met" if r["locality_ratio"] <= 1.005 else "**not met**"
            loc = f"{r['locality']:.5f} vs {r['post_balance']:.5f} ({met})"
        inside = f"{r['inside']:.0%}" if "inside" in r else "-"
        took = f"{r['locality_ms']:.2f} ms" if "locality_ms" in r else "-"
        moved = f"{r['moved']:.0%}" if "moved" in r else "-"
        lines.append(
            f"| {r['cost']} | {r['d']} | {r['B']} | {r['auto']:.5f} | {r['best_other']:.5f} | "
            f"{r['worst_ratio']:.5f} ({ok}) | {r['auto_ms']:.2f} ms | {lpt_x} | "
            f"{r['above_bound'] - 1:.3%} | {loc} | {took} | {moved} | "
            f"{inside} |"
        )
    lines += [
        "",
        "Other methods: `lpt`, `kk_equal`, `best`, unequal `kk` up to 2,048 items (it takes "
        "seconds beyond), and at B >= 4 `locality_balance`'s plan (its locality-first start). "
        "*auto / lpt time*: on the draws where auto kept LPT's plan, auto's time over `lpt`'s "
        "(the worst draw; target <= 2x). *Above the bound*: auto's heaviest batch over a load no "
        "plan can beat (`lower_bound`: the mean, the largest item, the k + 1 lightest of the "
        "k d + 1 heaviest); since 2026-12-07 auto asks no second opinion within 0.1 % of it "
        "(at 64 x 16 it had taken 14-17x `lpt`'s time for `lpt`'s plan), and its second opinion "
        "adds the locality start (items kept on their own rank up to the mean, refined). Where "
        "the time target is not met (B = 4 on 8-64 ranks) the second opinions ran and lost on that "
        "draw. Since 2026-12-07 they run in one kernel call (`balancing._kernels.auto`; on the "
        "same 40 draws auto took 85 -> 52 us at 8 x 4 and 544 -> 455 us at 64 x 4, plans "
        "unchanged): 18 us at 8 x 4 (three refinements of ~4 us, mostly their set-up) and ~0.3 ms "
        "at 64 x 4 (unequal KK's 255 merges 64 wide: 0.19 ms, 0.31 ms before its starting "
        "solutions were left unsorted where already in order). They cannot be skipped for time: "
        "at 8-64 x 4 a second opinion is the most even on 35-68 % of 40 draws (up to 5 % more "
        "even than LPT's plan), and the bound cannot tell those draws apart (LPT 1.5-2.3 % above "
        "it on average); "
        "where evenness is not met (512 x 4: 2,048 items, above the second opinion's 1,024) "
        "unequal KK is 0.1-0.4 % more even on some draws at 30-40x LPT's time. "
        "Targets: auto within 0.1 % of the most even (per draw, worst shown); "
        "locality_balance within 0.5 % of post_balance at B >= 4. Before the move-and-swap "
        "refinement (2026-11-27, this machine) `auto` forced equal counts at B = 4 and gave "
        "1.012-1.076, and `locality_balance` stalled at 1.07-1.17; `auto` took 0.2 / 0.5 / 1.7 ms "
        "at d = 64 / 512 / 2560 with B = 4. The refinement now keeps moving the heaviest rank's "
        "load until no move or swap lowers it: at B = 4 and d = 2560 that is ~10,000 steps of ~1 us "
        "(each a merge walk over two ranks and a min-tree query), the price of halving the spread. "
        "Since 2026-11-28 `auto` also runs unequal KK (refined) on steps of at most 65,536 items x "
        "ranks (`AUTO_KK_WORK`: up to 64 x 16, 512 x 1), where it is the most even method about as "
        "often as LPT is; beyond, its d-wide merges cost 50-200 ms at 512 x 4 (2,048 items), 40-150x "
        "auto's time, so there auto stays with LPT and equal KK: the 512 x 4 row's gap is KK's on "
        "one draw of two. `locality_balance` (since 2026-11-28) keeps its own plan when its "
        "heaviest rank is within `max_loss` (0.5 %) of post_balance's, else tries keeping samples "
        "home up to post_balance's heaviest load, else places post_balance's batches with Alg. 3: "
        "at B = 4 that fallback is taken on about half the draws (the locality plan's local optimum "
        "sits 1-3 % above), which moves more bytes (`bytes moved`: share of all bytes that change "
        "rank) and, at d = 2560, costs Alg. 3 over a d x d volume matrix (`its time`).",
        "",
    ]
    for line in lines:
        print(line)
    return {
        "title": "Runtime balancing grid",
        "markdown": "\n".join(lines),
        "raw": json.loads(json.dumps({"grid": rows}, default=float)),
    }


if __name__ == "__main__":
    run()
