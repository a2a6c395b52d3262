"""The cost-table contract (docs/concepts.md, Cost table): required columns are enough,
optional ones stay optional, and length files from OmniBal/InternVL import into a table
balance accepts."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from equishard.cli import main
from equishard.contracts.cost_table import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, read_cost_table
from tests.shards.conftest import build_inputs


def _foreign_table(n: int = 40) -> pa.Table:
    """Lengths as another tool writes them: required columns only, its own integer widths."""
    tiles = [1 + (i * 7) % 5 for i in range(n)]
    return pa.table(
        {
            "sample_id": [f"s{i}" for i in range(n)],
            "source": ["theirs"] * n,
            "num_images": pa.array([1] * n, pa.int64()),
            "vit_tokens": pa.array([t * 1024 for t in tiles], pa.int64()),
            "vit_seq_lens": pa.array([[1024] * t for t in tiles], pa.list_(pa.int64())),
            "llm_tokens": pa.array([t * 256 + 30 + i for i, t in enumerate(tiles)], pa.int32()),
            "text_tokens": pa.array([30 + i for i in range(n)], pa.int32()),
        }
    )


def test_balance_reads_the_required_columns_alone_in_their_types(tmp_path):
    """What ``balance`` reads (``required_only``): the required columns of the full read, cast
    alike; an extra column of the other tool's is left out, a missing required one refused."""
    path = tmp_path / "theirs.parquet"
    theirs = _foreign_table().append_column("their_score", pa.array([0.5] * 40))
    pq.write_table(theirs, path)
    lean = read_cost_table(path, required_only=True)
    assert lean.column_names == list(REQUIRED_COLUMNS)
    assert lean.equals(read_cost_table(path).select(list(REQUIRED_COLUMNS)))
    pq.write_table(theirs.drop_columns(["text_tokens"]), path)
    with pytest.raises(ValueError, match=r"lacks required column\(s\) \['text_tokens'\]"):
        read_cost_table(path, required_only=True)


def test_required_columns_alone_balance(tmp_path, capsys):
    path = tmp_path / "theirs.parquet"
    pq.write_table(_foreign_table(), path)
    table = read_cost_table(path)
    assert set(OPTIONAL_COLUMNS) <= set(table.column_names)
    assert table.column("modality").to_pylist() == ["image"] * 40
    assert table.column("num_images").type == pa.int32()
    assert main(["balance", str(path), "--dp", "4", "-o", str(tmp_path / "plan")]) == 0
    plan = pq.read_table(tmp_path / "plan" / "plan.parquet")
    assert sorted(plan.column("sample_id").to_pylist()) == sorted(f"s{i}" for i in range(40))
    # write needs to know where each sample is: a clear refusal, not a KeyError
    code = main(
        [
            "write",
            str(tmp_path / "plan"),
            "--cost-table",
            str(path),
            "--out",
            str(tmp_path / "gen"),
        ]
    )
    err = capsys.readouterr().err
    assert code != 0 and "no location" in err and "import-lengths" in err
    assert not (tmp_path / "gen" / "CURRENT").exists()


def test_missing_required_column_is_named(tmp_path, capsys):
    path = tmp_path / "theirs.parquet"
    pq.write_table(_foreign_table().drop_columns(["vit_seq_lens"]), path)
    assert main(["balance", str(path), "--dp", "4", "-o", str(tmp_path / "plan")]) == 2
    err = capsys.readouterr().err
    assert "['vit_seq_lens']" in err and str(path) in err


def test_prep_table_without_optional_columns_writes_verifies_and_reports(tmp_path):
    """A prep table stripped to the required columns plus ``location``: every stage downstream
    (balance, write with its cost checks, verify, report) accepts it."""
    _, cost, _ = build_inputs(tmp_path, samples=40)
    full = pq.read_table(cost)
    keep = [*REQUIRED_COLUMNS, "location"]
    slim = tmp_path / "slim.parquet"
    pq.write_table(full.select(keep), slim)  # no equishard metadata either
    assert main(["balance", str(slim), "--dp", "4", "--nodes", "2", "-o", str(tmp_path / "p")]) == 0
    gen = tmp_path / "gen"
    args = ["write", str(tmp_path / "p"), "--cost-table", str(slim), "--out", str(gen)]
    assert main(args) == 0
    assert main(["verify", str(gen)]) == 0
    assert main(["report", str(gen), "-o", str(tmp_path / "r.html")]) == 0
    manifest = json.loads(next(gen.glob("gen-*/manifest.json")).read_text())
    assert manifest["totals"]["samples"] == full.num_rows


