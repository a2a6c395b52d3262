"""A night balances exactly as its parent was balanced, from what the parent's manifest
records, and refuses a record it cannot use, naming the field (rule 2: the generation is the
single source of truth; rule 1: the manifest is outside data).

Anchors: the parent's recorded parameters themselves (the night's plan must record the same);
each hostile record below crashed the night with KeyError/TypeError/AttributeError before."""

from __future__ import annotations

import json

import pytest

from shards.nightly.rebalance import run_rebalance
from shards.store.manifest import ManifestError
from shards.store.publish import read_current
from tests.shards.night_helpers import _night, first_night


def test_a_night_balances_with_the_parents_recorded_parameters(tmp_path):
    """The parent was balanced with explicit q_v/q_t, 3 ISF rounds, slack 0.2, seed 7 (bug: the
    night balanced its samples with the defaults: 10 rounds, slack 0.05, automatic q_v/q_t)."""
    root = first_night(tmp_path, rounds=3, slack=0.2, q_v=9000, q_t=3000, seed=7)
    parent = json.loads((root / read_current(root) / "manifest.json").read_text())
    run_rebalance(_night(root, 2))
    night = json.loads((root / read_current(root) / "manifest.json").read_text())
    assert night["parent"] == parent["generation"]
    want, got = parent["report"]["parameters"], night["report"]["parameters"]
    for key in ("dp", "nodes", "gpus_per_node", "target_batch", "seed", "cost_model"):
        assert got[key] == want[key], key
    for key in ("rounds", "slack", "auto", "q_v", "q_t", "qf_v", "qf_t"):
        assert got["isf"][key] == want["isf"][key], key


HOSTILE = {
    "report a list": (lambda m: m.update(report=[1]), "field 'report' is list"),
    "no parameters": (lambda m: m["report"].pop("parameters"), "no 'parameters'"),
    "dp as text": (lambda m: m["report"]["parameters"].update(dp="4"), r"\['dp'\]"),
    "seed a float": (lambda m: m["report"]["parameters"].update(seed=1.5), r"\['seed'\]"),
    "cost model a list": (
        lambda m: m["report"]["parameters"].update(cost_model=[]),
        "cost model is not valid",
    ),
    "cost model with another field": (
        lambda m: m["report"]["parameters"]["cost_model"]["llm"].update(delta=1),
        "cost model is not valid",
    ),
    "shard_size as text": (lambda m: m.update(shard_size="1GB"), "shard_size is '1GB'"),
    "nightly a list": (lambda m: m.update(nightly=[1]), "field 'nightly' is list"),
    "nightly counts as text": (
        lambda m: m.update(nightly={"key": "k", "counts": {"new": "3"}, "plan": {}}),
        "nightly.counts",
    ),
    "metrics not numbers": (
        lambda m: m["report"]["metrics"].update(balanced={"efficiency_vit": "0.9"}),
        "report.metrics.balanced",
    ),
    "last step short as text": (
        lambda m: m["report"]["last_step"].update(short="no"),
        "last_step.short",
    ),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_a_parent_record_a_night_cannot_use_is_refused_naming_it(root, case):
    edit, match = HOSTILE[case]
    before = read_current(root)
    path = root / before / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=match):
        run_rebalance(_night(root, 2))
    assert read_current(root) == before


LEFTOVER = {
    # a row's count edited, the table still valid: it would be balanced and written as measured
    "a count edited": lambda work: _edit_table(work / "new.parquet"),
    "the errors table gone": lambda work: (work / "new.errors.parquet").unlink(),
    "the record not JSON": lambda work: (work / "measured.json").write_text("{"),
    "no record (killed before it)": lambda work: (work / "measured.json").unlink(missing_ok=True),
}


def _edit_table(path):
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    col = t.column("llm_tokens")
    t = t.set_column(
        t.schema.get_field_index("llm_tokens"), "llm_tokens", pc.add(col, pa.scalar(7, col.type))
    )
    pq.write_table(t, path)


@pytest.mark.parametrize("damage", LEFTOVER, ids=list(LEFTOVER))
def test_a_resumed_night_measures_again_what_it_cannot_trust(root, night1, monkeypatch, damage):
    """A night killed after measuring its new samples leaves their tables in its work
    directory; the next run reused any ``new.parquet`` it found (bug: a table damaged or edited
    since was balanced and published as measured). Now it is reused only with the sha256
    recorded right after prep wrote it; anything else is measured again, and the night ends in
    the generation a night never interrupted makes."""
    import shutil

    import shards.nightly.rebalance as rb

    want = run_rebalance(_night(root, 2)).generation  # uninterrupted, then the same again
    shutil.rmtree(root.parent)
    shutil.copytree(night1.parent, root.parent, symlinks=True)

    def killed(*a, **k):
        raise SystemExit("killed after prep")

    real = rb.combine_tables
    monkeypatch.setattr(rb, "combine_tables", killed)
    with pytest.raises(SystemExit):
        run_rebalance(_night(root, 2))
    monkeypatch.setattr(rb, "combine_tables", real)
    (work,) = root.glob(".nightly-*")
    assert (work / "new.parquet").is_file()
    LEFTOVER[damage](work)
    assert run_rebalance(_night(root, 2)).generation == want
