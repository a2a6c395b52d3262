"""Shard writing and loading against plain baselines on the same bytes.

* Write: ``write_generation`` (read raw samples through dataprep's readers, tar them group by
  group, sha256, fsync, atomic publish) against a plain sequential copy of the same source bytes
  (every image file and the JSONL, in plan order, into one file, fsynced). Page cache warm for
  both (the copy runs first and reads the same files).
* Load: ``GroupDataset`` (checked byte-range reads, member validation, webdataset parsing, one
  group per step) against a plain ``webdataset.WebDataset`` pipeline over the same tars, both
  decoding every image to RGB with Pillow, in a DataLoader with 0 and 2 workers.
* Time to first batch: opening a generation of many small shards and getting its first group.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from PIL import Image

SAMPLES = 2000


def _decode_samples(samples):
    return [[Image.open(io.BytesIO(b)).convert("RGB").size for b in s.images] for s in samples]


def _decode_wds(sample):
    return [
        Image.open(io.BytesIO(v)).convert("RGB").size
        for k, v in sorted(sample.items())
        if k.rsplit(".", 1)[-1] in ("jpg", "jpeg", "png")
    ]


def _copy(files: list[Path], out: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    with open(out, "wb") as dst:
        for f in files:
            with open(f, "rb") as src:
                while block := src.read(1 << 20):
                    dst.write(block)
                    n += len(block)
        dst.flush()
        os.fsync(dst.fileno())
    return n, time.perf_counter() - t0


def _ready_samples(gen: Path) -> list[dict]:
    """Every sample of a written generation as webdataset.ShardWriter takes it: the same
    members' bytes, already in memory."""
    import tarfile

    samples: list[dict] = []
    for tar in sorted(gen.rglob("shard-*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf:
                key, ext = m.name.split(".", 1)
                if not samples or samples[-1]["__key__"] != key:
                    samples.append({"__key__": key})
                samples[-1][ext] = tf.extractfile(m).read()
    return samples


def _shardwriter(samples: list[dict], out: Path) -> tuple[int, float]:
    """``webdataset.ShardWriter`` on ready bytes (no reading, no checksum, no fsync), 64 MiB
    shards; returns (bytes written, seconds)."""
    import webdataset as wds

    out.mkdir()
    t0 = time.perf_counter()
    with wds.ShardWriter(
        str(out / "shard-%06d.tar"), maxsize=64 << 20, maxcount=10**9, verbose=0
    ) as w:
        for sample in samples:
            w.write(sample)
    dt = time.perf_counter() - t0
    return sum(f.stat().st_size for f in out.iterdir()), dt


def _command(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True)
    return time.perf_counter() - t0


def _load_ours(gen: Path, workers: int) -> tuple[int, float, float]:
    from torch.utils.data import DataLoader

    from shards import GroupDataset, RankInfo, open_generation

    m = open_generation(gen)
    n, first = 0, None
    t0 = time.perf_counter()
    for rank in range(m.dp):
        ds = GroupDataset(m, RankInfo(rank=rank, world_size=m.dp), transform=_decode_samples)
        for batch in DataLoader(ds, batch_size=None, num_workers=workers):
            n += len(batch["samples"])
            first = first or time.perf_counter() - t0
    return n, time.perf_counter() - t0, first


def _load_wds(gen: Path, workers: int) -> tuple[int, float]:
    import webdataset as wds
    from torch.utils.data import DataLoader

    from shards import open_generation

    m = open_generation(gen)
    urls = [str(m.path / sh.file) for st in m.streams for sh in st.shards]
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_decode_wds)
    n = 0
    t0 = time.perf_counter()
    for _ in DataLoader(ds, batch_size=None, num_workers=workers):
        n += 1
    return n, time.perf_counter() - t0


def _wds_bytes(sample):
    """webdataset without decoding: the JSON parsed, the images left as bytes (as the reader)."""
    images = [v for k, v in sorted(sample.items()) if k.rsplit(".", 1)[-1] in ("jpg", "png")]
    return json.loads(sample["json"]), images


def _load_bytes(gen: Path, workers: int, which: str) -> tuple[int, float]:
    """Every rank's stream read in its own DataLoader (as each training rank does), images as
    bytes: equishard's ``ds.loader()`` or ``webdataset.WebDataset`` over the same rank's tars."""
    import webdataset as wds
    from torch.utils.data import DataLoader

    from shards import GroupDataset, RankInfo, open_generation

    m = open_generation(gen)
    n = 0
    t0 = time.perf_counter()
    for rank, stream in enumerate(m.streams):
        if which == "ours":
            ds = GroupDataset(m, RankInfo(rank=rank, world_size=m.dp), shuffle=False)
            n += sum(len(b["samples"]) for b in ds.loader(num_workers=workers))
        else:
            urls = [str(m.path / sh.file) for sh in stream.shards]
            ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_wds_bytes)
            n += sum(1 for _ in DataLoader(ds, batch_size=None, num_workers=workers))
    return n, time.perf_counter() - t0


