"""A cost table made by hand or by another tool enters through ``read_cost_table``: its columns
must agree within each row as docs/concepts.md defines them. ``vit_tokens`` is the sum of the row's
``vit_seq_lens`` (balancing groups by the one, the cost model and the encoder run the other),
and image sizes, where given, are one per image. Before, a row breaking either was balanced by
numbers the model never runs; now the file, the rule and the sample are named (and ``equishard
balance`` exits 2 with that line)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from equishard.contracts.cost_table import read_cost_table


def _table(**columns) -> pa.Table:
    base = {
        "sample_id": ["text", "one", "tiles", "dummy"],
        "source": ["hand"] * 4,
        "num_images": pa.array([0, 1, 1, 0], pa.int32()),
        "vit_tokens": pa.array([0, 1024, 2304, 1024], pa.int64()),
        # InternVL runs a dummy tile for a text-only sample: a sequence without an image
        "vit_seq_lens": pa.array([[], [1024], [1024, 1024, 256], [1024]], pa.list_(pa.int32())),
        "llm_tokens": pa.array([40, 300, 800, 50], pa.int64()),
        "text_tokens": pa.array([40, 44, 32, 50], pa.int64()),
        "image_widths": pa.array([[], [640], [1200], None], pa.list_(pa.int32())),
        "image_heights": pa.array([[], [480], [300], None], pa.list_(pa.int32())),
    }
    return pa.table({**base, **columns})


def _write(tmp_path, table) -> str:
    path = tmp_path / "cost.parquet"
    pq.write_table(table, path)
    return str(path)


def test_a_consistent_hand_made_table_is_read(tmp_path):
    table = read_cost_table(_write(tmp_path, _table()))
    assert table.column("sample_id").to_pylist() == ["text", "one", "tiles", "dummy"]


@pytest.mark.parametrize(
    "columns, rule, sample",
    [
        (
            {"vit_tokens": pa.array([0, 1024, 1024, 1024], pa.int64())},
            "vit_tokens is not the sum of vit_seq_lens",
            "tiles",
        ),
        (
            {"vit_seq_lens": pa.array([[], [1024], [1024], [1024]], pa.list_(pa.int32()))},
            "vit_tokens is not the sum of vit_seq_lens",
            "tiles",
        ),
        (
            {"vit_tokens": pa.array([256, 1024, 2304, 1024], pa.int64())},
            "vit_tokens is not the sum of vit_seq_lens",
            "text",
        ),
        (
            {"image_widths": pa.array([[], [640, 640], [1200], None], pa.list_(pa.int32()))},
            r"image_widths does not hold one size per image \(num_images\)",
            "one",
        ),
        (
            {"image_heights": pa.array([[], [480], [], None], pa.list_(pa.int32()))},
            r"image_heights does not hold one size per image \(num_images\)",
            "tiles",
        ),
    ],
    ids=["vit-tokens-short", "seq-lens-short", "text-with-vit-tokens", "widths", "heights"],
)
def test_a_row_whose_columns_disagree_is_refused_naming_it(tmp_path, columns, rule, sample):
    path = _write(tmp_path, _table(**columns))
    with pytest.raises(ValueError, match=rf"cost.parquet: 1 row\(s\) where {rule}.*'{sample}'"):
        read_cost_table(path)


def test_balance_exits_2_naming_the_row(tmp_path, capsys):
    from equishard.cli import main

    path = _write(tmp_path, _table(vit_tokens=pa.array([0, 1024, 1024, 1024], pa.int64())))
    assert main(["balance", path, "-o", str(tmp_path / "plan"), "--dp", "2"]) == 2
    err = capsys.readouterr().err
    assert "vit_tokens is not the sum of vit_seq_lens" in err and "'tiles'" in err


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("chunks", [1, 3])
def test_sums_are_checked_a_slice_of_rows_at_a_time(monkeypatch, rows, chunks):
    """The sums are taken ``SUM_ROWS`` rows at a time (3 here): a table of fewer rows, exactly
    as many, one more and more than two slices, in one chunk or several (a slice crossing
    chunks, and chunks that are slices of a larger list array), with missing lists and counts,
    gives each row's verdict as a plain sum over Python lists does."""
    import itertools

    import numpy as np

    from equishard.contracts import cost_table as ct

    monkeypatch.setattr(ct, "SUM_ROWS", 3)
    rng = np.random.default_rng(rows * 10 + chunks)
    lists = [[int(v) for v in rng.integers(0, 5, rng.integers(0, 4))] for _ in range(rows)]
    tokens = [sum(x) + (i % 3 == 1) for i, x in enumerate(lists)]  # the middle of each three
    lists[rows // 2] = None  # a missing list: its sum is 0 here, as in the check
    tokens[-1] = None  # a missing count is never "not the sum"
    want = [t is not None and t != sum(x or []) for x, t in zip(lists, tokens, strict=True)]
    whole = pa.array([[9, 9], *lists, [9]], pa.list_(pa.int32())).slice(1, rows)  # a slice
    cuts = np.linspace(0, rows, chunks + 1).astype(int)
    seq = pa.chunked_array(
        [whole.slice(a, b - a) for a, b in itertools.pairwise(cuts)],
        pa.list_(pa.int32()),
    )
    got = ct._sums_differ(seq, pa.chunked_array([pa.array(tokens, pa.int64())]))
    assert got.tolist() == want
