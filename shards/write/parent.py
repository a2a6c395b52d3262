"""Reuse of the parent generation by a nightly rebalance: kept groups and unchanged samples
are taken from the parent's shards instead of being read again from the raw data. Each shard is
checked against its manifest's sha256 once, and each group's bytes are checked against the
digest taken from that same read whenever they are used.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from equishard.contracts.generation_names import COST_FILE, PLAN_FILE
from shards.errors import WriteError
from shards.format.range_digests import hash_file, range_sha256
from shards.format.sample_doc import media_names
from shards.format.tar_members import add_member, sample_doc, sample_key
from shards.read.reader import ShardError, group_samples
from shards.store.manifest import carried_bytes, load_manifest
from shards.write.sample_parts import MediaPart, SampleParts

__all__ = [
    "COST_FILE",
    "PLAN_FILE",
    "copy_group",
    "parent_group",
    "parent_sample",
    "reuse_index",
    "verify_parent_shards",
]


def _verify(srcs: list[dict]) -> None:
    """Hash the shard of ``srcs`` (parent groups of one file) once against its manifest and
    give each group the sha256 of its own bytes from that same read (``src["digest"]``)."""
    path = Path(srcs[0]["gen_dir"]) / srcs[0]["file"]
    try:
        digest, parts = hash_file(path, [(s["group"][2], s["group"][3]) for s in srcs])
    except OSError as exc:
        raise WriteError(f"{path}: cannot read the parent shard ({exc})") from None
    if digest != srcs[0]["sha256"]:
        raise WriteError(
            f"{path}: sha256 {digest} does not match its manifest; the parent generation is "
            "damaged, rebuild without reusing it"
        )
    for s in srcs:
        s["digest"] = parts[(s["group"][2], s["group"][3])].hex()


def _group_bytes(src: dict) -> bytes:
    """A parent group's bytes, refused unless they are the bytes hashed when its shard was
    checked (a shard changed after :func:`verify_parent_shards` never reaches a new one)."""
    if "digest" not in src:
        _verify([src])
    _, _, offset, length = src["group"]
    path = Path(src["gen_dir"]) / src["file"]
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(length)
    except OSError as exc:
        raise WriteError(f"{path}: cannot read the parent shard ({exc})") from None
    if len(data) != length:
        raise WriteError(f"{path}: truncated at group {src['group']}")
    if range_sha256(data).hex() != src["digest"]:
        raise WriteError(
            f"{path}: group {src['group']} is not the bytes checked against the manifest's "
            "sha256: the parent shard changed after it was verified; rebuild without reusing it"
        )
    return data


def parent_group(src: dict, data: bytes | None = None) -> list:
    """The samples of one group of the parent generation, as ``(meta, images)``: from bytes
    equal to the ones whose shard matched its sha256 (``data``, or read here), each sample
    checked as the loader checks it (members, document, place in the group:
    :func:`shards.read.reader.group_samples`): a parent this night did not write is outside data."""
    where = f"{Path(src['gen_dir']) / src['file']} (parent group {src['group']})"
    step, count = src["group"][0], src["group"][1]
    data = _group_bytes(src) if data is None else data
    try:
        got, _ = group_samples(data, where, src["file"], step, count)
    except ShardError as exc:
        raise WriteError(f"the parent generation's shard is not readable: {exc}") from None
    return [(s.meta, s.images, _media_of(s)) for s in got]


def _media_of(s) -> list[tuple[str, bytes]]:
    """A parent sample's videos and recordings: (member name, bytes) in its document's order."""
    return list(zip(media_names(s.meta), [*s.videos, *s.audios], strict=True))


def copy_group(tf: tarfile.TarFile, g: dict, rank: int) -> None:
    """Re-emit a kept group from the parent generation's shard (checked, never re-encoded):
    its samples must be the plan's, each one readable as the loader reads it.

    A group that keeps its step number (and so its keys and documents) is the same bytes: they
    are copied as they are, once equal to the bytes that matched the shard's sha256."""
    src = g["from"]
    data = _group_bytes(src)
    got = parent_group(src, data)
    want = [s["sample_id"] for s in g["samples"]]
    if [meta["sample_id"] for meta, _, _ in got] != want:
        raise WriteError(f"{src['gen_dir']}: group {src['group']} does not hold {want}")
    if src["group"][0] == g["step"]:
        tf.fileobj.write(data)
        tf.offset += len(data)
        return
    for pos, (meta, images, media) in enumerate(got):
        key = sample_key(g["step"], pos, meta["sample_id"])
        add_member(tf, key + ".json", sample_doc(meta, g["step"], g["group_id"], rank))
        for name, b in zip(meta["images"], images, strict=True):
            add_member(tf, f"{key}.{name}", b)
        for name, b in media:
            add_member(tf, f"{key}.{name}", b)


