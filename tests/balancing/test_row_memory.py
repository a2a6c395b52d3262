"""``balance --row-memory``: whether the plan's largest group, packed into one row, fits its
logits in the budget, and the LLM cap that makes it fit.

The bug it catches (issue 70): a user's HF loop ran out of memory with the docs' own settings,
a whole group of ~7k LLM tokens in one row times a 151,936-token vocabulary being ~4 GB of fp32
logits, and nothing said so or said which knob caps it. The anchor is the plan itself: the
largest row is recomputed from ``plan.parquet`` (each group's samples' ``llm_tokens`` summed),
and the suggested cap, given back to ``balance``, makes a plan whose largest row fits.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from balancing.row_memory import LOGIT_BYTES, MAX_VOCAB, RowMemory
from equishard.cli import main
from tests.shards.conftest import build_inputs

VOCAB = 151_936


@pytest.fixture(scope="module")
def cost(tmp_path_factory):
    _, cost, _ = build_inputs(tmp_path_factory.mktemp("row-memory"), samples=80)
    return cost


def _largest_row(plan_dir, cost) -> int:
    """The largest group's LLM tokens: its samples' ``llm_tokens`` (from the cost table)
    summed, not the plan's own group column."""
    table = pq.read_table(cost, columns=["sample_id", "llm_tokens"]).to_pydict()
    tokens = dict(zip(table["sample_id"], table["llm_tokens"], strict=True))
    plan = pq.read_table(plan_dir / "plan.parquet").to_pydict()
    rows: dict[int, int] = {}
    for gid, sid in zip(plan["group_id"], plan["sample_id"], strict=True):
        rows[gid] = rows.get(gid, 0) + tokens[sid]
    return max(rows.values())


def _balance(cost, out, *extra) -> int:
    return main(["balance", str(cost), "--dp", "2", "-o", str(out), "--json", *extra])


def test_a_plan_whose_largest_row_exceeds_the_budget_is_said_with_the_cap_that_fits(
    cost, tmp_path, capsys
):
    assert _balance(cost, tmp_path / "free") == 0
    largest = _largest_row(tmp_path / "free", cost)
    capsys.readouterr()
    need = largest * VOCAB * 4
    # at the budget: fits, nothing said; one byte below: said
    assert (
        _balance(cost, tmp_path / "at", "--row-memory", str(need), "--vocab-size", str(VOCAB)) == 0
    )
    out = capsys.readouterr()
    assert "warning" not in out.err and "warnings" not in json.loads(out.out)
    assert (
        _balance(
            cost, tmp_path / "below", "--row-memory", str(need - 1), "--vocab-size", str(VOCAB)
        )
        == 0
    )
    out = capsys.readouterr()
    assert f"the largest group holds {largest} LLM tokens" in out.err
    cap = (need - 1) // (VOCAB * 4)
    assert f"--llm-tokens-per-group {cap}" in out.err
    assert json.loads(out.out)["warnings"][0].startswith(f"the largest group holds {largest}")
    # the cap it gives, taken: the largest row now fits (--q-v / --q-t still work as aliases)
    args = ["--row-memory", str(need - 1), "--vocab-size", str(VOCAB)]
    assert _balance(cost, tmp_path / "capped", *args, "--q-v", "100000", "--q-t", str(cap)) == 0
    out = capsys.readouterr()
    assert _largest_row(tmp_path / "capped", cost) * VOCAB * 4 <= need - 1
    assert "warning" not in out.err
    # bf16 logits take half: the same budget holds twice the tokens
    assert RowMemory(row_memory=need - 1, vocab_size=VOCAB, logit_bytes=2).max_tokens == (
        (need - 1) // (VOCAB * 2)
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"row_memory": 0, "vocab_size": VOCAB}, "--row-memory"),
        ({"row_memory": 1 << 30}, "needs --vocab-size"),
        ({"row_memory": 1 << 30, "vocab_size": 0}, "--vocab-size"),
        ({"row_memory": 1 << 30, "vocab_size": MAX_VOCAB + 1}, "--vocab-size"),
        ({"row_memory": 1 << 30, "vocab_size": VOCAB, "logit_bytes": 3}, "--logit-bytes"),
        ({"row_memory": 1 << 30, "vocab_size": VOCAB, "logit_bytes": True}, "--logit-bytes"),
    ],
)
def test_a_budget_that_is_no_budget_is_refused_naming_the_option(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RowMemory(**kwargs)


def test_the_limits_are_taken():
    RowMemory(row_memory=1, vocab_size=1)
    RowMemory(row_memory=1 << 40, vocab_size=MAX_VOCAB, logit_bytes=LOGIT_BYTES[0])
    assert RowMemory().warning(10**9) is None  # no budget: nothing checked
