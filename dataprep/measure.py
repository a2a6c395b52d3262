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
from dataprep.errors import SampleRejected
from dataprep.file_window import FileWindow
from dataprep.image_header import ImageHeader, open_image_file, probe_image, probe_image_bytes
from dataprep.image_refs import image_ref
from dataprep.media_probe import MediaItem, media_modality, media_signature, probe_media
from dataprep.media_rules import MediaRule
from dataprep.policies import VisionPolicy
from dataprep.readers import ImageRef, ReadOptions, WorkUnit, read_unit
from dataprep.records import IMAGE_PLACEHOLDER, PLACEHOLDERS, normalize_record, sample_id_of
from dataprep.text_tokens import TokenCounter
from equishard.common.errors import describe
from equishard.contracts.columns import (
    IMAGE_HEIGHTS,
    IMAGE_WIDTHS,
    LLM_TOKENS,
    NUM_IMAGES,
    TEXT_TOKENS,
    VIT_SEQ_LENS,
    VIT_TOKENS,
)
from equishard.contracts.cost_table import cost_schema
from equishard.contracts.media import MEASURED
from equishard.contracts.phases import AUDIO, VIDEO, VISION

__all__ = ["ChunkResult", "Measurer", "error_row", "fingerprint", "record_bytes"]

_NO_MEDIA: dict = {}  # a run without video or audio rules: no row has media costs (read only)


@dataclass(slots=True)
class ChunkResult:
    """A measured unit: its cost rows as one Arrow batch (cheap to send between processes)."""

    n_in: int = 0
    batch: pa.RecordBatch | None = None
    errors: list[dict] = field(default_factory=list)
    # damaged byte ranges of tars: errors-table rows that are not samples (not in ``n_in``)
    ranges: list[dict] = field(default_factory=list)
    # rows the cache already has: (position among the unit's rows, sample_id, location, source,
    # cache_key); ``batch`` holds the other positions in order
    cached: list[tuple[int, str, str, str, str]] = field(default_factory=list)
    lines: list[int | None] = field(default_factory=list)  # input line of each ``batch`` row
    cached_lines: list[int | None] = field(default_factory=list)  # and of each ``cached`` row

    def row_lines(self) -> list[int | None]:
        """The input line of each of the unit's rows in order (measured and cached merged)."""
        n = len(self.lines) + len(self.cached)
        out: list[int | None] = [None] * n
        cached_at = {c[0]: line for c, line in zip(self.cached, self.cached_lines, strict=True)}
        measured = iter(self.lines)
        for i in range(n):
            out[i] = cached_at[i] if i in cached_at else next(measured)
        return out


@dataclass(slots=True)
class _Prepared:
    """A unit read and probed, waiting for its text token counts."""

    unit: WorkUnit
    out: ChunkResult
    pending: list
    texts: list[str]


def _probe(ref: ImageRef, check: str) -> tuple[ImageHeader, os.stat_result | None]:
    """An image's header, and the status of the file it was read from, taken after the probe
    (None for bytes embedded in the record)."""
    if ref.data is not None:
        return probe_image_bytes(ref.data, ref.where, check), None
    if ref.size is None:
        with open_image_file(ref.path, ref.root) as f:
            header = probe_image(f, os.fstat(f.fileno()).st_size, ref.path, check)
            return header, os.fstat(f.fileno())
    with open(ref.path, "rb") as f:
        header = probe_image(FileWindow(f, ref.offset, ref.size), ref.size, ref.where, check)
        return header, os.fstat(f.fileno())


def record_bytes(rec) -> bytes:
    """The bytes a record's fingerprint starts from: as read, or its canonical JSON."""
    if rec.raw is not None:
        return rec.raw
    return json.dumps(rec.record, sort_keys=True, default=_digest).encode()


