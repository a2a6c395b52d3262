"""``--json`` on every command that makes or checks an artifact (demo, prep, import-lengths,
merge, write, verify, report, rebalance): one JSON line on stdout and nothing else, the same shape
everywhere (``command``, ``status``, ``counts``: ``in`` / ``out`` / ``rejected``), each count
checked against the artifact itself (the rows of the table, the manifest, the records)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from equishard.cli import main


def run_json(capsys, args: list[str], code: int = 0) -> dict:
    capsys.readouterr()
    assert main([*args, "--json"]) == code
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 1, f"--json printed more than one line: {out[:500]}"
    doc = json.loads(lines[0])
    assert set(doc) >= {"command", "status", "counts"}
    assert set(doc["counts"]) >= {"in", "out", "rejected"}
    assert all(
        isinstance(doc["counts"][k], int) and doc["counts"][k] >= 0
        for k in "in out rejected".split()
    )
    assert doc["command"] == args[0]
    return doc


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-json")
    demo = root / "demo"
    assert main(["demo", str(demo), "--samples", "30", "--seed", "2", "--images", "6"]) == 0
    return root, demo


def test_demo_json_counts_the_records_it_wrote(capsys, tmp_path):
    doc = run_json(capsys, ["demo", str(tmp_path / "d"), "--samples", "12", "--images", "4"])
    records = (tmp_path / "d" / "demo.jsonl").read_text().splitlines()
    assert doc["status"] == "ok"
    assert doc["counts"] == {"in": 12, "out": len(records), "rejected": 0}


def test_import_lengths_json_counts_the_rejected_entry(capsys, tmp_path):
    src = tmp_path / "lengths.json"
    entries = [{"vit_num": 2, "token_num": 900, "image_flags": 2}] * 4
    src.write_text(json.dumps([*entries, {"vit_num": -1, "token_num": 5, "image_flags": 0}]))
    out = tmp_path / "c.parquet"
    doc = run_json(capsys, ["import-lengths", str(src), "-o", str(out)])
    assert doc["counts"] == {"in": 5, "out": pq.read_table(out).num_rows, "rejected": 1}
    assert doc["counts"]["out"] == 4


def test_merge_write_verify_report_json(capsys, made, tmp_path):
    _, demo = made
    args = [str(demo / "demo.jsonl"), "--tokenizer", str(demo / "tokenizer.json")]
    parts = []
    for k in range(2):
        part = tmp_path / f"p{k}.parquet"
        doc = run_json(
            capsys, ["prep", *args, "--shard-index", str(k), "--num-shards", "2", "-o", str(part)]
        )
        kept = pq.read_table(part).num_rows
        assert (
            doc["counts"]["out"] == kept and doc["counts"]["in"] == kept + doc["counts"]["rejected"]
        )
        parts.append(str(part))
    cost = tmp_path / "cost.parquet"
    doc = run_json(capsys, ["merge", *parts, "-o", str(cost)])
    rows = pq.read_table(cost).num_rows
    assert doc["counts"] == {"in": 30, "out": rows, "rejected": 30 - rows}

    plan = tmp_path / "plan"
    doc = run_json(
        capsys, ["balance", str(cost), "--dp", "2", "--target-batch", "3", "-o", str(plan)]
    )
    assert doc["counts"]["in"] == doc["counts"]["out"] == rows and doc["counts"]["rejected"] == 0
    gen = tmp_path / "shards"
    doc = run_json(capsys, ["write", str(plan), "--cost-table", str(cost), "--out", str(gen)])
    planned = pq.read_table(plan / "plan.parquet").num_rows
    assert doc["status"] == "ok" and doc["counts"] == {"in": planned, "out": planned, "rejected": 0}
    assert (gen / doc["generation"] / "manifest.json").exists()

    doc = run_json(capsys, ["verify", str(gen)])
    assert doc["status"] == "ok" and doc["problems"] == []
    assert doc["counts"] == {"in": planned, "out": planned, "rejected": 0}

    doc = run_json(capsys, ["report", str(gen), "-o", str(tmp_path / "r.html")])
    assert doc["status"] == "ok" and doc["output"].endswith("r.html")
    assert doc["counts"]["in"] == planned and doc["bytes"] == (tmp_path / "r.html").stat().st_size

    # a shard whose bytes changed (same size): verify fails, and counts the samples it could
    # not vouch for
    shard = next(gen.rglob("*.tar"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    doc = run_json(capsys, ["verify", str(gen)], code=1)
    assert doc["status"] == "failed" and doc["problems"]
    assert doc["counts"]["rejected"] > 0
    assert doc["counts"]["out"] + doc["counts"]["rejected"] == doc["counts"]["in"]


def test_rebalance_json_has_the_same_front_and_counts_the_night(capsys, tmp_path):
    """A night (new samples, updates, deletions) in the common shape: ``in`` is the samples
    carried in plus the new entries read, ``out`` the new generation's samples (its manifest),
    ``rejected`` the new entries prep refused; the night's own counts follow."""
    from dataprep.demo import split_days
    from shards import open_generation

    raw = tmp_path / "raw"
    assert main(["demo", str(raw), "--samples", "30", "--seed", "4", "--images", "6"]) == 0
    split_days(raw, days=2, updates=3, deletions=2, seed=4)
    cost, plan, root = tmp_path / "cost.parquet", tmp_path / "plan", tmp_path / "shards"
    tok = ["--tokenizer", str(raw / "tokenizer.json"), "--image-root", str(raw)]
    assert main(["prep", str(raw / "day-1.jsonl"), *tok, "--no-progress", "-o", str(cost)]) == 0
    assert main(["balance", str(cost), "--dp", "2", "-o", str(plan)]) == 0
    assert main(["write", str(plan), "--cost-table", str(cost), "--out", str(root)]) == 0
    carried = open_generation(root).totals["samples"]
    night = ["rebalance", "--current", str(root), "--new", str(raw / "day-2.jsonl")]
    doc = run_json(capsys, [*night, "--delete", str(raw / "day-2.delete")])
    c = doc["counts"]
    assert doc["status"] == "published"
    read = len((raw / "day-2.jsonl").read_text().splitlines())
    assert c["in"] == carried + read and c["carried_in"] == carried and c["read"] == read
    assert c["out"] == open_generation(root).totals["samples"]
    assert c["out"] == carried + c["new"] - c["deleted"] and c["deleted"] == 2
    assert c["updated"] == 3 and c["rejected"] == 0
    # docs/reference/cli.md: what entered is written, refused, deleted or replaced
    gone = c["rejected"] + c["deleted"] + c["updated"] + c["unchanged_resubmitted"]
    assert c["in"] == c["out"] + gone