def test_import_lengths_hand_worked(tmp_path):
    """Each field from the format's definition, worked by hand for 448 px tiles at patch 14
    (1024 patches) and 0.5 pixel shuffle (256 tokens)."""
    src = tmp_path / "mine.json"
    entries = [
        {"vit_num": 5, "token_num": 1341, "image_flags": 5},  # 4 tiles + thumbnail
        {"vit_num": 1, "token_num": 100, "image_flags": 0},  # text-only, one dummy tile
        {"vit_num": 2, "token_num": 300},  # no image_flags
        {"vit_num": 1, "token_num": 200, "image_flags": 2},  # more real tiles than tiles
        {"vit_num": -1, "token_num": 10, "image_flags": 0},
        {"vit_num": 1, "token_num": 100, "image_flags": 1},  # fewer tokens than one tile
        "not a sample",
    ]
    src.write_text(json.dumps(entries))
    out = tmp_path / "cost.parquet"
    assert main(["import-lengths", str(src), "-o", str(out)]) == 0
    t = read_cost_table(out).to_pylist()
    assert [r["sample_id"] for r in t] == ["mine:0", "mine:1"]
    a, b = t
    assert (a["vit_tokens"], a["vit_seq_lens"], a["llm_tokens"], a["text_tokens"]) == (
        5120,
        [1024] * 5,
        1341,
        1341 - 5 * 256,
    )
    assert (a["num_images"], a["modality"]) == (1, "image")
    assert (b["vit_tokens"], b["vit_seq_lens"], b["text_tokens"], b["llm_tokens"]) == (
        1024,
        [1024],
        100,
        100,
    )
    assert (b["num_images"], b["modality"]) == (0, "text")
    errors = pq.read_table(tmp_path / "cost.errors.parquet").to_pylist()
    assert [e["sample_id"] for e in errors] == [f"mine:{i}" for i in (2, 3, 4, 5, 6)]
    details = " | ".join(e["detail"] for e in errors)
    for why in ("lacks ['image_flags']", "exceeds vit_num", "integer >= 0", "--tokens-per-tile"):
        assert why in details
    # other tile sizes: InternVL at 336 px tiles would be 576 patches and 144 tokens
    out2 = tmp_path / "c2.parquet"
    args = ["import-lengths", str(src), "-o", str(out2), "--patches-per-tile", "576"]
    assert main([*args, "--tokens-per-tile", "144"]) == 0
    a2 = read_cost_table(out2).to_pylist()[0]
    assert (a2["vit_tokens"], a2["text_tokens"]) == (5 * 576, 1341 - 5 * 144)


def test_import_real_internvl_lengths_then_balance(tmp_path):
    """The real InternVL statistics shipped with the benchmarks (30,730 samples)."""
    from bench._internvl import DATA, FILES, read_entries

    files = []
    for name in FILES:  # import-lengths reads plain JSON
        files.append(tmp_path / name.removesuffix(".gz"))
        files[-1].write_text(json.dumps(read_entries(DATA / name)))
    out = tmp_path / "cost.parquet"
    assert main(["import-lengths", *map(str, files), "-o", str(out)]) == 0
    raw = [e for f in files for e in json.loads(f.read_text())]
    assert len(raw) == 12_413 + 18_317
    t = read_cost_table(out)
    assert t.num_rows == len(raw)
    assert pa.compute.sum(t.column("llm_tokens")).as_py() == sum(e["token_num"] for e in raw)
    assert pa.compute.sum(t.column("vit_tokens")).as_py() == 1024 * sum(e["vit_num"] for e in raw)
    assert main(["balance", str(out), "--dp", "8", "-o", str(tmp_path / "plan")]) == 0
    report = json.loads((tmp_path / "plan" / "report.json").read_text())
    assert report["counts"]["out"] == len(raw)
