"""Write one stream (one plan rank) of a generation as a sequence of tar shards.

A shard is written as ``.partial``, fsynced and renamed, then a sidecar under ``.parts/``
records its size, checksum and groups; a re-run keeps the finished prefix of shards and resumes
at the first unfinished one, so the output is byte-identical to an uninterrupted run. Workers
run :func:`write_stream` in parallel processes, one stream each.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

from dataprep.errors import DataprepError, SampleRejected
from dataprep.readers import ReadOptions
from dataprep.record_store import RecordStore, image_bytes
from shards.errors import WriteError
from shards.parent import copy_group, parent_sample
from shards.publish import atomic_write_bytes, fsync_dir
from shards.tar_members import HashingFile, add_member, image_ext, sample_doc, sample_key

__all__ = ["read_sample", "write_stream"]


def read_sample(s: dict, store: RecordStore, verified: set[str], groups: dict):
    """(turns, image names, image bytes) of a planned sample: from the parent generation's
    shards when it is unchanged there (``groups`` caches recently read parent groups), else
    from the raw input through dataprep's readers."""
    if s.get("parent"):
        return parent_sample(s["parent"], s["sample_id"], verified, groups)
    try:
        sample = store.get(s["location"])
        imgs = [image_bytes(r) for r in sample.images]
        exts = [image_ext(b) for b in imgs]
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


def write_stream(job: dict) -> list[dict]:
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
            hf = HashingFile(raw)
            with tarfile.open(fileobj=hf, mode="w", format=tarfile.PAX_FORMAT) as tf:
                while groups:
                    g = groups.pop(0)
                    start = tf.offset
                    if g.get("from"):
                        copy_group(tf, g, job["rank"], verified)
                        meta_groups.append([g["step"], len(g["samples"]), start, tf.offset - start])
                        samples += len(g["samples"])
                        if tf.offset >= job["shard_size"]:
                            break
                        continue
                    for pos, s in enumerate(g["samples"]):
                        turns, names, imgs = read_sample(s, store, verified, parent_groups)
                        key = sample_key(g["step"], pos, s["sample_id"])
                        doc = {
                            "sample_id": s["sample_id"],
                            "source": s["source"],
                            "images": names,
                            "turns": turns,
                            "cost": s["cost"],
                        }
                        add_member(
                            tf,
                            key + ".json",
                            sample_doc(doc, g["step"], g["group_id"], job["rank"]),
                        )
                        for n, b in zip(names, imgs, strict=True):
                            add_member(tf, f"{key}.{n}", b)
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
