"""The duplicate-``sample_id`` kernel against two independent answers: a Counter over Python
strings and pyarrow's own ``value_counts``, over ids drawn from a small alphabet (many repeats,
ids that share prefixes or differ only in length), nulls and empty strings, unicode, chunked,
sliced and 64-bit-offset columns; and the size rule that picks pyarrow for small columns (no
numba import) and the kernel for large ones. Planted bugs this catches: only the later copy
marked, a prefix taken for a repeat, a hash slot taken for a match, a null counted as an id, a
large column sent through the slow path or a small one through numba's start-up."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import equishard.common.repeated_ids as rid
from equishard.common.repeated_ids import repeated_mask_arrow, repeated_reference
from equishard.common.repeated_ids import repeated_mask_numba as repeated_mask
from equishard.contracts.cost_table import validate_cost_table

IDS = st.lists(st.one_of(st.none(), st.text(alphabet="ab1é", max_size=3)), max_size=60)


def _peer(ids: list) -> np.ndarray:
    """pyarrow's answer: the values whose count is over one, looked up per row."""
    arr = pa.array(ids, pa.string())
    counts = pc.value_counts(arr)
    dup = counts.filter(pc.greater(counts.field("counts"), 1)).field("values").drop_null()
    return np.asarray(pc.fill_null(pc.is_in(arr, value_set=dup), False), dtype=bool)


@settings(max_examples=300, deadline=None)
@given(IDS, st.integers(1, 4), st.booleans())
def test_kernel_equals_a_counter_and_pyarrow(ids, chunks, large):
    want = repeated_reference(ids)
    np.testing.assert_array_equal(want, _peer(ids))
    kind = pa.large_string() if large else pa.string()
    cuts = np.linspace(0, len(ids), chunks + 1).astype(int)
    column = pa.chunked_array([pa.array(ids[a:b], kind) for a, b in itertools.pairwise(cuts)], kind)
    for mask in (repeated_mask, repeated_mask_arrow, rid.repeated_mask):
        np.testing.assert_array_equal(mask(column), want)
        np.testing.assert_array_equal(mask(pa.array(ids, kind)), want)


@settings(max_examples=100, deadline=None)
@given(IDS, st.integers(0, 30), st.integers(0, 30))
def test_a_sliced_column_is_read_from_its_own_offset(ids, start, length):
    part = pa.array(ids, pa.string()).slice(start, length)
    np.testing.assert_array_equal(repeated_mask(part), repeated_reference(part.to_pylist()))


def test_many_ids_with_a_few_repeats():
    """A hundred thousand ids that differ in one digit (the finalizer spreads them), three
    repeated: exactly their six rows."""
    ids = [f"sample-{i:07d}" for i in range(100_000)]
    for a, b in ((5, 99_999), (123, 124), (70_000, 0)):
        ids[b] = ids[a]
    got = repeated_mask(pa.array(ids))
    np.testing.assert_array_equal(np.flatnonzero(got), sorted({5, 99_999, 123, 124, 70_000, 0}))


def test_ids_of_one_slot_and_tag_are_compared_byte_for_byte():
    """Two ids of one length whose hashes agree in the tag and the slot bits of a small table
    (found by brute force over 2M ids): not repeats; the bytes tell them apart."""
    pair = ["id-1042840", "id-1700033"]
    assert not repeated_mask(pa.array(pair)).any()
    assert repeated_mask(pa.array([*pair, "id-1700033"])).tolist() == [False, True, True]


def test_the_cost_table_check_names_the_repeated_rows():
    table = pa.table(
        {
            "sample_id": ["x", "y", "x", "z"],
            "num_images": pa.array([0] * 4, pa.int32()),
            "vit_tokens": pa.array([0] * 4, pa.int64()),
            "llm_tokens": pa.array([5] * 4, pa.int64()),
            "text_tokens": pa.array([5] * 4, pa.int64()),
            "vit_seq_lens": pa.array([[]] * 4, pa.list_(pa.int32())),
        }
    )
    with pytest.raises(ValueError, match=r"2 row\(s\) where sample_id appears more than once.*"
                       r"rows \[0, 2\].*\['x', 'x'\]"):  # fmt: skip
        validate_cost_table(table, "cost.parquet")


def test_a_column_of_another_type_is_refused():
    with pytest.raises(TypeError, match="string column"):
        repeated_mask(pa.array([1, 2, 1]))


def test_small_columns_skip_numba_and_large_ones_take_the_kernel(monkeypatch):
    """At most SMALL rows: pyarrow alone (a small write never imports numba); above: the kernel
    (pyarrow's value_counts took 5-9 s at 10M ids)."""
    import subprocess
    import sys

    code = (
        "import sys, pyarrow as pa; from equishard.contracts.cost_table import validate_cost_table; "
        "from equishard.common.repeated_ids import repeated_mask; "
        "repeated_mask(pa.array([f'id-{i}' for i in range(1000)] + ['id-3'])); "
        "print('numba' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
    assert rid.SMALL >= 100_000  # pyarrow's speed there: well under numba's start-up
    ids = pa.array([f"id-{i}" for i in range(40)] + ["id-7"])
    took = []
    monkeypatch.setattr(rid, "repeated_mask_arrow", lambda a: took.append("arrow") or [])
    monkeypatch.setattr(rid, "repeated_mask_numba", lambda a: took.append("numba") or [])
    monkeypatch.setattr(rid, "SMALL", 41)
    rid.repeated_mask(ids)
    monkeypatch.setattr(rid, "SMALL", 40)
    rid.repeated_mask(ids)
    assert took == ["arrow", "numba"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab1é\x00", max_size=12), max_size=40), st.integers(0, 3))
def test_the_id_hash_kernel_equals_its_twin(ids, start):
    """The hash a plan over partitions sends each id by (``nb_id_hashes``) against the FNV-1a +
    finalizer in plain Python, on a sliced column (its offsets not from 0)."""
    from equishard.common.repeated_ids import _buffers, id_hash_reference
    from equishard.common.repeated_ids_kernel import nb_id_hashes

    arr = pa.array(["pad"] * start + ids, pa.string()).slice(start)
    offsets, data, _ = _buffers(arr)
    want = [id_hash_reference(x.encode()) for x in ids]
    assert nb_id_hashes(offsets, data).tolist() == want
    # known values: FNV-1a of "" is its offset basis, run through the finalizer
    assert id_hash_reference(b"") == _finalized(14695981039346656037)


def _finalized(h: int) -> int:
    m = (1 << 64) - 1
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & m
    return h ^ (h >> 33)