def fingerprint(raw: bytes, headers: list[ImageHeader], media: tuple | list = ()) -> str:
    """A sample's content fingerprint: its record bytes, each image's byte size and pixel
    size, and each video's and recording's header (:func:`media_signature`; nothing for a
    sample without them, whose fingerprint is as it always was). write recomputes it from what
    it reads to find inputs that changed after prep."""
    fp = hashlib.blake2b(raw, digest_size=16)
    for h in headers:
        fp.update(f"|{h.nbytes}:{h.width}x{h.height}".encode())
    for m in media:
        fp.update(media_signature(m).encode())
    return fp.hexdigest()


def _clean(text: str | None) -> str | None:
    """A string Arrow can store (UTF-8): lone surrogates become backslash escapes."""
    if text is None:
        return None
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_row(source, location, line, sample_id, exc: SampleRejected) -> dict:
    """One errors-table row (strings made storable whatever the bad input held)."""
    return {
        "source": _clean(source),
        "location": _clean(location),
        "line": line,
        "sample_id": _clean(sample_id),
        "reason": exc.reason,
        "detail": _clean(exc.detail),
    }


def cache_key(raw: bytes, refs: list[ImageRef], stats: list | None = None) -> str:
    """Changes when the record's bytes or any image file changes (size, mtime); no image reads.
    ``stats``: each ref's file status where the caller has it (the writer's, taken after it
    read the bytes it writes), instead of a separate ``os.stat``; None for embedded bytes."""
    h = hashlib.blake2b(raw, digest_size=16)
    for k, r in enumerate(refs):
        if r.data is not None:
            h.update(b"|d" + hashlib.blake2b(r.data, digest_size=16).digest())
            continue
        if stats is not None:
            st = stats[k]
        else:
            try:
                st = os.stat(r.path)
            except OSError:
                return ""  # unreadable: measure it (and reject it with a reason)
        h.update(f"|{r.path}:{st.st_size}:{st.st_mtime_ns}:{r.offset}:{r.size}".encode())
    return h.hexdigest()


def _digest(obj) -> str:
    return hashlib.blake2b(obj, digest_size=8).hexdigest() if isinstance(obj, bytes) else repr(obj)


def with_image_text(text: str, costs: list, prefix: str = "") -> str:
    """The rendered text with each image's own prompt text (``ImageCost.text``: SmolVLM's tile
    markers) in front of its placeholder, ``ImageCost.after`` behind it and
    ``ImageCost.before`` in front of the template's own start of the image (``prefix``), so
    that the tokenizer counts it as it stands in the processor's prompt."""
    if not any(c.text or c.after or c.before for c in costs):
        return text
    parts = text.split(IMAGE_PLACEHOLDER)
    if len(parts) != len(costs) + 1:
        raise SampleRejected(
            "template_image_mismatch",
            f"the rendered text has {len(parts) - 1} image placeholder(s) for {len(costs)} image(s)",
        )
    out = [parts[0]]
    for c, part in zip(costs, parts[1:], strict=True):
        if c.before:
            if not out[-1].endswith(prefix):
                raise SampleRejected(
                    "template_image_mismatch",
                    f"an image placeholder is not after the template's image start {prefix!r}",
                )
            cut = len(out[-1]) - len(prefix)
            out[-1] = out[-1][:cut] + c.before + out[-1][cut:]
        out.append(c.text + IMAGE_PLACEHOLDER + c.after + part)
    return "".join(out)


def with_media_text(text: str, media_costs: dict, rules: dict) -> str:
    """The rendered text with each video's or recording's own prompt text (``MediaCost.text``:
    InternVL's frame labels, Qwen3-VL's timestamps) in front of its placeholder, in the order
    the placeholders stand (a sample's items are listed in that order). A rule whose processor
    collapses the template's wrapper around the item into its own (``MediaRule.collapses``:
    Qwen3-VL's ``<|vision_start|>``...``<|vision_end|>``) has it taken out where it stands
    whole around the placeholder, as the processor takes it out."""
    for modality, costs in media_costs.items():
        wrap = rules[modality].collapses
        if not wrap and not any(c.text for c in costs):
            continue
        mark = PLACEHOLDERS[modality]
        parts = text.split(mark)
        if len(parts) != len(costs) + 1:
            raise SampleRejected(
                "template_image_mismatch",
                f"the rendered text has {len(parts) - 1} {modality} placeholder(s) for "
                f"{len(costs)} {modality}(s)",
            )
        out = [parts[0]]
        for c, part in zip(costs, parts[1:], strict=True):
            if wrap and out[-1].endswith(wrap[0]) and part.startswith(wrap[1]):
                out[-1] = out[-1][: -len(wrap[0])]
                part = part[len(wrap[1]) :]
            out.append(c.text + mark + part)
        text = "".join(out)
    return text