_FIRST = {
    "ours": (
        "from shards import GroupDataset, RankInfo\n"
        "next(iter(GroupDataset(GEN, RankInfo(rank=0, world_size=DP), shuffle=False)))"
    ),
    "wds": (
        "import json, webdataset as wds\n"
        "next(iter(wds.WebDataset(URLS, shardshuffle=False, empty_check=False)"
        ".map(lambda s: json.loads(s['json']))))"
    ),
}


def _first_sample_cold(gen: Path, which: str) -> float:
    """Seconds from a fresh interpreter (torch already imported, as in a training script) to
    the first sample: the loader's imports, opening the generation, reading one group."""
    from shards import open_generation

    m = open_generation(gen)
    urls = [str(m.path / sh.file) for sh in m.streams[0].shards]
    code = (
        "import time, torch\n"
        f"GEN, DP, URLS = {str(gen)!r}, {m.dp}, {urls!r}\n"
        "t0 = time.perf_counter()\n" + _FIRST[which] + "\nprint(time.perf_counter() - t0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _first_batch(gen_root: Path) -> float:
    from shards import GroupDataset, RankInfo

    t0 = time.perf_counter()
    ds = GroupDataset(gen_root, RankInfo(rank=0, world_size=1))
    next(iter(ds))
    return time.perf_counter() - t0


def run() -> dict:
    from balancing.plan import BalanceConfig, build_plan, write_plan
    from dataprep import PrepConfig, make_demo, read_cost_table, run_prep
    from shards import WriteConfig, write_generation

    rows, loads = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_demo(root / "demo", samples=SAMPLES, seed=2)
        cost = root / "cost.parquet"
        run_prep(
            PrepConfig(
                inputs=(str(root / "demo" / "demo.jsonl"),),
                output=str(cost),
                tokenizer=str(root / "demo" / "tokenizer.json"),
                workers=2,
            )
        )
        write_plan(build_plan(read_cost_table(cost), BalanceConfig(dp=8, nodes=2)), root / "plan")
        order = pq.read_table(root / "plan" / "plan.parquet", columns=["sample_id"])
        recs = {
            json.loads(line)["id"]: json.loads(line)
            for line in (root / "demo" / "demo.jsonl").read_text().splitlines()
        }
        files = [root / "demo" / "demo.jsonl"]
        for sid in order.column("sample_id").to_pylist():
            img = recs[sid].get("image")
            files += [root / "demo" / p for p in ([img] if isinstance(img, str) else img or [])]
        copies, times = [], {1: [], 2: []}
        for rep in range(5):  # copy and writes interleaved; medians of five (this VM drifts)
            os.sync()  # every timed run starts with no dirty pages from the one before
            copies.append(_copy(files, root / f"copy-{rep}.bin"))
            (root / f"copy-{rep}.bin").unlink()
            for workers in (1, 2):
                out = root / f"gen-w{workers}-{rep}"
                os.sync()
                t0 = time.perf_counter()
                res = write_generation(
                    WriteConfig(
                        plan_dir=str(root / "plan"),
                        cost_table=str(cost),
                        out=str(out),
                        shard_size=64 << 20,
                        workers=workers,
                    )
                )
                times[workers].append(time.perf_counter() - t0)
                if (workers, rep) != (1, 0):  # the first one is kept for the load runs
                    shutil.rmtree(out)
        copied, copy_s = copies[0][0], statistics.median(c[1] for c in copies)
        for workers in (1, 2):
            rows.append((workers, res.bytes, statistics.median(times[workers]), copied, copy_s))
        # webdataset.ShardWriter on the same samples' bytes, ready in memory
        ready = _ready_samples(root / "gen-w1-0")
        sw_runs = []
        for rep in range(3):
            os.sync()
            sw_runs.append(_shardwriter(ready, root / f"sw-{rep}"))
            shutil.rmtree(root / f"sw-{rep}")
        del ready
        sw_bytes, sw_s = sw_runs[0][0], statistics.median(r[1] for r in sw_runs)
        # the whole command, a fresh process, against cp -r of the generation it wrote (+ sync)
        gen_dir = next(p for p in (root / "gen-w1-0").iterdir() if p.name.startswith("gen-"))
        cli, cps = [], []
        for rep in range(3):
            os.sync()
            cli.append(
                _command(
                    [sys.executable, "-m", "equishard", "write", str(root / "plan"),
                     "--cost-table", str(cost), "--out", str(root / f"cli-{rep}"),
                     "--shard-size", "64MB"]
                )
            )  # fmt: skip
            shutil.rmtree(root / f"cli-{rep}")
            os.sync()
            cps.append(_command(["sh", "-c", f"cp -r '{gen_dir}' '{root}/cp-{rep}' && sync"]))
            shutil.rmtree(root / f"cp-{rep}")
        cli_s, cp_s = statistics.median(cli), statistics.median(cps)
        gen = root / "gen-w1-0"
        for workers in (0, 2):
            n, s, first = _load_ours(gen, workers)
            nw, sw = _load_wds(gen, workers)
            loads.append((workers, n, s, nw, sw, first))
        raw_loads = []  # without decoding; best of three, the two pipelines interleaved
        for workers in (0, 2):
            runs = {"ours": [], "wds": []}
            for _ in range(3):
                for which in runs:
                    runs[which].append(_load_bytes(gen, workers, which))
            (n, s), (nw, sw) = (min(runs[k], key=lambda r: r[1]) for k in ("ours", "wds"))
            raw_loads.append((workers, n, s, nw, sw))
        cold = {k: min(_first_sample_cold(gen, k) for _ in range(3)) for k in ("ours", "wds")}
        # many shards: one sample per group (target batch 1), one group per shard (1 KiB size)
        write_plan(
            build_plan(read_cost_table(cost), BalanceConfig(dp=8, nodes=2, target_batch=1)),
            root / "plan1",
        )
        small = root / "gen-small"
        res_small = write_generation(
            WriteConfig(
                plan_dir=str(root / "plan1"), cost_table=str(cost), out=str(small), shard_size=1024
            )
        )
        ttfb = min(_first_batch(small) for _ in range(3))
    md = [
        f"{SAMPLES:,}-sample demo set (real JPEG/PNG files, InternVL costs), plan DP 8 on 2 nodes, "
        "64 MiB shards.",
        "",
        "**Write** (target: >= 70% of a plain sequential copy of the same bytes)",
        "",
        "| writer workers | shard bytes | seconds | MiB/s | plain copy MiB/s | ratio | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for w, b, s, cb, cs in rows:
        ratio = (b / s) / (cb / cs)
        md.append(
            f"| {w} | {b / 2**20:.1f} MiB | {s:.2f} | {b / s / 2**20:.0f} | "
            f"{cb / cs / 2**20:.0f} | {ratio:.0%} | {'met' if ratio >= 0.7 else '**not met**'} |"
        )
    w1_rate = rows[0][1] / rows[0][2]
    sw_ratio = w1_rate / (sw_bytes / sw_s)
    cli_ratio = (res.bytes / cli_s) / (res.bytes / cp_s)
    start = cli_s - rows[0][2]
    md += [
        "",
        f"Against `webdataset.ShardWriter` on the same samples' bytes, ready in memory (no reading, "
        f"no checksum, no fsync; 64 MiB shards): ShardWriter {sw_bytes / sw_s / 2**20:.0f} MiB/s, "
        f"equishard in process from the raw files {w1_rate / 2**20:.0f} MiB/s: "
        f"**{sw_ratio:.0%}** (target >= 100%: {'met' if sw_ratio >= 1 else '**not met**'}).",
        "",
        f"The whole command (`python -m equishard write`, a fresh process, timed from outside) "
        f"takes {cli_s:.2f} s against {cp_s:.2f} s for `cp -r` of the generation it wrote and "
        f"`sync`: **{cli_ratio:.0%}** (target >= 70%: "
        f"{'met' if cli_ratio >= 0.7 else '**not met**'}). Of its time, {start:.2f} s is not "
        f"writing (interpreter, imports, reading and checking the plan and cost table, "
        f"publishing): at this set's size ({res.bytes / 2**20:.0f} MiB) the start alone is "
        f"{start / cp_s:.1f}x the copy; past it the command writes at the in-process rate above.",
    ]
    md += [
        "",
        "**Load** (target: >= 90% of a plain `webdataset.WebDataset` pipeline over the same "
        "tars with the same decoding: every image to RGB with Pillow)",
        "",
        "| DataLoader workers | equishard samples/s | webdataset samples/s | ratio | target | equishard time to first group |",
        "|---|---|---|---|---|---|",
    ]
    for w, n, s, nw, sw, first in loads:
        ratio = (n / s) / (nw / sw)
        md.append(
            f"| {w} | {n / s:.1f} | {nw / sw:.1f} | {ratio:.0%} | "
            f"{'met' if ratio >= 0.9 else '**not met**'} | {first * 1000:.0f} ms |"
        )
    md += [
        "",
        "**Load without decoding** (bytes + JSON, as when images are decoded on the GPU or "
        "features are precomputed; target: >= 100% of `webdataset.WebDataset` on the same "
        "tars): each rank's stream in its own DataLoader, equishard through `ds.loader()`, "
        "webdataset with the JSON parsed; best of three.",
        "",
        "| DataLoader workers | equishard samples/s | webdataset samples/s | ratio | target |",
        "|---|---|---|---|---|",
    ]
    for w, n, s, nw, sw in raw_loads:
        ratio = (n / s) / (nw / sw)
        md.append(
            f"| {w} | {n / s:,.0f} | {nw / sw:,.0f} | {ratio:.0%} | "
            f"{'met' if ratio >= 1.0 else '**not met**'} |"
        )
    md += [
        "",
        f"**First sample from a fresh interpreter** (torch already imported, as in a training "
        f"script; the loader's imports, opening the generation, one group; best of three; "
        f"target <= 200 ms): equishard {cold['ours'] * 1000:.0f} ms "
        f"({'met' if cold['ours'] <= 0.2 else '**not met**'}), webdataset "
        f"{cold['wds'] * 1000:.0f} ms.",
    ]
    md += [
        "",
        f"**Time to first batch** with {res_small.shards:,} shards (a plan of one-sample groups "
        f"written with a 1 KiB shard size, so one group per shard): {ttfb * 1000:.0f} ms (open "
        "the manifest, validate it and stat every shard, read one group).",
        "",
        "Each write and copy time is the median of five runs, interleaved, each started after a "
        "sync (no dirty pages left from the run before) with the sources in the page cache. "
        "What limits the writer (profiled 2026-11-28 on this VM, thread CPU times of one "
        "in-process write): the encoding thread reads every source file (as the copy does: "
        "~0.06 s of the copy's memory traffic) and builds each sample's JSON document and tar "
        "headers in Python, ~0.32 s of CPU for 2,000 samples (record lookup and parsing ~35 %, "
        "image reads ~20 %, JSON documents ~15 %, path checks and cache keys ~15 %); the writer "
        "thread joins each 1 MiB batch, hashes it (sha256, ~1.7 GB/s on one core here) and "
        "writes it, ~0.28 s (0.03 + 0.17 + 0.08 s); a sync thread fsyncs, renames and records "
        "each finished shard, the last shards of one stream while the next stream is encoded "
        "(`StreamWriter`: the streams of a process share the record store and these threads; "
        "before, each stream waited for its own fsync, ~0.1 s of the write). That is ~0.6 s "
        "of CPU on 2 cores for a copy of 0.23 s: the writer is at ~80 % use of both cores, "
        "and 70 % of the copy would need ~0.1 s less CPU. Hashing each chunk as it comes "
        "instead of one joined batch was tried: every update gives up and retakes the GIL, "
        "and the writer thread then waited on the encoding thread (0.17 -> 0.33 s). "
        "The command adds its start: the interpreter, numpy and pyarrow (pyarrow imports "
        "pandas the first time it builds a scalar), reading and checking both tables; since "
        "2026-11-28 a table of at most 250k rows checks repeated ids with pyarrow, so a small "
        "write imports no numba and loads no kernel (1.8 s -> 0.9-1.0 s in all here). "
        "One stream keeps both cores busy, so `--workers 2` "
        "runs one process here, as `--workers 1` does (at most usable cores / 2 writer "
        "processes, the calling process among them; before, a second spawned process paid "
        "its start-up and contended for the same two cores). Loading is bound "
        "by Pillow decoding (~20 ms per demo image), which both pipelines share, so the checks "
        "equishard adds (byte-range reads, member validation, completeness) cost a few percent "
        "at most."
        " Without decoding, equishard's reader parses each group's member headers once (tarfile, every check as a header is read) and slices each member's bytes from the one range read, where the reader before parsed them twice (its checks, then webdataset's stream); the loader's modules import neither the writer nor the prep pipeline.",
    ]
    return {
        "title": "Shards: write and load",
        "markdown": "\n".join(md),
        "raw": {
            "write": rows,
            "shardwriter": [sw_bytes, sw_s],
            "command": [cli_s, cp_s],
            "load": loads,
            "load_bytes": raw_loads,
            "first_sample_cold": cold,
            "ttfb": ttfb,
        },
    }
