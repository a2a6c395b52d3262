"""Write a plan's samples as balanced, node-aware WebDataset shards (one generation).

One stream of shards per plan rank, under ``node-NNN/rank-LLL/``: step s of a rank is the s-th
group of its stream. A sample is a WebDataset key group ``KEY.json`` + ``KEY.0.jpg``, ``KEY.1.png``
... with the original image bytes. Tars are byte-for-byte deterministic (fixed owner, mode and
mtime), groups never span shards, and the manifest records each group's byte range.

Crash safety: everything is written under ``GEN_ROOT/.staging-<id>`` (the id is a hash of the
plan, the cost table and the shard size). A shard is written as ``.partial``, fsynced and renamed,
then a sidecar records its checksum; a re-run keeps finished shards and resumes each stream at its
first unfinished one, so the output is byte-identical to an uninterrupted run. When all streams
are done the manifest is written, the staging directory is renamed to ``GEN_ROOT/<id>`` (the one
atomic publish) and ``CURRENT`` moves to it. Streams are written by parallel worker processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import multiprocessing as mp
import os
import re
import shutil
import tarfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from dataprep.cost_table import read_cost_table, table_metadata
from dataprep.errors import DataprepError, SampleRejected
from dataprep.readers import ReadOptions
from dataprep.record_store import RecordStore, image_bytes
from shards.manifest import FORMAT_VERSION, MANIFEST, load_manifest
from shards.publish import atomic_write_bytes, fsync_dir, read_current, set_current
from shards.reader import sha256_of

__all__ = [
    "WriteConfig",
    "WriteError",
    "WriteResult",
    "generation_id",
    "parse_size",
    "write_generation",
]

_COST_FIELDS = (
    "num_images",
    "vit_tokens",
    "vit_seq_lens",
    "llm_tokens",
    "text_tokens",
    "modality",
    "image_widths",
    "image_heights",
)
COST_FILE, PLAN_FILE = "cost.parquet", "plan.parquet"  # carried in the generation
_MAGIC = ((b"\xff\xd8", "jpg"), (b"\x89PNG", "png"), (b"GIF8", "gif"), (b"BM", "bmp"))


class WriteError(RuntimeError):
    """The generation cannot be written (a sample no longer reads, another writer is active...)."""


@dataclass(frozen=True, kw_only=True)
class WriteConfig:
    plan_dir: str
    cost_table: str
    out: str
    shard_size: int = 1 << 30
    workers: int = 1
    # a generation directory whose shards hold the groups the plan marks with parent_step >= 0
    # (nightly rebalancing): those are copied from there instead of read from the raw data
    reuse_from: str | None = None
    # more manifest keys (e.g. the nightly run that made this generation)
    manifest_extra: dict | None = None

    def __post_init__(self) -> None:
        if self.shard_size < 1024:
            raise ValueError(f"--shard-size must be at least 1KB, got {self.shard_size} bytes")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        for f in (
            Path(self.plan_dir) / "plan.parquet",
            Path(self.plan_dir) / "report.json",
            Path(self.cost_table),
        ):
            if not f.is_file():
                raise ValueError(
                    f"{f} does not exist: run 'equishard prep' and 'equishard balance' first"
                )


@dataclass(slots=True)
class WriteResult:
    generation: str
    path: str
    parent: str | None
    samples: int
    groups: int
    shards: int
    bytes: int
    reused: bool


def parse_size(text: str) -> int:
    """'1GB', '512MB', '64k', '1000' -> bytes (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise ValueError(f"bad size {text!r}: write e.g. 1GB, 256MB or 1048576")
    return int(float(m.group(1)) * 1024 ** "_kmgt".index(m.group(2) or "_"))


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def generation_id(
    plan_dir: str | Path, cost_table: str | Path, shard_size: int, reuse_from: str | None = None
) -> str:
    h = hashlib.sha256()
    h.update(f"equishard-generation-v{FORMAT_VERSION}|{shard_size}|".encode())
    if reuse_from:  # kept groups come from there: part of what the generation is
        h.update(f"reuse:{Path(reuse_from).name}|".encode())
    h.update(_sha256_file(Path(plan_dir) / "plan.parquet").encode())
    h.update(_sha256_file(Path(cost_table)).encode())
    return "gen-" + h.hexdigest()[:16]


def _image_ext(data: bytes) -> str:
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    raise SampleRejected("unsupported_format", "image bytes are not JPEG, PNG, GIF, WebP or BMP")


def sample_key(step: int, pos: int, sample_id: str) -> str:
    """A WebDataset key: no dots (they start the extension), unique within a shard."""
    return f"{step:07d}_{pos:03d}_{re.sub(r'[^A-Za-z0-9_-]', '_', sample_id)[:60]}"


class _HashingFile(io.RawIOBase):
    def __init__(self, f) -> None:
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.n

    def write(self, b) -> int:
        self.h.update(b)
        self.n += len(b)
        return self.f.write(b)


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    """Append one regular member: what ``TarFile.addfile`` writes, without its 16 KiB copy loop."""
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = 0
    ti.mode = 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    header = ti.tobuf(tf.format, tf.encoding, tf.errors)
    pad = -len(data) % tarfile.BLOCKSIZE
    tf.fileobj.write(header + data + b"\0" * pad if len(data) < 1 << 16 else header)
    if len(data) >= 1 << 16:
        tf.fileobj.write(data)
        tf.fileobj.write(b"\0" * pad)
    tf.offset += len(header) + len(data) + pad


def _doc(meta: dict, step: int, group_id: int, rank: int) -> bytes:
    return json.dumps(
        {**meta, "step": step, "group_id": group_id, "rank": rank},
        sort_keys=True,
        ensure_ascii=False,
    ).encode()


def _parent_group(src: dict, verified: set[str], parse: bool = True) -> list:
    """The samples of one group of the parent generation, as ``(meta, images)``.

    The parent shard's sha256 is checked once before any of its bytes are used, so the group
    is parsed with ``tarfile`` alone (the reader's member checks ran when it was written)."""
    gen_dir = Path(src["gen_dir"])
    if src["file"] not in verified:
        digest = sha256_of(gen_dir / src["file"])
        if digest != src["sha256"]:
            raise WriteError(
                f"{gen_dir / src['file']}: sha256 {digest} does not match its manifest; the "
                "parent generation is damaged, rebuild without reusing it"
            )
        verified.add(src["file"])
    if not parse:
        return []
    _, _, offset, length = src["group"]
    with open(gen_dir / src["file"], "rb") as f:
        f.seek(offset)
        data = f.read(length)
    members: dict[str, bytes] = {}
    order: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        for m in tf:
            members[m.name] = data[m.offset_data : m.offset_data + m.size]
            if m.name.endswith(".json"):
                order.append(m.name[: -len(".json")])
    out = []
    for key in order:
        meta = json.loads(members[key + ".json"])
        out.append((meta, [members[f"{key}.{n}"] for n in meta["images"]]))
    if len(out) != src["group"][1]:
        raise WriteError(f"{gen_dir / src['file']}: group {src['group']} holds {len(out)} samples")
    return out


def _copy_group(tf: tarfile.TarFile, g: dict, rank: int, verified: set[str]) -> None:
    """Re-emit a kept group from the parent generation's shard (checked, never re-encoded).

    A group that keeps its step number (and so its keys and documents) is the same bytes: they
    are copied as they are, after the shard's sha256 was checked."""
    src = g["from"]
    if src["group"][0] == g["step"]:
        _parent_group(src, verified, parse=False)
        path = Path(src["gen_dir"]) / src["file"]
        with open(path, "rb") as f:
            f.seek(src["group"][2])
            data = f.read(src["group"][3])
        if len(data) != src["group"][3]:
            raise WriteError(f"{path}: truncated at group {src['group']}")
        tf.fileobj.write(data)
        tf.offset += len(data)
        return
    got = _parent_group(src, verified)
    want = [s["sample_id"] for s in g["samples"]]
    if [meta["sample_id"] for meta, _ in got] != want:
        raise WriteError(f"{g['from']['gen_dir']}: group {g['from']['group']} does not hold {want}")
    for pos, (meta, images) in enumerate(got):
        key = sample_key(g["step"], pos, meta["sample_id"])
        _add(tf, key + ".json", _doc(meta, g["step"], g["group_id"], rank))
        for name, b in zip(meta["images"], images, strict=True):
            _add(tf, f"{key}.{name}", b)


def _read_sample(s: dict, store: RecordStore, verified: set[str], groups: dict):
    """(turns, image names, image bytes) of a planned sample: from the parent generation's
    shards when it is unchanged there (``groups`` caches recently read parent groups), else
    from the raw input through dataprep's readers."""
    if s.get("parent"):
        src = s["parent"]
        key = (src["file"], src["group"][2])
        if key not in groups:
            if len(groups) >= 64:
                groups.pop(next(iter(groups)))
            groups[key] = {
                meta["sample_id"]: (meta, im) for meta, im in _parent_group(src, verified)
            }
        meta, images = groups[key][s["sample_id"]]
        return meta["turns"], meta["images"], images
    try:
        sample = store.get(s["location"])
        imgs = [image_bytes(r) for r in sample.images]
        exts = [_image_ext(b) for b in imgs]
    except (SampleRejected, DataprepError, OSError) as exc:
        raise WriteError(
            f"sample {s['sample_id']!r} at {s['location']} cannot be read any more "
            f"({exc}); re-run prep and balance on the current data"
        ) from None
    if sample.sample_id != s["sample_id"]:
        raise WriteError(
            f"{s['location']} now holds {sample.sample_id!r}, the plan expects "
            f"{s['sample_id']!r}; re-run prep and balance"
        )
    return [list(t) for t in sample.turns], [f"{i}.{e}" for i, e in enumerate(exts)], imgs


def _write_stream(job: dict) -> list[dict]:
    """Write (or finish) one stream; returns its shards' sidecars in order."""
    stage = Path(job["stage"])
    sdir = stage / job["dir"]
    parts = stage / ".parts" / job["dir"]
    sdir.mkdir(parents=True, exist_ok=True)
    parts.mkdir(parents=True, exist_ok=True)
    for stale in sdir.glob("*.partial"):
        stale.unlink()
    done: list[dict] = []
    while True:  # keep the finished prefix of shards; anything after a gap is redone
        side = parts / f"shard-{len(done):06d}.json"
        tar = sdir / f"shard-{len(done):06d}.tar"
        if not side.exists() or not tar.exists():
            break
        meta = json.loads(side.read_text())
        if tar.stat().st_size != meta["bytes"]:
            break
        done.append(meta)
    for extra in sorted(sdir.glob("shard-*.tar"))[len(done) :]:
        extra.unlink()
    next_step = done[-1]["groups"][-1][0] + 1 if done else -1
    groups = [g for g in job["groups"] if g["step"] >= next_step]
    store = RecordStore(ReadOptions(**job["read_options"]))
    verified: set[str] = set(job.get("parent_verified", ()))
    parent_groups: dict = {}
    k = len(done)
    while groups:
        name = f"shard-{k:06d}.tar"
        partial = sdir / (name + ".partial")
        meta_groups = []
        samples = 0
        with open(partial, "wb") as raw:
            hf = _HashingFile(raw)
            with tarfile.open(fileobj=hf, mode="w", format=tarfile.PAX_FORMAT) as tf:
                while groups:
                    g = groups.pop(0)
                    start = tf.offset
                    if g.get("from"):
                        _copy_group(tf, g, job["rank"], verified)
                        meta_groups.append([g["step"], len(g["samples"]), start, tf.offset - start])
                        samples += len(g["samples"])
                        if tf.offset >= job["shard_size"]:
                            break
                        continue
                    for pos, s in enumerate(g["samples"]):
                        turns, names, imgs = _read_sample(s, store, verified, parent_groups)
                        key = sample_key(g["step"], pos, s["sample_id"])
                        doc = {
                            "sample_id": s["sample_id"],
                            "source": s["source"],
                            "images": names,
                            "turns": turns,
                            "cost": s["cost"],
                        }
                        _add(tf, key + ".json", _doc(doc, g["step"], g["group_id"], job["rank"]))
                        for n, b in zip(names, imgs, strict=True):
                            _add(tf, f"{key}.{n}", b)
                    meta_groups.append([g["step"], len(g["samples"]), start, tf.offset - start])
                    samples += len(g["samples"])
                    if tf.offset >= job["shard_size"]:
                        break
            raw.flush()
            os.fsync(raw.fileno())
        final = sdir / name
        os.replace(partial, final)
        fsync_dir(sdir)
        meta = {
            "file": f"{job['dir']}/{name}",
            "bytes": hf.n,
            "sha256": hf.h.hexdigest(),
            "samples": samples,
            "groups": meta_groups,
        }
        atomic_write_bytes(parts / f"shard-{k:06d}.json", json.dumps(meta).encode())
        done.append(meta)
        k += 1
    return done


def _reuse_index(cfg: WriteConfig, parent_step: list[int], cost) -> tuple[dict, dict]:
    """Where groups and samples lie in ``cfg.reuse_from``'s shards: (rank, parent step) ->
    group, and sample_id -> its group for every sample whose content is unchanged there."""
    if not cfg.reuse_from:
        if any(ps >= 0 for ps in parent_step):
            raise WriteError("the plan reuses groups of a parent generation; give reuse_from")
        return {}, {}
    m = load_manifest(cfg.reuse_from)
    groups = {
        key: {
            "gen_dir": str(m.path),
            "file": sh.file,
            "bytes": sh.bytes,
            "sha256": sh.sha256,
            "samples": sh.samples,
            "group": [g.step, g.samples, g.offset, g.length],
        }
        for key, (sh, g) in m.group_index().items()
    }
    samples = {}
    pplan, pcost = m.path / PLAN_FILE, m.path / COST_FILE
    if pplan.exists() and pcost.exists():
        fp_now = dict(
            zip(
                cost.column("sample_id").to_pylist(),
                cost.column("fingerprint").to_pylist(),
                strict=True,
            )
        )
        c = pq.read_table(pcost, columns=["sample_id", "fingerprint"]).to_pydict()
        fp_then = dict(zip(c["sample_id"], c["fingerprint"], strict=True))
        p = pq.read_table(pplan, columns=["sample_id", "rank", "step"]).to_pydict()
        for sid, rank, step in zip(p["sample_id"], p["rank"], p["step"], strict=True):
            if sid in fp_now and fp_now[sid] == fp_then.get(sid) and (rank, step) in groups:
                samples[sid] = groups[(rank, step)]
    return groups, samples


def _verify_parent_shards(reuse: dict, samples: dict, parent_step: list, plan: dict) -> list:
    """sha256 of every parent shard the plan copies from, each checked once (not per stream)."""
    files = {}
    for rank, ps in zip(plan["rank"], parent_step, strict=True):
        if ps >= 0:
            src = reuse[(rank, ps)]
            files[src["file"]] = src
    for src in samples.values():
        files[src["file"]] = src
    for f, src in sorted(files.items()):
        digest = sha256_of(Path(src["gen_dir"]) / f)
        if digest != src["sha256"]:
            raise WriteError(
                f"{Path(src['gen_dir']) / f}: sha256 {digest} does not match its manifest; the "
                "parent generation is damaged, rebuild without reusing it"
            )
    return sorted(files)


def _jobs(
    plan, cost, stage: Path, cfg: WriteConfig, read_options: dict, nodes: int, per: int
) -> list[dict]:
    by_id = {sid: i for i, sid in enumerate(cost.column("sample_id").to_pylist())}
    missing = [s for s in plan.column("sample_id").to_pylist() if s not in by_id]
    if missing:
        raise WriteError(
            f"{len(missing)} plan samples are not in the cost table, e.g. {missing[:3]}; "
            "write with the cost table the plan was made from"
        )
    cols = {c: cost.column(c).to_pylist() for c in (*_COST_FIELDS, "location", "source")}
    jobs = [
        {
            "stage": str(stage),
            "rank": r,
            "node": r // per,
            "local_rank": r % per,
            "dir": f"node-{r // per:03d}/rank-{r % per:03d}",
            "groups": [],
            "shard_size": cfg.shard_size,
            "read_options": read_options,
        }
        for r in range(nodes * per)
    ]
    last = {}
    p = plan.select(["sample_id", "group_id", "step", "rank"]).to_pydict()
    parent_step = (
        plan.column("parent_step").to_pylist()
        if "parent_step" in plan.column_names
        else [-1] * plan.num_rows
    )
    reuse, reuse_samples = _reuse_index(cfg, parent_step, cost)
    verified = _verify_parent_shards(reuse, reuse_samples, parent_step, p)
    for job in jobs:
        job["parent_verified"] = verified
    for sid, gid, step, rank, pstep in zip(
        p["sample_id"], p["group_id"], p["step"], p["rank"], parent_step, strict=True
    ):
        i = by_id[sid]
        if last.get(rank) != gid:
            src = reuse.get((rank, pstep)) if pstep >= 0 else None
            jobs[rank]["groups"].append({"step": step, "group_id": gid, "samples": [], "from": src})
            last[rank] = gid
        jobs[rank]["groups"][-1]["samples"].append(
            {
                "sample_id": sid,
                "location": cols["location"][i],
                "source": cols["source"][i],
                "cost": {c: cols[c][i] for c in _COST_FIELDS},
                "parent": reuse_samples.get(sid),
            }
        )
    return jobs


def _lock(path: Path):
    f = open(path, "a+")  # noqa: SIM115 - held for the writer's lifetime
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def _clean_stale_staging(root: Path, keep: str) -> None:
    """Remove staging directories of crashed writers (their lock is free)."""
    for d in root.glob(".staging-*"):
        if d.name == keep or not d.is_dir():
            continue
        lock = _lock(d / ".lock") if (d / ".lock").exists() else None
        if lock is not None or not (d / ".lock").exists():
            shutil.rmtree(d, ignore_errors=True)
        if lock is not None:
            lock.close()


def write_generation(cfg: WriteConfig, progress: bool = False) -> WriteResult:
    """Write (or finish, or find already written) the generation of ``cfg``'s plan."""
    root = Path(cfg.out)
    root.mkdir(parents=True, exist_ok=True)
    gen = generation_id(cfg.plan_dir, cfg.cost_table, cfg.shard_size, cfg.reuse_from)
    final = root / gen
    parent = read_current(root)
    if (final / MANIFEST).exists():
        m = load_manifest(final)
        if parent != gen:
            set_current(root, gen)
        t = m.totals
        return WriteResult(
            gen, str(final), m.parent, t["samples"], t["groups"], t["shards"], t["bytes"], True
        )
    stage = root / f".staging-{gen}"
    stage.mkdir(exist_ok=True)
    lock = _lock(stage / ".lock")
    if lock is None:
        raise WriteError(f"another writer is writing {gen} into {root}; wait for it to finish")
    try:
        _clean_stale_staging(root, stage.name)
        if not (stage / MANIFEST).exists():
            _write_all(cfg, root, stage, gen, parent, progress)
        os.replace(stage, final)  # the atomic publish
        fsync_dir(root)
        with contextlib.suppress(FileNotFoundError):
            (final / ".lock").unlink()
        set_current(root, gen)
    finally:
        lock.close()
    m = load_manifest(final)
    t = m.totals
    return WriteResult(
        gen, str(final), m.parent, t["samples"], t["groups"], t["shards"], t["bytes"], False
    )


def _max(table, column: str) -> int:
    return int(pc.max(table.column(column)).as_py() or 0) if table.num_rows else 0


def _write_all(
    cfg: WriteConfig, root: Path, stage: Path, gen: str, parent: str | None, progress: bool
) -> None:
    from tqdm import tqdm

    plan = pq.read_table(Path(cfg.plan_dir) / "plan.parquet")
    report = json.loads((Path(cfg.plan_dir) / "report.json").read_text())
    cost = read_cost_table(cfg.cost_table)
    read_options = table_metadata(cfg.cost_table).get("read_options") or {}
    params = report["parameters"]
    nodes, per = params["nodes"], params["gpus_per_node"]
    jobs = _jobs(plan, cost, stage, cfg, read_options, nodes, per)
    results: dict[int, list[dict]] = {}
    bar = tqdm(total=len(jobs), unit="stream", desc="write", disable=None if progress else True)
    if cfg.workers == 1:
        for job in jobs:
            results[job["rank"]] = _write_stream(job)
            bar.update()
    else:
        with ProcessPoolExecutor(cfg.workers, mp_context=mp.get_context("spawn")) as ex:
            futures = {ex.submit(_write_stream, job): job["rank"] for job in jobs}
            for fut, rank in futures.items():
                results[rank] = fut.result()
                bar.update()
    bar.close()
    streams = []
    for job in jobs:
        streams.append(
            {
                "node": job["node"],
                "local_rank": job["local_rank"],
                "rank": job["rank"],
                "shards": results[job["rank"]],
            }
        )
    samples = sum(s["samples"] for st in streams for s in st["shards"])
    if samples != plan.num_rows:
        raise WriteError(
            f"wrote {samples} samples but the plan has {plan.num_rows}; nothing was published"
        )
    manifest = {
        "format_version": FORMAT_VERSION,
        "generation": gen,
        "parent": parent,
        "created_by": "equishard",
        "plan_sha256": _sha256_file(Path(cfg.plan_dir) / "plan.parquet"),
        "cost_table_sha256": _sha256_file(Path(cfg.cost_table)),
        "shard_size": cfg.shard_size,
        "layout": {
            "nodes": nodes,
            "gpus_per_node": per,
            "dp": nodes * per,
            "steps": report["counts"]["steps"],
        },
        "streams": streams,
        "totals": {
            "samples": samples,
            "groups": sum(len(s["groups"]) for st in streams for s in st["shards"]),
            "shards": sum(len(st["shards"]) for st in streams),
            "bytes": sum(s["bytes"] for st in streams for s in st["shards"]),
        },
        "report": report,
        "cost_table": COST_FILE,
        "plan": PLAN_FILE,
        # What the loader's collator and the trainer need to match prep: the vision policy,
        # tokenizer and template the costs were counted with, and the largest loads to size
        # fixed-shape pipeline microbatches.
        "prep": {k: v for k, v in table_metadata(cfg.cost_table).items() if k != "inputs"},
        "loads": {
            "max_sample_llm_tokens": _max(cost, "llm_tokens"),
            "max_sample_vit_tokens": _max(cost, "vit_tokens"),
            "max_group_llm_tokens": _max(plan, "group_llm_tokens"),
            "max_group_vit_tokens": _max(plan, "group_vit_tokens"),
        },
    }
    manifest.update(cfg.manifest_extra or {})
    for src, name in (
        (Path(cfg.cost_table), COST_FILE),
        (Path(cfg.plan_dir) / "plan.parquet", PLAN_FILE),
    ):
        atomic_write_bytes(stage / name, src.read_bytes())
    atomic_write_bytes(stage / MANIFEST, json.dumps(manifest, indent=1).encode())
    shutil.rmtree(stage / ".parts", ignore_errors=True)
