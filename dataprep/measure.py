"""Measure one work unit: records -> cost rows (and rejected rows with their reasons).

A :class:`Measurer` holds what a worker needs (vision policy, chat template, token counter, read
options); :meth:`Measurer.measure` reads a unit, probes image headers, renders and batch-encodes
the text, and returns the unit's rows as columns; :meth:`Measurer.measure_many` does the same
for a sequence of units, encoding one unit's text while it reads the next. Every record read
is either a row or an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from dataprep.chat_template import ChatTemplate
from dataprep.cost_table import COST_SCHEMA
from dataprep.errors import SampleRejected
from dataprep.image_header import ImageHeader, probe_image, probe_image_bytes, probe_image_file
from dataprep.readers import ImageRef, ReadOptions, WorkUnit, read_unit
from dataprep.records import normalize_record, sample_id_of
from dataprep.text_tokens import TokenCounter
from dataprep.vision_policy import VisionPolicy

__all__ = ["ChunkResult", "Measurer"]


@dataclass(slots=True)
class ChunkResult:
    """A measured unit: its cost rows as one Arrow batch (cheap to send between processes)."""

    n_in: int = 0
    batch: pa.RecordBatch | None = None
    errors: list[dict] = field(default_factory=list)
    # rows the cache already has: (position among the unit's rows, sample_id, location, source,
    # cache_key); ``batch`` holds the other positions in order
    cached: list[tuple[int, str, str, str, str]] = field(default_factory=list)


@dataclass(slots=True)
class _Prepared:
    """A unit read and probed, waiting for its text token counts."""

    unit: WorkUnit
    out: ChunkResult
    pending: list
    texts: list[str]


class _Window:
    """A read-only view of ``size`` bytes at ``offset`` of an open file (a tar member)."""

    def __init__(self, f, offset: int, size: int) -> None:
        self._f, self._offset, self._size, self._pos = f, offset, size, 0

    def read(self, n: int = -1) -> bytes:
        left = self._size - self._pos
        n = left if n is None or n < 0 else min(n, left)
        self._f.seek(self._offset + self._pos)
        data = self._f.read(n)
        self._pos += len(data)
        return data

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, min(self._size, base + pos))
        return self._pos

    def tell(self) -> int:
        return self._pos


def _probe(ref: ImageRef) -> ImageHeader:
    if ref.data is not None:
        return probe_image_bytes(ref.data, ref.where)
    if ref.size is None:
        return probe_image_file(ref.path)
    with open(ref.path, "rb") as f:
        return probe_image(_Window(f, ref.offset, ref.size), ref.size, ref.where)


def cache_key(raw: bytes, refs: list[ImageRef]) -> str:
    """Changes when the record's bytes or any image file changes (size, mtime); no image reads."""
    h = hashlib.blake2b(raw, digest_size=16)
    for r in refs:
        if r.data is not None:
            h.update(b"|d" + hashlib.blake2b(r.data, digest_size=16).digest())
            continue
        try:
            st = os.stat(r.path)
        except OSError:
            return ""  # unreadable: measure it (and reject it with a reason)
        h.update(f"|{r.path}:{st.st_size}:{st.st_mtime_ns}:{r.offset}:{r.size}".encode())
    return h.hexdigest()


def _digest(obj) -> str:
    return hashlib.blake2b(obj, digest_size=8).hexdigest() if isinstance(obj, bytes) else repr(obj)


