"""Write one stream (one plan rank) of a generation as a sequence of tar shards.

A shard is written as ``.partial``, fsynced and renamed, then a sidecar under ``.parts/``
records its size, checksum and groups; a re-run keeps the finished prefix of shards and resumes
at the first unfinished one, so the output is byte-identical to an uninterrupted run. Workers
run streams in parallel processes; inside one, a :class:`StreamWriter` writes its streams one
after another: the caller's thread reads samples and encodes members while a writer thread
hashes and writes the bytes and a sync thread completes finished shards (see
:class:`_ShardFile`), the last shards of one stream while the next is encoded.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from dataprep.errors import DataprepError, SampleRejected
from dataprep.image_header import probe_image_bytes
from dataprep.measure import cache_key, fingerprint
from dataprep.media_probe import (
    MediaItem,
    media_ext,
    media_record,
    open_media,
)
from dataprep.prep_cache import input_key
from dataprep.readers import ReadOptions
from dataprep.record_store import RecordStore, read_image
from equishard.contracts.media import MEASURED
from shards.errors import WriteError
from shards.format.sample_doc import COST_FIELDS, MEDIA_COST_FIELDS, sample_doc, sample_key
from shards.format.tar_members import add_member, add_member_stream, image_ext
from shards.store.publish import atomic_write_bytes, fsync_dir, open_new
from shards.write.parent import copy_group, parent_sample
from shards.write.sample_parts import MediaPart, SampleParts
from shards.write.stream_resume import finished_prefix, shard_stem

__all__ = [
    "COST_FIELDS",
    "MediaPart",
    "SampleParts",
    "StreamWriter",
    "add_media",
    "read_sample",
    "write_stream",
]


def _open_media(item: MediaItem) -> tuple[MediaPart, object]:
    """A sample's video or recording, opened and probed as prep opened and probed it
    (:func:`dataprep.media_probe.open_media`), and its header: the bytes it streams are the
    bytes it probed, unless the file changes in place, which the status taken again after the
    copy shows."""
    header, f, size, st = open_media(item)
    if f is None:
        return MediaPart(name="", info={}, data=item.ref.data, size=size), header
    return MediaPart(name="", info={}, f=f, size=size, stat=st), header


def read_sample(
    s: dict,
    store: RecordStore,
    groups: dict,
    check: str = "header",
    stored_sizes: bool = False,
) -> SampleParts:
    """The parts of a planned sample (:class:`SampleParts`): from the parent generation's
    shards when it is unchanged there (``groups`` caches recently read parent groups), else
    from the raw input through dataprep's readers, checked against the cost table's
    fingerprint (the record, every image, video and recording as prep measured them;
    ``check`` is prep's image check) so that a raw file changed since prep is never written
    with its old costs. ``stored_sizes``: prep counted images as stored, not as displayed;
    every sample's images are probed again (a turned photo's fingerprint differs). The caller
    closes the parts (:meth:`SampleParts.close`): a video's file stays open until streamed."""
    if s.get("parent"):
        return parent_sample(s["parent"], s["sample_id"], groups)
    parts: SampleParts | None = None
    try:
        sample = store.get(s["location"])
        read = [read_image(r) for r in sample.images]
        imgs = [data for data, _ in read]
        media, media_headers = [], []
        parts = SampleParts(
            turns=[list(t) for t in sample.turns], names=[], images=imgs, media=media
        )
        counts = {"video": 0, "audio": 0}
        for item in sample.media:
            part, header = _open_media(item)
            media.append(part)
            media_headers.append(header)
            part.name = f"{item.modality}{counts[item.modality]}.{media_ext(header, item.ref)}"
            part.info = media_record(header)
            counts[item.modality] += 1
        # unchanged since prep by its cache key (record bytes, image sizes and mtimes, the status
        # of each file as it was after its bytes were read: no decode)? then the fingerprint
        # holds; otherwise the images are probed and fingerprinted again
        refs = sample.images + [item.ref for item in sample.media]
        stats = [st for _, st in read] + [m.stat for m in media]
        same = (
            not stored_sizes
            and bool(s.get("cache_key"))
            and cache_key(sample.raw, refs, stats) == input_key(s["cache_key"])
        )
        headers = (
            None
            if same
            else [
                probe_image_bytes(b, r.where, check)
                for b, r in zip(imgs, sample.images, strict=True)
            ]
        )
        parts.names = [f"{i}.{image_ext(b)}" for i, b in enumerate(imgs)]
    except (SampleRejected, DataprepError, OSError) as exc:
        if parts is not None:
            parts.close()
        raise WriteError(
            f"sample {s['sample_id']!r} at {s['location']} cannot be read any more "
            f"({exc}); re-run prep and balance on the current data"
        ) from None
    if sample.sample_id != s["sample_id"]:
        parts.close()
        raise WriteError(
            f"{s['location']} now holds {sample.sample_id!r}, the plan expects "
            f"{s['sample_id']!r}; re-run prep and balance"
        )
    if (
        headers is not None
        and s.get("fingerprint")
        and fingerprint(sample.raw, headers, media_headers) != s["fingerprint"]
    ):
        parts.close()
        why = (
            " (prep counted its images as stored; this equishard counts them as displayed, EXIF "
            "orientation applied, and a photo of it is turned)"
            if stored_sizes
            else ""
        )
        raise WriteError(
            f"sample {s['sample_id']!r} at {s['location']} changed since prep measured it (its "
            f"record, an image, a video or a recording differs from the cost table's "
            f"fingerprint){why}: its costs are stale; re-run prep and balance on the current data"
        )
    return parts


