"""A tiny real generation for training tests: demo -> prep (small InternVL tiles) -> plan -> write."""

from __future__ import annotations

from pathlib import Path

import pytest

from balancing.plan import BalanceConfig, build_plan, write_plan
from dataprep import PrepConfig, make_demo, read_cost_table, run_prep
from shards.write.writer import WriteConfig, write_generation

# 56-px tiles of 14-px patches: 16 patches and 4 LLM tokens per tile, so a CPU trains in seconds
POLICY = "internvl:max_tiles=4,tile_size=56"


def build_train_generation(root: Path, samples: int = 48, dp: int = 4, nodes: int = 2) -> Path:
    make_demo(root / "demo", samples=samples, seed=3, images=8)
    cost = root / "cost.parquet"
    run_prep(
        PrepConfig(
            inputs=(str(root / "demo" / "demo.jsonl"),),
            output=str(cost),
            tokenizer=str(root / "demo" / "tokenizer.json"),
            vision_policy=POLICY,
        )
    )
    plan = build_plan(
        read_cost_table(cost), BalanceConfig(dp=dp, nodes=nodes, seed=0, target_batch=3)
    )
    write_plan(plan, root / "plan")
    write_generation(
        WriteConfig(plan_dir=str(root / "plan"), cost_table=str(cost), out=str(root / "gen"))
    )
    return root / "gen"


@pytest.fixture(scope="session")
def train_generation(tmp_path_factory) -> Path:
    return build_train_generation(tmp_path_factory.mktemp("traingen"))
