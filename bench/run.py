"""Run the benchmarks and write BENCHMARKS.md.

Each benchmark module has ``run() -> dict`` returning ``{"title", "markdown", "raw"}``. Results
are kept in ``bench/results/NAME.json`` so ``--only NAME`` refreshes one section and keeps the
others; BENCHMARKS.md is rebuilt from all stored results, each with the hardware, versions and
date it was measured on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

BENCHMARKS = {
    "prep": "bench.bench_prep",
    "balance": "bench.bench_balance",
    "balance_ray": "bench.bench_balance_ray",
    "shards": "bench.bench_shards",
    "train": "bench.bench_train",
    "pipeline": "bench.bench_pipeline",
    "order": "bench.bench_order",
    "nightly": "bench.bench_nightly",
    "hf": "bench.bench_hf",
    "runtime": "bench.bench_runtime",
    "firstcall": "bench.bench_first_call",
    "scaleout": "bench.bench_scaleout",
    "media": "bench.bench_media",
    "phases": "bench.bench_phases",
    "ablation": "bench.bench_ablation",
    "calibration": "bench.bench_calibration",
    "gpu": "bench.bench_gpu",
}

_PACKAGES = (
    "numpy",
    "numba",
    "pyarrow",
    "tokenizers",
    "Pillow",
    "webdataset",
    "torch",
    "scipy",
    "transformers",
    "ray",
    "s3fs",
    "moto",
)


def environment() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "python": platform.python_version(),
        "versions": versions,
    }


def render(results: dict[str, dict]) -> str:
    out = [
        "# BENCHMARKS",
        "",
        "Written by `make bench` (`bench/run.py`); each section states the machine and versions it "
        "was measured with. Targets are goals from the issues, shown beside what was measured.",
    ]
    for name in BENCHMARKS:
        r = results.get(name)
        if r is None:
            continue
        env = r["environment"]
        vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        out += [
            "",
            f"## {r['title']}",
            "",
            f"*Measured {env['date']} on {env['cpu']}, {env['cores']} cores, "
            f"{env['memory_gib']} GiB; Python {env['python']}; {vers}.*",
            "",
            r["markdown"].rstrip(),
        ]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--only", help="comma-separated benchmarks (default: all): " + ", ".join(BENCHMARKS)
    )
    ap.add_argument("--out", default="BENCHMARKS.md")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(BENCHMARKS)
    for name in names:
        if name not in BENCHMARKS:
            ap.error(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    (HERE / "results").mkdir(exist_ok=True)
    for name in names:
        print(f"== bench {name}", flush=True)
        result = importlib.import_module(BENCHMARKS[name]).run()
        result["environment"] = environment()
        stored = HERE / "results" / f"{name}.json"
        if result["raw"] is None and stored.exists() and json.loads(stored.read_text())["raw"]:
            # nothing measured here (no GPU): keep what a machine that could measured
            print(f"   {name}: not measurable on this machine; kept the stored result")
            continue
        stored.write_text(json.dumps(result, indent=2) + "\n")
    results = {}
    for name in BENCHMARKS:
        f = HERE / "results" / f"{name}.json"
        if f.exists():
            results[name] = json.loads(f.read_text())
    Path(args.out).write_text(render(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