def add_media(tf, key: str, part: MediaPart, sample_id: str) -> None:
    """Write one video or recording as the member ``KEY.NAME``: embedded bytes at once, a file
    streamed; a file whose size or time changed while it was copied stops the write."""
    if part.data is not None:
        add_member(tf, f"{key}.{part.name}", part.data)
        return
    add_member_stream(tf, f"{key}.{part.name}", part.f, part.size)
    after = os.fstat(part.f.fileno())
    if (after.st_size, after.st_mtime_ns) != (part.stat.st_size, part.stat.st_mtime_ns):
        raise WriteError(
            f"sample {sample_id!r}: its {part.name} ({part.f.name}) changed while it was copied "
            "into the shard; write again once the data stops changing"
        )


def write_stream(job: dict) -> list[dict]:
    """Write (or finish) one stream; returns its shards' sidecars in order."""
    with StreamWriter() as w:
        return w.submit(job).result()


class StreamWriter:
    """Writes streams one after another in this process. They share one record store (an
    input's index is built once, not once per stream) and one writer and one sync thread, so a
    stream's last shard is hashed, written, fsynced and recorded while the next stream is
    encoded; at most ``_ShardFile._INFLIGHT`` batches of bytes wait for the writer thread
    across all of them. Use as a context manager: leaving it waits for every queued write."""

    def __init__(self) -> None:
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="equishard-shard-write")
        self.syncer = ThreadPoolExecutor(1, thread_name_prefix="equishard-shard-sync")
        self.inflight: deque[Future] = deque()
        self._store: RecordStore | None = None
        self._store_options: dict | None = None

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.writer.shutdown(wait=True)
        self.syncer.shutdown(wait=True)
        if self._store is not None:
            self._store.close()

    def _store_for(self, read_options: dict, measured: tuple = ()) -> RecordStore:
        options = {**read_options, "__measured": sorted(measured)}
        if self._store is None or options != self._store_options:
            if self._store is not None:
                self._store.close()
            self._store = RecordStore(
                ReadOptions(**read_options), measured=MEASURED | frozenset(measured)
            )
            self._store_options = options
        return self._store

    def submit(self, job: dict) -> Future:
        """Encode one stream now (in the caller's thread); the future gives its shards'
        sidecars in order once the last one is synced and recorded. A sample that cannot be
        written raises here; a failed write or sync fails the future."""
        stage = Path(job["stage"])
        sdir = stage / job["dir"]
        parts = stage / ".parts" / job["dir"]
        sdir.mkdir(parents=True, exist_ok=True)
        parts.mkdir(parents=True, exist_ok=True)
        for stale in sdir.glob("*.partial"):
            stale.unlink()
        # keep the finished prefix of shards that checks out; from the first that does not
        # (missing, damaged, foreign, not the plan's next groups) everything is written again
        done, _ = finished_prefix(job, sdir, parts)
        kept = {Path(m["file"]).name for m in done}
        for extra in sdir.glob("shard-*.tar"):  # later shards, and any of an older naming
            if extra.name not in kept:
                extra.unlink()
        next_step = done[-1]["groups"][-1][0] + 1 if done else -1
        groups = _groups(job, next_step)
        g = next(groups, None)
        parent_groups: dict = {}
        store = self._store_for(job["read_options"], tuple(job.get("measured", ())))
        k = len(done)
        finishing = []
        while g is not None:
            stem = shard_stem(job, k)
            name = f"{stem}.tar"
            sink = _ShardFile(sdir / (name + ".partial"), self)
            meta_groups = []
            samples = 0
            with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tf:
                while g is not None:
                    start = tf.offset
                    if g.get("from"):
                        copy_group(tf, g, job["rank"])
                    else:
                        _add_group(tf, g, job, store, parent_groups)
                    meta_groups.append([g["step"], len(g["samples"]), start, tf.offset - start])
                    samples += len(g["samples"])
                    g = next(groups, None)
                    if tf.offset >= job["shard_size"]:
                        break
            meta = {"file": f"{job['dir']}/{name}", "samples": samples, "groups": meta_groups}
            finishing.append(sink.finish(sdir / name, parts / f"{stem}.json", meta))
            k += 1
        # the sync thread completes shards in order: this runs after the stream's last one
        return self.syncer.submit(lambda: done + [f.result() for f in finishing])


