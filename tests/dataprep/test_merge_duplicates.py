"""``merge`` of shard parts equals one prep run over the whole input, also when a sample id is
used twice and its copies land in different parts: the first one in input order is kept (a
single run's rule), every later one is an errors row ``duplicate_id``, and nothing is lost.

The reference is the single run itself. Planted bugs this catches: duplicates kept, the last
copy kept instead of the first, a dropped copy missing from the errors table."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from dataprep import make_demo
from equishard.cli import main


def test_merged_parts_keep_the_first_copy_as_one_run_does(tmp_path):
    demo = tmp_path / "demo"
    make_demo(demo, samples=30, seed=4, images=6)
    lines = (demo / "demo.jsonl").read_text().splitlines()
    # copies of samples 2 and 5 with other text, late in the file (another part than the first)
    for i in (2, 5):
        rec = json.loads(lines[i])
        rec["conversations"][-1]["value"] = "a later copy with a different answer " * (i + 1)
        lines.append(json.dumps(rec))
    (demo / "dup.jsonl").write_text("\n".join(lines) + "\n")
    args = [str(demo / "dup.jsonl"), "--tokenizer", str(demo / "tokenizer.json"), "--no-progress"]
    args += ["--max-error-rate", "0.2"]  # the two copies are rejected
    assert main(["prep", *args, "-o", str(tmp_path / "one.parquet")]) == 0
    parts = []
    for k in range(3):
        parts.append(str(tmp_path / f"p{k}.parquet"))
        shard = ["--shard-index", str(k), "--num-shards", "3", "-o", parts[-1]]
        assert main(["prep", *args, *shard]) == 0
        assert pq.read_table(parts[-1]).num_rows > 0
    assert main(["merge", *reversed(parts), "-o", str(tmp_path / "merged.parquet")]) == 0
    one = pq.read_table(tmp_path / "one.parquet")
    merged = pq.read_table(tmp_path / "merged.parquet")
    assert merged.equals(one)
    ids = one.column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)) == 30
    first = [json.loads(lines[i])["id"] for i in (2, 5)]
    # the first copies' costs: the input without the later copies, prepped on its own
    plain = [str(demo / "demo.jsonl"), *args[1:], "-o", str(tmp_path / "plain.parquet")]
    assert main(["prep", *plain]) == 0
    cost = ("llm_tokens", "text_tokens", "vit_tokens")

    def costs(t):
        return {r["sample_id"]: tuple(r[k] for k in cost) for r in t.to_pylist()}

    assert costs(one) == costs(pq.read_table(tmp_path / "plain.parquet"))
    for path in ("one.errors.parquet", "merged.errors.parquet"):
        errors = pq.read_table(tmp_path / path).to_pylist()
        assert sorted(e["sample_id"] for e in errors if e["reason"] == "duplicate_id") == sorted(
            first
        )
