"""Scale-out: prep and write on Ray against local worker processes, and the loader reading from
an S3 server against local disk.

* prep samples/s and write MiB/s with ``--engine local`` (worker processes) and ``--engine ray``
  on a local Ray cluster of 1 and 2 CPUs (started before timing; its start time is listed),
  median of three runs each; every Ray output is checked byte-identical to the local one.
* Loader: ``GroupDataset`` over every rank of the generation, decoding every image to RGB with
  Pillow, from local disk and from a real S3 server on this machine (moto in server mode over
  HTTP through s3fs: ranged GETs per group), without and with a warm local cache directory;
  samples/s and time to first batch.
"""

from __future__ import annotations

import filecmp
import io
import shutil
import statistics
import tempfile
import time
from pathlib import Path

SAMPLES = 4000


def _decode(samples):
    from PIL import Image

    return [[Image.open(io.BytesIO(b)).convert("RGB").size for b in s.images] for s in samples]


def _same_tree(a: Path, b: Path) -> bool:
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return fa == fb and all(filecmp.cmp(a / f, b / f, shallow=False) for f in fa)


def _timed(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _load(gen: str, workers: int, **kw) -> tuple[int, float, float]:
    from torch.utils.data import DataLoader

    from shards import GroupDataset, RankInfo, open_generation

    t0 = time.perf_counter()
    m = open_generation(gen, **kw)
    n, first = 0, None
    for rank in range(m.dp):
        ds = GroupDataset(m, RankInfo(rank=rank, world_size=m.dp), transform=_decode)
        for batch in DataLoader(ds, batch_size=None, num_workers=workers):
            n += len(batch["samples"])
            first = first or time.perf_counter() - t0
    return n, time.perf_counter() - t0, first


def run() -> dict:
    import logging

    import ray
    import s3fs
    from moto.server import ThreadedMotoServer

    from balancing.plan import BalanceConfig, build_plan, write_plan
    from dataprep import PrepConfig, make_demo, read_cost_table, run_prep
    from shards import WriteConfig, write_generation
    from shards.object_store import publish_generation

    prep_rows, write_rows, load_rows, starts = [], [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_demo(root / "demo", samples=SAMPLES, seed=2)
        prep = dict(
            inputs=(str(root / "demo" / "demo.jsonl"),),
            tokenizer=str(root / "demo" / "tokenizer.json"),
            chunk_size=256,
        )
        ref = root / "cost.parquet"
        run_prep(PrepConfig(output=str(ref), workers=2, **prep))
        write_plan(build_plan(read_cost_table(ref), BalanceConfig(dp=8, nodes=2)), root / "plan")
        wcfg = dict(plan_dir=str(root / "plan"), cost_table=str(ref), shard_size=64 << 20)
        write_generation(WriteConfig(out=str(root / "gen-ref"), **wcfg))
        nbytes = sum(p.stat().st_size for p in (root / "gen-ref").rglob("*.tar"))

        def prep_run(engine: str, workers: int, out: Path):
            return lambda: run_prep(
                PrepConfig(output=str(out), workers=workers, engine=engine, **prep)
            )

        def write_run(engine: str, workers: int, out: Path):
            def go():
                shutil.rmtree(out, ignore_errors=True)
                write_generation(WriteConfig(out=str(out), engine=engine, workers=workers, **wcfg))

            return go

        for workers in (1, 2):
            out = root / f"local-{workers}.parquet"
            prep_rows.append(("local", workers, _timed(prep_run("local", workers, out)), True))
            gen = root / f"gen-local-{workers}"
            write_rows.append(("local", workers, _timed(write_run("local", workers, gen)), True))
        for workers in (1, 2):
            t0 = time.perf_counter()
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
            starts[workers] = time.perf_counter() - t0
            try:
                out = root / f"ray-{workers}.parquet"
                s = _timed(prep_run("ray", workers, out))
                prep_rows.append(("ray", workers, s, filecmp.cmp(out, ref, shallow=False)))
                gen = root / f"gen-ray-{workers}"
                s = _timed(write_run("ray", workers, gen))
                write_rows.append(("ray", workers, s, _same_tree(gen, root / "gen-ref")))
            finally:
                ray.shutdown()

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            opts = {"endpoint_url": f"http://{host}:{port}", "key": "k", "secret": "s"}
            s3fs.S3FileSystem(**opts).mkdir("bench")
            gen_dir = next(p for p in (root / "gen-ref").iterdir() if p.name.startswith("gen-"))
            publish_generation(gen_dir, "s3://bench/gens", storage_options=opts)
            for workers in (0, 2):
                load_rows.append(("local disk", workers, *_load(str(root / "gen-ref"), workers)))
                load_rows.append(
                    ("S3 (moto), no cache", workers,
                     *_load("s3://bench/gens", workers, storage_options=opts))
                )  # fmt: skip
                cache = root / f"cache-{workers}"
                _load("s3://bench/gens", workers, storage_options=opts, cache_dir=cache)
                load_rows.append(
                    ("S3 (moto), warm cache", workers,
                     *_load("s3://bench/gens", workers, storage_options=opts, cache_dir=cache))
                )  # fmt: skip
        finally:
            server.stop()

    md = [
        f"{SAMPLES:,}-sample demo set (real JPEG/PNG files, InternVL costs), plan DP 8 on 2 "
        f"nodes, 64 MiB shards ({nbytes / 2**20:.0f} MiB written). Ray: a local cluster of 1 or 2 "
        "CPUs started before timing (start: "
        + ", ".join(f"{w} CPU {s:.1f} s" for w, s in starts.items())
        + "); median of three runs; the first run of each includes starting Ray's worker "
        "processes. No 16-core machine was lent in this session, so the scaling curve beyond 2 "
        "workers is not measured.",
        "",
        "**prep** (`equishard prep`, 256-record units)",
        "",
        "| engine | workers | seconds | samples/s | output identical to local |",
        "|---|---|---|---|---|",
    ]
    for engine, w, s, same in prep_rows:
        md.append(
            f"| {engine} | {w} | {s:.2f} | {SAMPLES / s:,.0f} | {'yes' if same else '**no**'} |"
        )
    md += [
        "",
        "**write** (`equishard write`, one task per (node, rank) stream: 8 streams)",
        "",
        "| engine | workers | seconds | MiB/s | generation byte-identical |",
        "|---|---|---|---|---|",
    ]
    for engine, w, s, same in write_rows:
        md.append(
            f"| {engine} | {w} | {s:.2f} | {nbytes / s / 2**20:.0f} | {'yes' if same else '**no**'} |"
        )
    md += [
        "",
        "**Loader** (`GroupDataset`, every rank's groups, every image decoded to RGB with "
        "Pillow, in a DataLoader)",
        "",
        "| source | DataLoader workers | samples | samples/s | time to first batch |",
        "|---|---|---|---|---|",
    ]
    for src, w, n, s, first in load_rows:
        md.append(f"| {src} | {w} | {n} | {n / s:,.0f} | {first * 1000:.0f} ms |")
    md += [
        "",
        "The S3 server runs on this machine (loopback HTTP, moto's Python server), so these "
        "figures show equishard's own cost of reading by URL (one ranged GET per group, the "
        "listing, the cache), not a real store's latency or bandwidth.",
    ]
    return {
        "title": "Scale-out: Ray engine and object storage",
        "markdown": "\n".join(md),
        "raw": {
            "prep": prep_rows,
            "write": write_rows,
            "load": load_rows,
            "ray_start_s": starts,
            "bytes": nbytes,
        },
    }
