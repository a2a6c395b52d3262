"""The README's "Use with your trainer" snippets, run as written on a tiny generation (only the
paths swapped), each checked against equishard's own loader or the shards themselves."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from equishard.cli import main
from shards import GroupDataset, RankInfo, open_generation
from tests.shards.conftest import build_inputs

README = Path(__file__).resolve().parents[1] / "README.md"


def snippet(name: str) -> str:
    text = README.read_text()
    m = re.search(rf"<!-- snippet: {name} -->\n```python\n(.*?)```", text, re.S)
    assert m, f"README has no snippet {name!r}"
    return m.group(1)


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("snippets")
    demo, cost, plan = build_inputs(root, samples=48)
    gen = root / "shards"
    args = ["write", str(plan), "--cost-table", str(cost), "--out", str(gen), "--energon"]
    assert main(args) == 0
    return {
        "build/shards": str(gen),
        "build/raw/tokenizer.json": str(demo / "tokenizer.json"),
        "build/tt-ckpt": str(root / "ckpt"),
        "build/hf-trainer": str(root / "hf-out"),
    }


def run_snippet(name: str, paths: dict[str, str]) -> list[str]:
    code = snippet(name)
    for old, new in paths.items():
        code = code.replace(f'"{old}"', repr(new))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def own_loader_steps(gen: str, n: int) -> list[list[str]]:
    ds = GroupDataset(gen, RankInfo(rank=0, world_size=1))
    steps = []
    for batch in ds:
        steps.append([s.meta["sample_id"] for s in batch["samples"]])
        if len(steps) == n:
            return steps
    return steps


def test_hf_trainer_snippet_trains(paths):
    pytest.importorskip("accelerate")
    lines = run_snippet("hf-trainer", paths)
    last = lines[-1].split()
    assert last[:3] == ["trained", "steps", "4"]
    assert 0 < float(last[-1]) < 20  # a finite cross-entropy over the vocabulary


def test_torchtitan_snippet_resumes_at_the_next_step(paths):
    first = [ln for ln in run_snippet("torchtitan", paths) if ln.startswith("step")]
    second = [ln for ln in run_snippet("torchtitan", paths) if ln.startswith("step")]
    got = [ast.literal_eval(ln[len("step ") : ln.rindex("]") + 1]) for ln in first + second]
    assert got == own_loader_steps(paths["build/shards"], 6)


def test_energon_snippet_yields_the_balanced_groups(paths):
    pytest.importorskip("megatron.energon")
    lines = run_snippet("energon", paths)
    got = [
        ast.literal_eval(ln[ln.index("[") : ln.rindex("]") + 1]) for ln in lines if ln[:1].isdigit()
    ]
    # reference: node 0 / rank 0's stream read with tarfile, grouped by the records' step
    m = open_generation(paths["build/shards"])
    stream = next(st for st in m.streams if (st.node, st.local_rank) == (0, 0))
    want: dict[int, list[str]] = {}
    for shard in stream.shards:
        with tarfile.open(m.path / shard.file) as tf:
            for member in tf.getmembers():
                if member.name.endswith(".json"):
                    rec = json.loads(tf.extractfile(member).read())
                    want.setdefault(rec["step"], []).append(rec["sample_id"])
    assert got == [want[s] for s in sorted(want)]