def parent_sample(src: dict, sample_id: str, cache: dict):
    """The parts of an unchanged sample (:class:`~shards.write.stream_writer.SampleParts`),
    from the parent generation's group ``src``; ``cache`` keeps the 64 most recently parsed parent groups."""
    key = (src["file"], src["group"][2])
    if key not in cache:
        if len(cache) >= 64:
            cache.pop(next(iter(cache)))
        cache[key] = {m["sample_id"]: (m, im, md) for m, im, md in parent_group(src)}
    if sample_id not in cache[key]:
        raise WriteError(
            f"{Path(src['gen_dir']) / src['file']}: parent group {src['group']} does not hold "
            f"{sample_id!r}, which the parent's plan puts there"
        )
    meta, images, media = cache[key][sample_id]
    return SampleParts(
        turns=meta["turns"],
        names=meta["images"],
        images=images,
        media=[MediaPart(name=n, info=meta["media"][n], data=b, size=len(b)) for n, b in media],
    )


def reuse_index(
    reuse_from: str | None, parent_step: pa.ChunkedArray | pa.Array, cost: pa.Table
) -> tuple[dict, pa.Table]:
    """Where groups and samples lie in ``reuse_from``'s shards: ``{(rank, parent step): group}``
    and a table (sample_id, rank, step) of the samples whose content is unchanged there (same
    fingerprint then and now), found by joins rather than per-sample Python."""
    none = pa.table(
        {
            "sample_id": pa.array([], pa.string()),
            "rank": pa.array([], pa.int64()),
            "step": pa.array([], pa.int64()),
        }
    )
    if not reuse_from:
        if len(parent_step) and pc.max(parent_step).as_py() >= 0:
            raise WriteError("the plan reuses groups of a parent generation; give reuse_from")
        return {}, none
    m = load_manifest(reuse_from)
    groups = {
        key: {
            "gen_dir": str(m.path.resolve()),  # read by write's workers, maybe Ray's
            "file": sh.file,
            "bytes": sh.bytes,
            "sha256": sh.sha256,
            "samples": sh.samples,
            "group": [g.step, g.samples, g.offset, g.length],
        }
        for key, (sh, g) in m.group_index().items()
    }
    pplan, pcost = m.path / PLAN_FILE, m.path / COST_FILE
    if not (pplan.exists() and pcost.exists()) or not groups:
        return groups, none
    # they say which samples are unchanged: as written, and the bytes checked are those read
    plan = pq.read_table(
        io.BytesIO(carried_bytes(m, PLAN_FILE)), columns=["sample_id", "rank", "step"]
    )
    then = plan.join(
        pq.read_table(
            io.BytesIO(carried_bytes(m, COST_FILE)), columns=["sample_id", "fingerprint"]
        ),
        "sample_id",
    )
    now = cost.select(["sample_id", "fingerprint"]).rename_columns(["sample_id", "fp_now"])
    both = then.join(now, "sample_id")  # samples in both; a missing fingerprint counts as changed
    same = both.filter(pc.fill_null(pc.equal(both["fingerprint"], both["fp_now"]), False))
    rank = same["rank"].cast(pa.int64())
    step = same["step"].cast(pa.int64())
    width = max(s for _, s in groups) + 1
    known = pa.array([r * width + s for r, s in groups], pa.int64())
    listed = pc.is_in(pc.add(pc.multiply(rank, width), step), value_set=known)
    return groups, pa.table({"sample_id": same["sample_id"], "rank": rank, "step": step}).filter(
        listed
    )


def verify_parent_shards(sources) -> None:
    """Check every parent shard the plan copies from (``sources``: the parent groups it uses)
    against its manifest's sha256, each read once (not per stream); every group in
    ``sources`` gets the digest of its bytes from that read, which each later read of the
    group (:func:`copy_group`, :func:`parent_sample`, in whatever process) must match."""
    by_file: dict[str, list[dict]] = {}
    for src in sources:
        by_file.setdefault(src["file"], []).append(src)
    for _, srcs in sorted(by_file.items()):
        _verify(srcs)
