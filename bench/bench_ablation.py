"""Which phases to balance at run time: OrchMLLM's ablation on the mixed dataset, each rank's
share run for real (``bench._phase_ablation``; its module doc says how). Targets (#67): every
phase balanced gives at least ``TARGET_GAIN`` x the LLM-only row's tokens/s, with efficiency at
least ``TARGET_EFFICIENCY`` (the ISF shards' row: grouping and runtime balancing together)."""

from __future__ import annotations

import json

from bench._phase_ablation import BATCH, POOL, RANKS, ROWS, SCALE, STEPS, WARMUP, simulate

TARGET_GAIN, TARGET_EFFICIENCY = 1.15, 0.95


def run() -> dict:
    rows = simulate()
    llm_only = rows["random + LLM-only"]["tokens_per_s"]
    lines = []
    for name in ROWS:
        r = rows[name]
        gain = r["tokens_per_s"] / llm_only
        mark = ""
        if name.startswith("random + every phase"):
            mark = "met" if gain >= TARGET_GAIN else "**missed**"
            mark = f"gain >= {TARGET_GAIN}: {mark}"
        if name.startswith("ISF shards + every phase"):
            ok = gain >= TARGET_GAIN and r["efficiency"] >= TARGET_EFFICIENCY
            mark = (
                f"gain >= {TARGET_GAIN}, efficiency >= {TARGET_EFFICIENCY}: "
                f"{'met' if ok else '**missed**'}"
            )
        lines.append(
            f"| {name} | {r['efficiency']:.3f} | {r['tokens_per_s']:,.0f} | "
            f"{r['step_time_ms']:,.0f} ms | {gain:.2f}x | {mark} |"
        )
    markdown = "\n".join(
        [
            f"Simulated {RANKS}-rank DP on this CPU (one thread): {STEPS} steps of {RANKS} x "
            f"{BATCH} samples drawn from {POOL:,} of the mixed dataset (images from the real "
            "InternVL lengths, recordings costed by Qwen2.5-Omni's audio rule, clips by the "
            f"Qwen2.5-VL video rule), every length divided by {SCALE} so that a CPU runs the "
            "shares; each rank's share of each phase run for real (forward and backward, best of three): the "
            "reference trainer's tiny ViT (32 x 2) over images and video frames, its "
            "Whisper-shaped audio encoder (32 x 2, 100-position chunks) and its LLM (64 x 4). "
            "A re-split phase: `post_balance` (`auto`) over each sample's modeled cost there. "
            "With any phase re-split, an exchange separates the encoders from the LLM: the step "
            "takes the slowest rank's encoders plus the slowest rank's LLM; else the slowest "
            "rank's total. Efficiency: mean rank time over the step time, over all steps. Gain: "
            "tokens/s over the LLM-only row's (OrchMLLM's ablation). Calibrated rows: each "
            "phase's cost fitted (`balancing.calibration.fit_phase`, what `equishard calibrate` "
            f"runs) to the measured shares of {WARMUP} other random steps, instead of the FLOPs "
            "proxy.",
            "",
            "| rows | efficiency | LLM tokens/s | step time | gain | target |",
            "|---|---|---|---|---|---|",
            *lines,
            "",
            "The calibration's fit per phase (median / p90 relative error over its warm-up "
            "shares): "
            + "; ".join(
                f"{ph} {f['median_rel_error']:.1%} / {f['p90_rel_error']:.1%}"
                for ph, f in rows["calibration"].items()
            )
            + ".",
        ]
    )
    print(markdown)
    return {
        "title": "Runtime balancing, phase by phase (OrchMLLM's ablation)",
        "markdown": markdown,
        "raw": json.loads(json.dumps(rows, default=float)),
    }


if __name__ == "__main__":
    run()