def _groups(job: dict, next_step: int) -> Iterator[dict]:
    """The stream's groups from step ``next_step`` on, built from its rows a batch at a time:
    ``{step, group_id, samples, from}``, ``from`` being the parent group it is copied from."""
    reuse, parents = job["reuse"], job["parents"]
    g = None
    for batch in job["rows"].to_batches(max_chunksize=4096):
        for row in batch.to_pylist():
            if row["step"] < next_step:
                continue
            if g is None or row["group_id"] != g["group_id"]:
                if g is not None:
                    yield g
                ps = row["parent_step"]
                src = reuse.get(ps) if ps >= 0 else None
                g = {"step": row["step"], "group_id": row["group_id"], "samples": [], "from": src}
            g["samples"].append(
                {
                    "sample_id": row["sample_id"],
                    "location": row["location"],
                    "source": row["source"],
                    "fingerprint": row["fingerprint"],
                    "cache_key": row["cache_key"],
                    "cost": {c: row[c] for c in (*COST_FIELDS, *MEDIA_COST_FIELDS) if c in row},
                    "parent": None
                    if row["from_rank"] is None
                    else parents[(row["from_rank"], row["from_step"])],
                }
            )
    if g is not None:
        yield g


def _add_group(tf, g: dict, job: dict, store: RecordStore, parent_groups: dict):
    rank = job["rank"]
    for pos, s in enumerate(g["samples"]):
        parts = read_sample(
            s,
            store,
            parent_groups,
            job.get("check_images", "header"),
            job.get("stored_sizes", False),
        )
        try:
            key = sample_key(g["step"], pos, s["sample_id"])
            doc = {
                "sample_id": s["sample_id"],
                "source": s["source"],
                "images": parts.names,
                "turns": parts.turns,
                "cost": s["cost"],
            }
            if parts.media:  # a sample without video or audio: its document as it always was
                doc["videos"] = [m.name for m in parts.media if m.name.startswith("video")]
                doc["audios"] = [m.name for m in parts.media if m.name.startswith("audio")]
                doc["media"] = {m.name: m.info for m in parts.media}
            add_member(tf, key + ".json", sample_doc(doc, g["step"], g["group_id"], rank))
            for n, b in zip(parts.names, parts.images, strict=True):
                add_member(tf, f"{key}.{n}", b)
            for m in parts.media:
                add_media(tf, key, m, s["sample_id"])
        finally:
            parts.close()


