"""Helpers for prep tests: run prep on tiny inputs and read both tables back."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pyarrow.parquet as pq

from dataprep import PrepConfig, errors_path, run_prep


def llava(sample_id, images=None, question="What is in the picture?", answer="A dog in a park."):
    rec = {"id": sample_id}
    if images is not None:
        rec["image"] = images
    rec["conversations"] = [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
    return rec


def write_jsonl(path: Path, records, raw_lines=()) -> Path:
    lines = [json.dumps(r) for r in records] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def run(tmp_path: Path, inputs, tokenizer: str, **kw):
    out = tmp_path / "out" / "cost.parquet"
    kw.setdefault("max_error_rate", 1.0)
    cfg = PrepConfig(
        inputs=tuple(str(i) for i in inputs), output=str(out), tokenizer=tokenizer, **kw
    )
    res = run_prep(cfg)
    table = pq.read_table(out)
    errors = pq.read_table(errors_path(out))
    # the errors table also holds one row per damaged byte range of a tar: not samples
    samples = errors.num_rows - res.damaged_ranges
    assert res.n_in == res.n_written + res.n_rejected == table.num_rows + samples
    return res, table.to_pylist(), errors.to_pylist()


def add_member(tf: tarfile.TarFile, name: str, data: bytes, **attrs) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in attrs.items():
        setattr(info, k, v)
    tf.addfile(info, io.BytesIO(data))


def write_test_generation(root: Path, cost: Path, dp: int = 1) -> Path:
    """A generation of ``cost`` (balanced for ``dp`` ranks on one node) written under
    ``root / "gen"``; its root, with CURRENT."""
    from balancing.plan import BalanceConfig, build_plan, write_plan
    from dataprep import read_cost_table
    from shards.write.writer import WriteConfig, write_generation

    plan = root / "plan"
    write_plan(build_plan(read_cost_table(cost), BalanceConfig(dp=dp, nodes=1, seed=0)), plan)
    gen = root / "gen"
    write_generation(WriteConfig(plan_dir=str(plan), cost_table=str(cost), out=str(gen)))
    return gen


def tree_digest(root: Path) -> str:
    """sha256 over every file under ``root``: its relative path and its bytes, in path order
    (two trees equal byte for byte have the same digest)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()
