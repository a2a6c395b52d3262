"""Prep's ``--cache``: the rows of an earlier cost table reused for samples that did not change.

A row is reused when its sample id and cache key (the record's bytes, each image file's size
and mtime) match, so its images are not read again. The key says nothing about *how* the row
was measured: a cost table of another tokenizer, chat template or vision policy would hand its
counts to this prep, whose table then records this prep's settings over them, and every
consumer that checks the settings (write, the collator, ``equishard train``) would be misled.
So the cache's recorded settings are compared with this prep's first, by what decides the
counts (the tokenizer's bytes, not its path; the policy's fields; the template's fields or its
Jinja source), and a difference is refused naming both. A cache whose images were checked less
strictly (``header``) than this prep asks (``decode``) is refused too: its rows skipped the
decode.

Nor is a row trusted for being in the table: prep seals each row's key with a digest of its
counts and of the settings that made them (``<input key>.<seal>``, :func:`seal_keys`). A row
whose counts were edited since (by hand or by a tool, keeping the table's own row rules), or
that came from a table of other settings pasted under this one's metadata, no longer matches
its seal and is measured again; so is a row of a table from before seals.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa

from dataprep.chat_template import load_template
from dataprep.image_orientation import IMAGE_SIZES
from dataprep.jinja_template import RENDERING_KEYS
from dataprep.measure import ChunkResult
from dataprep.policies import parse_vision_policy
from dataprep.text_tokens import TokenizerSpec
from equishard.contracts.cost_table import COST_SCHEMA, read_cost_table, table_metadata
from equishard.contracts.phases import ENCODER_PHASES

__all__ = [
    "cache_keys",
    "check_cache_settings",
    "counts_identity",
    "input_key",
    "seal_keys",
    "settings_identity",
    "with_cached",
]

_STRICTNESS = {"header": 0, "decode": 1}


def counts_identity(meta: dict) -> dict:
    """The settings of a cost table's metadata that decide its counts, in a form that compares
    equal exactly when the counts would: the tokenizer by its bytes (sha256) or estimate ratio,
    the vision policy by all its fields, the template by its fields (built-in) or its Jinja
    source and options. Values that are not what prep writes stay as they are (and differ)."""
    tok = meta.get("tokenizer")
    if isinstance(tok, dict):
        keep = ("mode", "sha256") if tok.get("mode") == "tokenizer" else ("mode", "chars_per_token")
        tok = {k: tok.get(k) for k in keep}
    tmpl = meta.get("template")
    if isinstance(tmpl, dict) and tmpl.get("kind") == "jinja":
        tmpl = {k: tmpl.get(k) for k in RENDERING_KEYS}
    # one JSON round trip: a tuple here and a list read back compare equal
    identity = {"tokenizer": tok, "vision_policy": meta.get("vision_policy"), "template": tmpl}
    for rule in ("video_rule", "audio_rule"):  # where a run measured video or audio
        if meta.get(rule) is not None:
            identity[rule] = meta[rule]
    return json.loads(json.dumps(identity))


def _settings(cfg) -> dict:
    from dataprep.media_rules.registry import media_rules_recorded

    return {
        "tokenizer": TokenizerSpec.parse(cfg.tokenizer).describe(),
        "vision_policy": parse_vision_policy(cfg.vision_policy).describe(),
        "template": load_template(cfg.template).describe(),
        **media_rules_recorded(cfg),
    }


def settings_identity(cfg) -> bytes:
    """What decides a prep's counts (:func:`counts_identity` of its settings), as the bytes a
    row's seal covers."""
    return json.dumps(counts_identity(_settings(cfg)), sort_keys=True).encode()


# a row's counts as its seal covers them: every column prep measured (not where it was read
# from, nor the key itself); sample_id first, num_images second
_UNSEALED = ("source", "location", "cache_key")
_SEALED = tuple(n for n in COST_SCHEMA.names if n not in _UNSEALED)


def _seal(key: str, row: tuple, identity: bytes) -> str:
    h = hashlib.blake2b(identity, digest_size=8)
    h.update(json.dumps([key, *row], separators=(",", ":")).encode())
    return h.hexdigest()


# a video or audio phase's columns, sealed too where the table has them (an image-only row's
# seal is as it always was)
_MEDIA = tuple(c for p in ENCODER_PHASES[1:] for c in p.columns)


def _rows(table) -> list[tuple]:
    names = [*_SEALED, *(c for c in _MEDIA if c in table.schema.names)]
    return list(zip(*(table.column(c).to_pylist() for c in names), strict=True))