class Measurer:
    def __init__(
        self,
        *,
        policy: VisionPolicy,
        template: ChatTemplate,
        counter: TokenCounter,
        opts: ReadOptions,
        cache: dict[str, str] | None = None,
    ) -> None:
        self.policy = policy
        self.template = template
        self.counter = counter
        self.opts = opts
        self.cache = cache or {}

    def _ref(self, item, unit: WorkUnit, index: int, k: int) -> ImageRef:
        where = f"{unit.path}#{index}/image{k}"
        if isinstance(item, ImageRef):
            return item
        if isinstance(item, dict):
            if item.get("bytes"):
                return ImageRef(where=where, data=item["bytes"])
            item = item.get("path")
        if isinstance(item, (bytes, bytearray)):
            return ImageRef(where=where, data=bytes(item))
        if not isinstance(item, str) or not item:
            raise SampleRejected(
                "missing_image", f"{where}: image reference {item!r:.80} is not a path"
            )
        path = os.path.join(self.opts.image_root or os.path.dirname(unit.path), item)
        return ImageRef(where=path, path=path)

    def measure(self, unit: WorkUnit) -> ChunkResult:
        prepared = self.prepare(unit)
        return self.finish(prepared, self.counter.count(prepared.texts))

    def measure_many(self, units: Iterable[WorkUnit]) -> Iterator[ChunkResult]:
        """``measure`` over ``units`` in order, with each unit's batch encode (native code that
        releases the GIL) running in a thread while the next unit is read and probed."""
        if self.counter.spec.path is None:  # the estimate is Python: nothing to overlap
            yield from map(self.measure, units)
            return
        with ThreadPoolExecutor(1, thread_name_prefix="equishard-tokenize") as pool:
            previous = None
            for unit in units:
                prepared = self.prepare(unit)
                counting = pool.submit(self.counter.count, prepared.texts)
                if previous is not None:
                    yield self.finish(previous[0], previous[1].result())
                previous = (prepared, counting)
            if previous is not None:
                yield self.finish(previous[0], previous[1].result())

    def prepare(self, unit: WorkUnit) -> _Prepared:
        """Everything but the token count: read, probe image headers, render the texts."""
        out = ChunkResult()
        pending = []
        texts = []
        for rec in read_unit(unit, self.opts):
            out.n_in += 1
            location = f"{unit.path}#{rec.index}"
            sample_id = None
            try:
                if rec.error is not None:
                    raise rec.error
                sample_id = sample_id_of(rec.record, f"{unit.source}:{rec.index}")
                sample = normalize_record(rec.record, sample_id, images=rec.images)
                refs = [self._ref(img, unit, rec.index, k) for k, img in enumerate(sample.images)]
                raw = rec.raw
                if raw is None:
                    raw = json.dumps(rec.record, sort_keys=True, default=_digest).encode()
                key = cache_key(raw, refs)
                if key and self.cache.get(sample_id) == key:
                    position = len(pending) + len(out.cached)
                    out.cached.append((position, sample_id, location, unit.source, key))
                    continue
                headers = [_probe(r) for r in refs]
                costs = [self.policy.image_cost(h.width, h.height) for h in headers]
                texts.append(self.template.render(sample.turns))
            except SampleRejected as exc:
                out.errors.append(
                    {
                        "source": unit.source,
                        "location": location,
                        "line": rec.line,
                        "sample_id": sample_id,
                        "reason": exc.reason,
                        "detail": exc.detail,
                    }
                )
                continue
            fp = hashlib.blake2b(raw, digest_size=16)
            for h in headers:
                fp.update(f"|{h.nbytes}:{h.width}x{h.height}".encode())
            pending.append((sample_id, location, headers, costs, fp.hexdigest(), key))
        return _Prepared(unit=unit, out=out, pending=pending, texts=texts)

    def finish(self, prepared: _Prepared, counts: list[int]) -> ChunkResult:
        """The unit's cost rows, given the text token count of each prepared sample."""
        out, unit = prepared.out, prepared.unit
        rows: dict[str, list] = {c: [] for c in COST_SCHEMA.names}
        for (sample_id, location, headers, costs, fp, key), n_text in zip(
            prepared.pending, counts, strict=True
        ):
            seq = [s for c in costs for s in c.vit_seq_lens]
            n_img = len(headers)
            rows["sample_id"].append(sample_id)
            rows["source"].append(unit.source)
            rows["num_images"].append(n_img)
            rows["vit_tokens"].append(sum(seq))
            rows["vit_seq_lens"].append(seq)
            rows["llm_tokens"].append(n_text + sum(c.llm_tokens for c in costs))
            rows["text_tokens"].append(n_text)
            rows["modality"].append(
                "text" if n_img == 0 else "image" if n_img == 1 else "multi-image"
            )
            rows["image_widths"].append([h.width for h in headers])
            rows["image_heights"].append([h.height for h in headers])
            rows["location"].append(location)
            rows["fingerprint"].append(fp)
            rows["cache_key"].append(key)
        out.batch = pa.RecordBatch.from_pydict(rows, schema=COST_SCHEMA)
        return out