class _ShardFile(io.RawIOBase):
    """The ``.partial`` file of one shard, written by the :class:`StreamWriter`'s writer thread.

    ``write`` only collects bytes; every ~1 MiB they go to the writer thread, which hashes and
    writes them in order (both release the GIL) while the caller reads and encodes the next
    samples. :meth:`finish` hands the shard to the sync thread, which waits for its last bytes,
    then fsyncs, renames it to the final name, fsyncs the directory and writes the sidecar (the
    order crash-safe resume relies on) while the writer thread goes on with the next shard. A
    write failure fails the shard's completion, so a damaged file is never renamed; the caller
    sees it from the future ``finish`` returns.
    """

    _BATCH = 1 << 20
    _INFLIGHT = 32  # batches queued at most, all shards together (bounds memory on a slow disk)

    def __init__(self, path: Path, threads: StreamWriter) -> None:
        self.path, self.pool, self.syncer = path, threads.writer, threads.syncer
        self._inflight = threads.inflight
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a killed run's .partial (or a name planted there): made anew
        self.f = open_new(path)  # never through a link; closed by the I/O thread in _finish
        self.h = hashlib.sha256()
        self.n = self._held = 0
        self._chunks: list[bytes] = []
        self._last: Future | None = None
        self._error: BaseException | None = None

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.n

    def write(self, b) -> int:
        b = bytes(b)
        self._chunks.append(b)
        self.n += len(b)
        self._held += len(b)
        if self._held >= self._BATCH:
            self._queue()
        return len(b)

    def _queue(self) -> None:
        while len(self._inflight) >= self._INFLIGHT:
            self._inflight.popleft().result()
        chunks, self._chunks, self._held = self._chunks, [], 0
        self._last = self.pool.submit(self._write_chunks, chunks)
        self._inflight.append(self._last)

    def _write_chunks(self, chunks: list[bytes]) -> None:
        if self._error is not None:
            return
        try:
            # one hash update and one write per batch: each releases the GIL, and taking it
            # back costs up to a switch interval while the caller runs Python code
            data = b"".join(chunks)
            self.h.update(data)
            self.f.write(data)
        except BaseException as exc:
            self._error = exc
            raise

    def finish(self, final: Path, sidecar: Path, meta: dict) -> Future:
        """Queue the shard's completion; the future gives its sidecar (``meta`` + bytes, sha256)."""
        self._queue()
        # the writer thread runs batches in order; the others' outcome reaches _finish through
        # self._error
        return self.syncer.submit(self._finish, self._last, final, sidecar, meta)

    def _finish(self, last: Future, final: Path, sidecar: Path, meta: dict) -> dict:
        try:
            last.exception()  # the writer thread is done with this shard
            if self._error is not None:
                raise self._error
            self.f.flush()
            os.fsync(self.f.fileno())
        finally:
            self.f.close()
        os.replace(self.path, final)
        fsync_dir(final.parent)
        meta = {**meta, "bytes": self.n, "sha256": self.h.hexdigest()}
        meta = {k: meta[k] for k in ("file", "bytes", "sha256", "samples", "groups")}
        atomic_write_bytes(sidecar, json.dumps(meta).encode())
        return meta
