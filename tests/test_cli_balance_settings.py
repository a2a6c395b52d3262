"""``equishard balance`` builds the plan the Python API builds from the same settings: every
option reaches the configuration, none is dropped, swapped or replaced by its default.

The reference is the API itself called directly (``BalanceConfig`` + ``build_plan``), with
settings that all differ from the defaults, so a CLI option that is ignored or wired to the
wrong field gives another plan. Planted bugs this catches: the seed, the rounds, the slack or a
cap not passed on; the vision and LLM model dimensions swapped."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from balancing.cost_model import CostModel
from balancing.plan import BalanceConfig, build_plan
from dataprep import read_cost_table
from equishard.cli import main
from tests.shards.conftest import build_inputs

SETTINGS = {
    "dp": 4,
    "nodes": 2,
    "target_batch": 3.0,
    "seed": 11,
    "rounds": 6,
    "slack": 0.1,
    "dims": {"vit_hidden": 768, "vit_layers": 12, "llm_hidden": 2048, "llm_layers": 20},
}


@pytest.fixture(scope="module")
def cost_table(tmp_path_factory):
    _, cost, _ = build_inputs(tmp_path_factory.mktemp("balance-cli"), samples=80)
    return cost


def _cli_plan(cost, out, extra=()):
    s, d = SETTINGS, SETTINGS["dims"]
    args = ["balance", str(cost), "-o", str(out), "--dp", str(s["dp"]), "--nodes", str(s["nodes"])]
    args += ["--target-batch", str(s["target_batch"]), "--seed", str(s["seed"])]
    args += ["--rounds", str(s["rounds"]), "--slack", str(s["slack"]), *extra]
    args += ["--vit-hidden", str(d["vit_hidden"]), "--vit-layers", str(d["vit_layers"])]
    args += ["--llm-hidden", str(d["llm_hidden"]), "--llm-layers", str(d["llm_layers"]), "--json"]
    assert main(args) == 0
    plan = pq.read_table(out / "plan.parquet").to_pydict()
    return plan, json.loads((out / "report.json").read_text())


def _given() -> dict:
    """SETTINGS as BalanceConfig's keyword arguments."""
    s = SETTINGS
    given = {k: s[k] for k in ("dp", "nodes", "target_batch", "seed", "rounds", "slack")}
    return {**given, "cost_model": CostModel.from_dims(**s["dims"])}


def _api_plan(cost, **overrides):
    return build_plan(read_cost_table(cost), BalanceConfig(**{**_given(), **overrides}))


def _rows(plan: dict) -> list[tuple]:
    keys = sorted(plan)
    return sorted(zip(*(plan[k] for k in keys), strict=True))


@pytest.mark.parametrize("caps", [{}, {"q_v": 9000, "q_t": 2500}])
def test_cli_plan_equals_the_api_plan_with_the_same_settings(cost_table, tmp_path, caps, capsys):
    extra = [x for k, v in caps.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    plan, report = _cli_plan(cost_table, tmp_path / "plan", extra)
    capsys.readouterr()
    want = _api_plan(cost_table, **caps)
    assert _rows(plan) == _rows(want.plan.to_pydict())
    assert report["parameters"] == json.loads(json.dumps(want.report["parameters"]))


def test_every_setting_changes_the_plan(cost_table):
    """Each setting above moves the plan on this table, so the comparison sees a dropped one."""
    base = _rows(_api_plan(cost_table).plan.to_pydict())
    swapped = CostModel.from_dims(vit_hidden=2048, vit_layers=20, llm_hidden=768, llm_layers=12)
    for field, other in [("seed", 12), ("rounds", 3), ("slack", 0.3), ("cost_model", swapped)]:
        plan = _api_plan(cost_table, **{field: other})
        assert _rows(plan.plan.to_pydict()) != base, field
