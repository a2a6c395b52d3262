"""JSON nested 100,000 levels deep, in each JSON file equishard reads from outside: Python's
decoder raises ``RecursionError`` for it, which is not a ``ValueError``, so every reader that
caught only decoding errors crashed with a traceback (``equishard verify`` printed
``failed: RecursionError``; the loader raised it from ``open_generation``). Each is now that
file's error, named, or (for files equishard rewrites) ignored and written again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

DEEP = "[" * 100_000 + "]" * 100_000


def _gen(root: Path) -> Path:
    return root / (root / "CURRENT").read_text().strip()


def test_a_manifest(gen_copy):
    from shards.store.manifest import ManifestError, open_generation

    (_gen(gen_copy) / "manifest.json").write_text(DEEP)
    with pytest.raises(ManifestError, match=r"manifest\.json: invalid JSON"):
        open_generation(gen_copy)


def test_a_plan_report(gen_inputs, tmp_path):
    from shards.write.writer import WriteConfig, WriteError, write_generation

    _, cost, plan = gen_inputs
    mine = tmp_path / "plan"
    shutil.copytree(plan, mine)
    (mine / "report.json").write_text(DEEP)
    cfg = WriteConfig(plan_dir=str(mine), cost_table=str(cost), out=str(tmp_path / "g"))
    with pytest.raises(WriteError, match=r"report\.json: not a readable plan report"):
        write_generation(cfg)


def test_a_cost_tables_metadata(gen_inputs, tmp_path):
    from equishard.contracts.cost_table import METADATA_KEY, table_metadata

    _, cost, _ = gen_inputs
    t = pq.read_table(cost)
    meta = dict(pq.read_metadata(cost).metadata or {})
    bad = tmp_path / "c.parquet"
    pq.write_table(t.replace_schema_metadata({**meta, METADATA_KEY: DEEP}), bad)
    with pytest.raises(ValueError, match=r"c\.parquet: its equishard metadata is not JSON"):
        table_metadata(bad)


def test_a_deletion_list(tmp_path):
    from shards.nightly.rebalance import read_deletions

    (tmp_path / "d.json").write_text(DEEP)
    with pytest.raises(ValueError, match=r"d\.json: not a valid JSON list"):
        read_deletions(str(tmp_path / "d.json"))


def test_files_equishard_rewrites_are_ignored_and_written_again(tmp_path):
    """CURRENT's history, a night's summary and a killed write's sidecar: a damaged one is not
    what equishard wrote, so it is left out (history) or written again (summary, sidecar)."""
    from shards.nightly.rebalance import _record_night
    from shards.store.publish import note_current, read_history
    from shards.write.stream_resume import _sidecar

    (tmp_path / "CURRENT.history").write_text(DEEP + "\n")
    note_current(tmp_path, "gen-0123456789abcdef")
    assert read_history(tmp_path) == [("current", "gen-0123456789abcdef")]
    (tmp_path / "LAST_NIGHT.json").write_text(DEEP)
    _record_night(tmp_path, {"status": "unchanged"})
    assert (tmp_path / "LAST_NIGHT.json").read_text() == '{"status": "unchanged"}'
    (tmp_path / "s.json").write_text(DEEP)
    assert _sidecar(tmp_path / "s.json") is None