def seal_keys(batch: pa.RecordBatch, identity: bytes) -> pa.RecordBatch:
    """``batch`` with each row's cache key (the input key :func:`~dataprep.measure.cache_key`
    gives) sealed with its counts and ``identity``: ``<input key>.<seal>``. A row without a key
    (an image that changed while it was read) keeps none."""
    keys = batch.column("cache_key").to_pylist()
    sealed = [
        f"{input_key(k)}.{_seal(input_key(k), row, identity)}" if k else k
        for k, row in zip(keys, _rows(batch), strict=True)
    ]
    i = batch.schema.get_field_index("cache_key")
    return batch.set_column(i, "cache_key", pa.array(sealed, pa.string()))


def input_key(key: str | None) -> str | None:
    """The input part of a (sealed) cache key: what the record and its image files give."""
    return key.partition(".")[0] if key else key


def check_cache_settings(cfg) -> None:
    """Refuse a ``cfg.cache`` cost table measured with other settings than ``cfg``'s."""
    if not cfg.cache:
        return
    try:
        old = table_metadata(cfg.cache)
    except ValueError as exc:
        raise ValueError(f"--cache {cfg.cache}: {exc}") from None
    now = _settings(cfg)
    have, want = counts_identity(old), counts_identity(now)
    diff = [k for k in want if have.get(k) != want[k]]
    if diff:
        said = "; ".join(
            f"{k}: the cache's {_short(old.get(k))}, this prep's {_short(now[k])}" for k in diff
        )
        raise ValueError(
            f"--cache {cfg.cache} was measured with other settings ({said}); its rows would "
            "carry the other setting's token counts under this prep's name. Give the cost "
            "table of a prep with the same tokenizer, template and vision policy, or drop --cache"
        )
    was = old.get("check_images", "header")
    if _STRICTNESS.get(was, -1) < _STRICTNESS[cfg.check_images]:
        raise ValueError(
            f"--cache {cfg.cache} checked images with {was!r}, this prep asks for "
            f"{cfg.check_images!r}: its rows never had their images decoded. Drop --cache to "
            "check every image, or prep with the cache's check"
        )


def _short(v) -> str:
    if isinstance(v, dict):
        for key in ("spec", "path", "name", "mode"):
            if isinstance(v.get(key), str):
                extra = (
                    f" (sha256 {v['sha256'][:12]}...)" if isinstance(v.get("sha256"), str) else ""
                )
                return f"{v[key]!r}{extra}"
    return repr(v)[:120]


def cache_keys(cfg) -> dict[str, str]:
    """``{sample_id: input key}`` of the cache's rows that may be reused (none without one):
    those whose seal matches their counts under ``cfg``'s settings."""
    if not cfg.cache:
        return {}
    t = read_cost_table(cfg.cache)
    # a table from before images were counted as displayed (EXIF orientation applied): its
    # rows with images are measured again, a photo stored sideways may count otherwise now
    stored_sizes = table_metadata(cfg.cache).get("image_sizes") != IMAGE_SIZES
    identity = settings_identity(cfg)
    out = {}
    for batch in t.to_batches(max_chunksize=1 << 16):  # Python rows a batch at a time
        keys = batch.column("cache_key").to_pylist()
        for key, row in zip(keys, _rows(batch), strict=True):
            got, _, seal = (key or "").partition(".")
            if got and seal == _seal(got, row, identity) and not (stored_sizes and row[1]):
                out[row[0]] = got
    return out


def with_cached(chunk: ChunkResult, cache: pa.Table, where: dict[str, int]) -> pa.RecordBatch:
    """The chunk's rows in input order: measured ones and the cache's rows for the rest."""
    if not chunk.cached:
        return chunk.batch
    pos, sids, locs, sources, keys = zip(*chunk.cached, strict=True)
    rows = cache.take(pa.array([where[s] for s in sids]))
    for name, values in (("location", locs), ("source", sources), ("cache_key", keys)):
        rows = rows.set_column(rows.schema.get_field_index(name), name, pa.array(values))
    both = pa.concat_tables(
        [pa.Table.from_batches([chunk.batch]), rows.select(chunk.batch.schema.names)]
    )
    n = both.num_rows
    measured_pos = np.setdiff1d(np.arange(n), np.array(pos))
    order = np.argsort(np.concatenate([measured_pos, np.array(pos)]), kind="stable")
    return both.take(pa.array(order)).combine_chunks().to_batches()[0]