class Measurer:
    def __init__(
        self,
        *,
        policy: VisionPolicy,
        template: ChatTemplate,
        counter: TokenCounter,
        opts: ReadOptions,
        cache: dict[str, str] | None = None,
        check_images: str = "header",
        video_rule: MediaRule | None = None,
        audio_rule: MediaRule | None = None,
    ) -> None:
        self.policy = policy
        self.template = template
        self.counter = counter
        self.opts = opts
        self.cache = cache or {}
        self.check_images = check_images
        # the rule of each measured modality besides images, and the phases the table has
        self.rules = {
            m: r for m, r in (("video", video_rule), ("audio", audio_rule)) if r is not None
        }
        self.measured = MEASURED | frozenset(self.rules)
        self.phases = (VISION, *(p for p in (VIDEO, AUDIO) if p.modality in self.rules))
        self.schema = cost_schema(self.phases)

    def count(self, texts: list[str]) -> list[int | str]:
        """Text tokens of each text; a text the tokenizer refuses gets the error message in its
        place (only that sample is rejected, not the batch)."""
        try:
            return list(self.counter.count(texts))
        except Exception:  # find the culprit(s): one call per text
            out: list[int | str] = []
            for t in texts:
                try:
                    out.append(self.counter.count([t])[0])
                except Exception as exc:
                    out.append(f"the tokenizer refuses the text ({type(exc).__name__}: {exc})")
            return out

    def measure(self, unit: WorkUnit) -> ChunkResult:
        prepared = self.prepare(unit)
        return self.finish(prepared, self.count(prepared.texts))

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
                counting = pool.submit(self.count, prepared.texts)
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
            location = f"{unit.path}#{rec.index}"
            if not rec.sample:
                out.ranges.append(error_row(unit.source, location, rec.line, None, rec.error))
                continue
            out.n_in += 1
            sample_id = rec.key
            try:
                if rec.error is not None:
                    raise rec.error
                sample_id = sample_id_of(rec.record, f"{unit.source}:{rec.index}")
                sample = normalize_record(
                    rec.record,
                    sample_id,
                    images=rec.images,
                    measured=self.measured,
                    media=rec.media,
                )
                refs = [
                    image_ref(img, unit.path, self.opts, f"{location}/image{k}")
                    for k, img in enumerate(sample.images)
                ]
                media = (
                    [
                        MediaItem(m, image_ref(item, unit.path, self.opts, f"{location}/{m}{k}", m))
                        for m, items in (("video", sample.videos), ("audio", sample.audios))
                        for k, item in enumerate(items)
                    ]
                    if sample.videos or sample.audios
                    else ()
                )
                all_refs = refs + [item.ref for item in media] if media else refs
                raw = record_bytes(rec)
                key = cache_key(raw, all_refs)
                if key and self.cache.get(sample_id) == key:
                    position = len(pending) + len(out.cached)
                    out.cached.append((position, sample_id, location, unit.source, key))
                    out.cached_lines.append(rec.line)
                    continue
                probed = [_probe(r, self.check_images) for r in refs]
                headers = [h for h, _ in probed]
                media_probed = [probe_media(item) for item in media] if media else ()
                stats = [st for _, st in probed]
                if media:
                    stats += [st for _, st in media_probed]
                if cache_key(raw, all_refs, stats) != key:
                    # an image changed between the key's stat and the probe (or during it): the
                    # costs are of whatever was read, so no later run may take this sample as
                    # unchanged by its key; write checks its fingerprint instead
                    key = ""
                costs = self.policy.sample_costs([(h.width, h.height) for h in headers])
                media_costs = {m: [] for m in self.rules} if self.rules else _NO_MEDIA
                for item, (header, _) in zip(media, media_probed, strict=True):
                    try:
                        media_costs[item.modality].append(self.rules[item.modality].cost(header))
                    except SampleRejected as exc:  # the rule's own refusal, named by its item
                        raise SampleRejected(
                            exc.reason, f"{item.ref.where}: {exc.detail}"
                        ) from None
                text = self.template.render(sample.turns)
                text = with_image_text(text, costs, self.template.image_prefix)
                if media:
                    text = with_media_text(text, media_costs, self.rules)
                text = self.policy.prompt(text)
            except SampleRejected as exc:
                out.errors.append(error_row(unit.source, location, rec.line, sample_id, exc))
                continue
            except Exception as exc:  # whatever else is wrong with one record is its own row
                err = SampleRejected("unreadable_record", f"{location}: {describe(exc)}")
                out.errors.append(error_row(unit.source, location, rec.line, sample_id, err))
                continue
            texts.append(text)
            position = len(pending) + len(out.cached)
            pending.append(
                (
                    sample_id,
                    location,
                    headers,
                    costs,
                    media_costs,
                    fingerprint(raw, headers, [h for h, _ in media_probed] if media else ()),
                    key,
                    rec.line,
                    position,
                )
            )
        return _Prepared(unit=unit, out=out, pending=pending, texts=texts)

    def finish(self, prepared: _Prepared, counts: list[int]) -> ChunkResult:
        """The unit's cost rows, given the text token count of each prepared sample."""
        out, unit = prepared.out, prepared.unit
        rows: dict[str, list] = {c: [] for c in self.schema.names}
        dropped: list[int] = []  # positions of samples whose text the tokenizer refused
        for (
            sample_id,
            location,
            headers,
            costs,
            media_costs,
            fp,
            key,
            line,
            position,
        ), n_text in zip(prepared.pending, counts, strict=True):
            if isinstance(n_text, str):
                err = SampleRejected("invalid_text", f"{location}: {n_text}")
                out.errors.append(error_row(unit.source, location, line, sample_id, err))
                dropped.append(position)
                continue
            out.lines.append(line)
            seq = [s for c in costs for s in c.vit_seq_lens]
            n_img = len(headers)
            rows["sample_id"].append(sample_id)
            rows["source"].append(unit.source)
            rows[NUM_IMAGES].append(n_img)
            rows[VIT_TOKENS].append(sum(seq))
            rows[VIT_SEQ_LENS].append(seq)
            media_llm = 0
            if self.rules:  # the video and audio phases' columns
                for phase in self.phases[1:]:
                    items = media_costs[phase.modality]
                    lens = [s for c in items for s in c.seq_lens]
                    rows[phase.items].append(len(items))
                    rows[phase.tokens].append(sum(lens))
                    rows[phase.seq_lens].append(lens)
                    media_llm += sum(c.llm_tokens for c in items)
                modality = media_modality(n_img, media_costs)
            else:
                modality = "text" if n_img == 0 else "image" if n_img == 1 else "multi-image"
            rows[LLM_TOKENS].append(n_text + sum(c.llm_tokens for c in costs) + media_llm)
            rows[TEXT_TOKENS].append(n_text)
            rows["modality"].append(modality)
            rows[IMAGE_WIDTHS].append([h.width for h in headers])
            rows[IMAGE_HEIGHTS].append([h.height for h in headers])
            rows["location"].append(location)
            rows["fingerprint"].append(fp)
            rows["cache_key"].append(key)
        out.batch = pa.RecordBatch.from_pydict(rows, schema=self.schema)
        if dropped:  # cached rows after a dropped one move up
            out.cached = [(pos - sum(d < pos for d in dropped), *rest) for pos, *rest in out.cached]
        return out
