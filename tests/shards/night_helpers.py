"""The nightly tests' shared set-up: a first night written by the full pipeline, and helpers
that name a day's inputs and build the rebalance command line."""

from __future__ import annotations

import sys
from pathlib import Path

from balancing.plan import BalanceConfig, build_plan, write_plan
from dataprep import PrepConfig, make_demo, read_cost_table, run_prep
from dataprep.demo import split_days
from shards.nightly.rebalance import RebalanceConfig
from shards.write.writer import WriteConfig, write_generation


def first_night(root: Path, tokenizer: str | None = None, **balance) -> Path:
    raw = root / "raw"
    make_demo(raw, samples=150, seed=4, images=40)
    split_days(raw, days=3, seed=4)
    cost = root / "cost.parquet"
    run_prep(
        PrepConfig(
            inputs=(str(raw / "day-1.jsonl"),),
            output=str(cost),
            tokenizer=tokenizer or str(raw / "tokenizer.json"),
            image_root=str(raw),
        )
    )
    write_plan(
        build_plan(
            read_cost_table(cost),
            BalanceConfig(**{"dp": 4, "nodes": 2, "target_batch": 3, **balance}),
        ),
        root / "plan",
    )
    write_generation(
        WriteConfig(
            plan_dir=str(root / "plan"),
            cost_table=str(cost),
            out=str(root / "shards"),
            shard_size=1 << 20,
        )
    )
    return root / "shards"


def _night(root: Path, k: int, **kw) -> RebalanceConfig:
    raw = root.parent / "raw"
    return RebalanceConfig(
        current=str(root),
        new=(str(raw / f"day-{k}.jsonl"),),
        delete=str(raw / f"day-{k}.delete"),
        **kw,
    )


def _rebalance_cmd(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "equishard", "rebalance", "--current", str(root), *args]
