"""A small real generation (demo -> prep -> balance -> write) shared by the shard tests."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from balancing.plan import BalanceConfig, build_plan, write_plan
from dataprep import PrepConfig, make_demo, read_cost_table, run_prep
from shards.write.writer import WriteConfig, write_generation


def build_inputs(
    root: Path,
    samples: int = 90,
    seed: int = 5,
    dp: int = 4,
    nodes: int = 2,
    plan_seed: int = 0,
    vision_policy: str = "internvl",
):
    demo = root / "demo"
    if not demo.exists():
        make_demo(demo, samples=samples, seed=seed, images=12)
    cost = root / "cost.parquet"
    if not cost.exists():
        run_prep(
            PrepConfig(
                inputs=(str(demo / "demo.jsonl"),),
                output=str(cost),
                tokenizer=str(demo / "tokenizer.json"),
                vision_policy=vision_policy,
            )
        )
    plan_dir = root / f"plan-{plan_seed}"
    if not plan_dir.exists():
        write_plan(
            build_plan(
                read_cost_table(cost),
                BalanceConfig(dp=dp, nodes=nodes, seed=plan_seed, target_batch=3),
            ),
            plan_dir,
        )
    return demo, cost, plan_dir


@pytest.fixture(scope="session")
def gen_inputs(tmp_path_factory) -> tuple[Path, Path, Path]:
    return build_inputs(tmp_path_factory.mktemp("geninputs"))


@pytest.fixture(scope="session")
def generation(gen_inputs, tmp_path_factory) -> Path:
    """A published generation root (with several shards per stream)."""
    _, cost, plan_dir = gen_inputs
    root = tmp_path_factory.mktemp("gen")
    write_generation(
        WriteConfig(plan_dir=str(plan_dir), cost_table=str(cost), out=str(root), shard_size=200_000)
    )
    return root


@pytest.fixture
def gen_copy(generation, tmp_path) -> Path:
    """A private copy of the generation root that a test may damage."""
    dst = tmp_path / "gen"
    shutil.copytree(generation, dst)
    return dst


@pytest.fixture(scope="module")
def night1(tmp_path_factory) -> Path:
    """A generation root written from day 1 of a three-day demo set (the nightly tests)."""
    from tests.shards.night_helpers import first_night

    return first_night(tmp_path_factory.mktemp("nightly"))


@pytest.fixture
def root(night1, tmp_path) -> Path:
    """A private copy (generation root and raw data side by side, as the paths expect)."""
    dst = tmp_path / "n"
    shutil.copytree(night1.parent, dst, symlinks=True)
    return dst / "shards"


# a real S3 server (moto): the session fixture ``s3`` is in tests/conftest.py (one server for
# every test that needs one: moto keeps its buckets in the process)
@pytest.fixture
def bucket(s3, request):
    """A fresh prefix of the test bucket for one test."""
    return f"s3://bkt/{re.sub(r'[^A-Za-z0-9_.-]', '_', request.node.name)}"


def s3_env(s3) -> dict:
    """The environment a CLI process needs to reach the server (credentials, endpoint)."""
    return {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3["endpoint"],
    }


def s3fs_of(s3):
    import s3fs

    return s3fs.S3FileSystem(**s3["opts"], use_listings_cache=False)
