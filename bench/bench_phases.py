"""Balancing every phase at once: a mixed image + audio + video dataset (``bench._mixed``:
the real InternVL image lengths, LibriSpeech-like recordings, LLaVA-Video-like clips, each
costed by the product's own rules), 16 samples per rank, against random batching and against
OrchMLLM's LLM-only ablation (the same samples balanced by their LLM tokens alone).

The image + text path is checked beside it: the same 1.2M-row InternVL plan built by this
checkout and by ``BASE`` (before the audio phase came in, a git worktree), alternated in one run,
each a fresh process timing the median of three builds; the two plans must be identical.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from balancing.plan import BalanceConfig, build_plan
from bench._mixed import MIX, mixed_cost_table
from bench._worktree import alternated, worktree
from equishard.contracts.phases import REPORTED

ROOT = Path(__file__).resolve().parents[1]
BASE = "7081f94"  # the last commit before the audio phase was balanced
ROWS = 200_000
DPS = (8, 16, 32, 64, 128)
TARGET_DIST, TARGET_GAIN = 0.02, 5.0
IMAGE_ROWS, REPEATS = 1_200_000, 5
PHASES = tuple((p.report, p.label) for p in REPORTED)
MORE_SEEDS = (1, 2)  # other draws of the mixed data set: the target must hold on each


def _measure(table, dp: int) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = build_plan(table, BalanceConfig(dp=dp, target_batch=16, seed=0))
    return {**r.report["metrics"], "steps": r.report["counts"]["steps"]}, time.perf_counter() - t0


def _met(m: dict) -> bool:
    b = m["balanced"]
    return all(b[f"dist_ratio_{k}"] <= TARGET_DIST for k, _ in PHASES) and all(
        v >= TARGET_GAIN for v in m["encoder_gain"].values()
    )


def _plan_rows(audio: str, dps) -> tuple[list[str], list[dict]]:
    table = mixed_cost_table(ROWS, seed=0, audio=audio)
    others = [mixed_cost_table(ROWS, seed=s, audio=audio) for s in MORE_SEEDS]
    lines, raw = [], []
    for dp in dps:
        m, seconds = _measure(table, dp)
        more = [_measure(t, dp)[0] for t in others]
        b, rnd, only, gain = m["balanced"], m["random"], m["llm_only"], m["encoder_gain"]
        met = _met(m) and all(_met(x) for x in more)
        cells = " | ".join(
            f"{rnd[f'dist_ratio_{k}']:.3f} / {only[f'dist_ratio_{k}']:.3f} / "
            f"**{b[f'dist_ratio_{k}']:.4f}**"
            for k, _ in PHASES
        )
        worst = max(x["balanced"][f"dist_ratio_{k}"] for x in more for k, _ in PHASES)
        least = {k: min(x["encoder_gain"][k] for x in more) for k in gain}
        lines.append(
            f"| {audio} | {dp} | {m['steps']} | {cells} | {gain['vit']:.1f}x / {gain['audio']:.0f}x | "
            f"{worst:.4f}; {least['vit']:.1f}x / {least['audio']:.0f}x | "
            f"{seconds:.2f} s | {'met' if met else '**not met**'} |"
        )
        raw.append({"audio": audio, "dp": dp, "seconds": seconds, "metrics": m, "more_seeds": more})
    return lines, raw


def _image_path() -> tuple[dict, list[str]]:
    runs: dict[str, list[dict]] = {"this": [], "base": []}
    with tempfile.TemporaryDirectory() as tmp, worktree(ROOT, BASE, Path(tmp) / "base") as base:
        for _, name, tree in alternated(REPEATS, {"this": ROOT, "base": base}):
            worker = str(ROOT / "bench" / "_plan_worker.py")
            out = subprocess.run(
                [sys.executable, worker, str(tree), str(IMAGE_ROWS)],
                check=True,
                capture_output=True,
                text=True,
            )
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    same = len({r["plan_sha256"] for rs in runs.values() for r in rs}) == 1
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    lines = [
        f"| before (`{BASE}`) | {med['base']:.3f} s | "
        + ", ".join(f"{r['seconds']:.3f}" for r in runs["base"])
        + " | 1.00 |",
        f"| this | {med['this']:.3f} s | "
        + ", ".join(f"{r['seconds']:.3f}" for r in runs["this"])
        + f" | {med['this'] / med['base']:.3f} |",
    ]
    return {"median": med, "same_plan": same, "runs": runs}, lines


def run() -> dict:
    rows, raw = _plan_rows("padded", DPS)
    more, raw2 = _plan_rows("unpadded", DPS)
    image, image_lines = _image_path()
    mix = ", ".join(f"{k} {v:.0%}" for k, v in MIX.items())
    markdown = "\n".join(
        [
            f"{ROWS:,} samples ({mix}): images from the real InternVL lengths (1 tile = 1,024 "
            "patches), recordings of 1-35 s (LibriSpeech-like) costed by the Qwen2-Audio rule "
            "(`padded`: one 30-s window of 1,500 encoder positions each) or Qwen2.5-Omni's "
            "(`unpadded`: 100-position chunks), clips of 10 s - 3 min at 24-30 fps, 360p to "
            "1080p, costed by the Qwen2.5-VL video rule (qwen-vl-utils, 2 fps, 360x420 max, "
            "20,480-token budget) and run by the vision tower. Target batch 16 samples per "
            "rank, data seed 0, caps chosen automatically. Each cell: random batching / "
            "LLM-only plan / **equishard**, token dist ratio. Gain: an encoder's dist ratio "
            "under the LLM-only plan over equishard's. Seeds "
            f"{', '.join(map(str, MORE_SEEDS))}: the same data set drawn again, the largest "
            "dist ratio of any phase and the least gains over them; the target must hold on "
            "every seed. Time: `build_plan` in process, the LLM-only baseline included. The "
            "dist ratio is a mean over steps: the fewer the steps (larger DP, the same "
            "samples), the more each of the few uneven ones weighs (the short last step, and "
            "a step where a phase's groups with and without it meet and that could not be "
            "cleared of it).",
            "",
            "| audio | DP | steps | vision | audio | LLM | gain vision / audio | seeds "
            f"{', '.join(map(str, MORE_SEEDS))}: worst; least gains | time | target (each "
            f"<= {TARGET_DIST}, gain >= {TARGET_GAIN:.0f}x) |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            *more,
            "",
            "The image + text path, the same plan built by this checkout and before the audio "
            f"phase (`{BASE}`): {IMAGE_ROWS:,} InternVL rows, DP 64 on 8 nodes, target batch "
            f"4; {REPEATS} fresh processes each, alternated, each the median of three builds. "
            + (
                "The plans are identical (same digest of every column)."
                if image["same_plan"]
                else "**The plans differ.**"
            ),
            "",
            "| code | median | runs (s) | ratio |",
            "|---|---|---|---|",
            *image_lines,
        ]
    )
    print(markdown)
    return {
        "title": "Balancing every phase: images, audio and video",
        "markdown": markdown,
        "raw": json.loads(json.dumps({"mixed": raw + raw2, "image_path": image}, default=float)),
    }


if __name__ == "__main__":
    run()
