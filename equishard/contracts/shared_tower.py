"""Video frames that run through the vision tower are the vision phase's load.

Qwen2-VL's ViT runs a video's frames as it runs images (one sequence per pair of frames): in a
step, the vision encoder's time is its images' and its videos' together. Prep measures videos
into their own columns (``video_tokens``, ``video_seq_lens``) and records, with the video rule,
which encoder runs them (``video_rule.tower``). :func:`fold_shared_towers` gives balancing the
table as that encoder sees it: each row's video tokens added to ``vit_tokens`` and its video
sequences appended to ``vit_seq_lens``, the video columns dropped. A table whose metadata does
not say the vision tower runs its videos (one made by hand, or a rule of a family with a video
encoder of its own) keeps its video phase, which balancing then refuses by name
(:func:`~equishard.contracts.phases.check_balanced`): no phase's cost is left out unseen.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from equishard.contracts.columns import VIT_SEQ_LENS, VIT_TOKENS
from equishard.contracts.cost_table import METADATA_KEY
from equishard.contracts.phases import VIDEO, VISION

__all__ = ["concat_lists", "fold_shared_towers", "is_folded", "video_tower"]


def video_tower(table: pa.Table) -> str | None:
    """The encoder the table's metadata says runs its videos (``vision``), or None."""
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        return None
    try:
        rule = json.loads(raw).get("video_rule")
    except (ValueError, AttributeError):
        return None
    tower = rule.get("tower") if isinstance(rule, dict) else None
    return tower if isinstance(tower, str) else None


def _flat(col) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets from 0) of a list column, however it is sliced or chunked."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    values = arr.flatten().to_numpy(zero_copy_only=False)
    return values, offsets - offsets[0]


def concat_lists(a, b) -> pa.Array:
    """Row by row, the list of ``a`` followed by the list of ``b`` (int32 lists)."""
    va, oa = _flat(a)
    vb, ob = _flat(b)
    la, lb = np.diff(oa), np.diff(ob)
    out_off = np.concatenate(([0], np.cumsum(la + lb)))
    values = np.empty(va.size + vb.size, dtype=np.int32)
    values[np.repeat(out_off[:-1] - oa[:-1], la) + np.arange(va.size)] = va
    values[np.repeat(out_off[:-1] + la - ob[:-1], lb) + np.arange(vb.size)] = vb
    return pa.ListArray.from_arrays(pa.array(out_off, pa.int32()), pa.array(values, pa.int32()))


def is_folded(table: pa.Table) -> bool:
    """Has :func:`fold_shared_towers` folded a video phase into this table's vision phase?"""
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    try:
        return raw is not None and VIDEO.name in (json.loads(raw).get("folded") or {})
    except (ValueError, AttributeError, TypeError):
        return False


def fold_shared_towers(table: pa.Table) -> pa.Table:
    """The table as its encoders run it: video folded into the vision phase where its metadata
    says the vision tower runs the videos; else unchanged."""
    if VIDEO.tokens not in table.column_names or video_tower(table) != VISION.name:
        return table
    tokens = pc.add(table.column(VIT_TOKENS), table.column(VIDEO.tokens))
    seq = concat_lists(table.column(VIT_SEQ_LENS), table.column(VIDEO.seq_lens))
    out = table.set_column(table.schema.get_field_index(VIT_TOKENS), VIT_TOKENS, tokens)
    out = out.set_column(out.schema.get_field_index(VIT_SEQ_LENS), VIT_SEQ_LENS, seq)
    out = out.drop_columns(list(VIDEO.columns))
    # the metadata says what the columns now are: the video phase is inside the vision phase
    meta = json.loads(table.schema.metadata[METADATA_KEY])
    if isinstance(meta.get("phases"), list):
        meta["phases"] = [p for p in meta["phases"] if p != VIDEO.name]
    meta["folded"] = {VIDEO.name: VISION.name}
    return out.replace_schema_metadata(
        {**(table.schema.metadata or {}), METADATA_KEY: json.dumps(meta)}
    )
