"""Prep throughput (samples/s) on 50,000-sample demo sets with 1 and 2 workers.

Two sets: the target profile (every sample one image, ~300 text tokens) and the default demo mix
(10% text-only, 75% one image, 15% 2-6 images, long multi-turn answers). Images are real files
drawn from a pool of 2,000; the page cache is warm (files were just written), as on a re-run.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from dataprep import PrepConfig, make_demo, run_prep

SAMPLES = 50_000
TARGET = 5_000


def _measure(demo: Path, workers: int) -> dict:
    out = demo / f"cost-w{workers}.parquet"
    cfg = PrepConfig(
        inputs=(str(demo / "demo.jsonl"),),
        output=str(out),
        tokenizer=str(demo / "tokenizer.json"),
        vision_policy="internvl",
        workers=workers,
    )
    t0 = time.perf_counter()
    res = run_prep(cfg)
    seconds = time.perf_counter() - t0
    t = pq.read_table(out, columns=["text_tokens", "num_images"])
    text = t.column("text_tokens").to_numpy()
    return {
        "workers": workers,
        "samples": res.n_in,
        "seconds": round(seconds, 2),
        "samples_per_s": round(res.n_in / seconds),
        "text_tokens_per_s": round(float(text.sum()) / seconds),
        "mean_text_tokens": round(float(text.mean()), 1),
        "mean_images": round(float(t.column("num_images").to_numpy().mean()), 2),
    }


def _probe_costs(images: list[Path], repeats: int = 3) -> dict:
    """Microseconds per image: the whole header probe (open, size, completeness, EXIF
    orientation) and its orientation read alone (on the image Pillow opened), best of
    ``repeats`` passes over the pool; and how many of the pool's images are turned."""
    from PIL import Image

    from dataprep.image_header import probe_image_file
    from dataprep.image_orientation import TURNED, displayed_orientation

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for p in images:
                fn(p)
            times.append(time.perf_counter() - t0)
        return min(times) / len(images) * 1e6

    spent: list[float] = []  # seconds of each orientation read

    def orientation_only(p: Path) -> int:
        with open(p, "rb") as f, Image.open(f) as im:
            t0 = time.perf_counter()
            o = displayed_orientation(im, f, p.stat().st_size)
            spent.append(time.perf_counter() - t0)
            return o

    probe_us = best(probe_image_file)
    turned = sum(orientation_only(p) in TURNED for p in images)
    spent.clear()
    for _ in range(repeats):
        for p in images:
            orientation_only(p)
    return {
        "images": len(images),
        "turned": turned,
        "probe_us": round(probe_us, 1),
        "orientation_us": round(sorted(spent)[len(spent) // 2] * 1e6, 1),  # median
    }


def run() -> dict:
    rows = []
    probe = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mix in ("single-image", "default"):
            demo = Path(tmp) / mix
            make_demo(demo, samples=SAMPLES, seed=1, images=2000, mix=mix)
            for workers in (1, 2):
                r = _measure(demo, workers)
                r["mix"] = mix
                rows.append(r)
                print(r, flush=True)
            if mix == "single-image":
                probe = _probe_costs(sorted((demo / "images").iterdir()))
                print(probe, flush=True)
    return {
        "title": "Prep throughput",
        "markdown": markdown(rows, probe),
        "raw": {"rows": rows, "probe": probe},
    }


def markdown(rows: list[dict], probe: dict) -> str:
    lines = [
        "Prep stage (`equishard prep`, InternVL policy, ChatML template, the demo's byte-level BPE "
        f"tokenizer) on {SAMPLES:,}-sample demo sets. Target: >= {TARGET:,} samples/s for "
        "single-image samples with ~300 text tokens.",
        "",
        "| set | workers | samples | mean text tokens | mean images | seconds | samples/s | "
        "text tokens/s | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        target = (
            ("met" if r["samples_per_s"] >= TARGET else "not met")
            if r["mix"] == "single-image"
            else "-"
        )
        lines.append(
            f"| {r['mix']} | {r['workers']} | {r['samples']:,} | {r['mean_text_tokens']} | "
            f"{r['mean_images']} | {r['seconds']} | {r['samples_per_s']:,} | "
            f"{r['text_tokens_per_s']:,} | {target} |"
        )
    single = {r["workers"]: r for r in rows if r["mix"] == "single-image"}
    mixed = {r["workers"]: r for r in rows if r["mix"] == "default"}
    lines += [
        "",
        "What limits it: tokenization. The rate depends on the VM's CPU: this run encoded "
        f"{single[2]['text_tokens_per_s'] / 1e6:.2f}M text tokens/s overall on 2 cores (an "
        "earlier run on an Intel Xeon VM of this project measured ~1.6M tokens/s and 5,332 "
        "samples/s with 1 worker), so the Rust tokenizer takes most of the time and header "
        "parsing with Pillow (measured below) most of the rest; worker start-up (spawn) adds "
        "~0.4 s. Each image is also checked for completeness (its segments to the first scan) "
        "and confined to the image root (one lstat): on the same VM, 20,000 single-image samples "
        "took 6.0 s before those checks and 6.8 s after. Each image's EXIF orientation is read "
        "from its headers too (images are counted as displayed): of the whole probe's "
        f"{probe['probe_us']} us per image over the pool's {probe['images']:,} files "
        f"({probe['turned']} of them turned), the orientation read takes "
        f"{probe['orientation_us']} us (median). "
        "With 1 worker the tokenizer's thread pool uses both cores and encodes one chunk while "
        "the next chunk's records are read and its image headers probed (the encode releases "
        "the GIL); with 2 workers each process tokenizes on one thread and all work runs in "
        f"parallel ({single[2]['samples_per_s'] / single[1]['samples_per_s']:.2f}x). Runs on this "
        "shared machine vary by about +-10% between repeats. The default mix carries "
        f"{mixed[2]['mean_text_tokens'] / single[2]['mean_text_tokens']:.1f}x the text per sample, "
        "so its samples/s is lower while its text tokens/s is similar.",
    ]
    return "\n".join(lines)
