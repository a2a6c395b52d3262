"""Nightly rebalancing under the red team's cases: a kill right after CURRENT moves, nights with
nothing new, a malformed deletion list, two runs at once, and retention after a rollback."""

from __future__ import annotations

import fcntl
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shards import open_generation, verify_generation
from shards.nightly.rebalance import RebalanceConfig, run_rebalance
from shards.store.publish import read_current, set_current
from tests.shards.night_helpers import _night, _rebalance_cmd


def _with_bad_lines(root: Path, k: int, bad: int = 3) -> Path:
    raw = root.parent / "raw"
    day = raw / f"day-{k}-bad.jsonl"
    day.write_text((raw / f"day-{k}.jsonl").read_text() + "{broken\n" * bad)
    return day


def test_killed_right_after_current_moves_is_finished_by_the_next_run(root):
    day = _with_bad_lines(root, 2)
    delete = root.parent / "raw" / "day-2.delete"
    script = textwrap.dedent(
        f"""
        import os, signal
        import shards.write.writer as w
        from shards.nightly.rebalance import RebalanceConfig, run_rebalance
        moved = w.set_current
        def set_current_then_die(root, gen):
            moved(root, gen)
            os.kill(os.getpid(), signal.SIGKILL)  # the exact point: CURRENT has just moved
        w.set_current = set_current_then_die
        run_rebalance(RebalanceConfig(current={str(root)!r}, new=({str(day)!r},),
                                      delete={str(delete)!r}, max_error_rate=1.0))
        """
    )
    g0 = read_current(root)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert p.returncode == -9, p.stderr
    gen = read_current(root)
    assert gen != g0  # the publish happened; the post-publish steps did not
    assert not (root / "errors" / f"{gen}.errors.parquet").exists()
    again = run_rebalance(
        RebalanceConfig(current=str(root), new=(str(day),), delete=str(delete), max_error_rate=1.0)
    )
    assert again.status == "unchanged" and again.generation == gen
    errors = pq.read_table(root / "errors" / f"{gen}.errors.parquet").to_pylist()
    assert len(errors) == 3 and {e["reason"] for e in errors} == {"malformed_json"}
    last = json.loads((root / "LAST_NIGHT.json").read_text())
    assert last["generation"] == gen and last["counts"]["rejected"] == 3
    assert not list(root.glob(".nightly-*"))
    assert verify_generation(root).ok


def test_deletion_only_night_publishes(root):
    raw = root.parent / "raw"
    gone = (raw / "day-2.delete").read_text().split()
    before = open_generation(root).totals["samples"]
    delete_only = raw / "only.delete"
    ids = [s for s in (raw / "day-1.jsonl").read_text().splitlines()][:4]
    delete_only.write_text("\n".join(json.loads(x)["id"] for x in ids) + "\n")
    r = run_rebalance(RebalanceConfig(current=str(root), delete=str(delete_only)))
    assert r.status == "published", r
    assert r.counts["deleted"] == 4 and r.counts["out"] == before - 4
    assert open_generation(root).totals["samples"] == before - 4
    assert verify_generation(root).ok
    assert gone  # the day files are untouched


def test_empty_daily_file_is_unchanged(root):
    empty = root.parent / "raw" / "empty.jsonl"
    empty.write_text("")
    g0 = read_current(root)
    r = run_rebalance(RebalanceConfig(current=str(root), new=(str(empty),)))
    assert r.status == "unchanged" and read_current(root) == g0
    assert not list(root.glob(".nightly-*"))


def test_all_new_records_rejected_is_unchanged_and_on_record(root):
    bad = root.parent / "raw" / "bad.jsonl"
    bad.write_text("{broken\n" * 5)
    g0 = read_current(root)
    r = run_rebalance(RebalanceConfig(current=str(root), new=(str(bad),), max_error_rate=1.0))
    assert r.status == "unchanged" and read_current(root) == g0
    assert r.counts["rejected"] == 5
    last = json.loads((root / "LAST_NIGHT.json").read_text())
    assert last["status"] == "unchanged"
    errors = pq.read_table(root / last["errors"]).to_pylist()
    assert len(errors) == 5 and all(e["line"] for e in errors)


def test_malformed_deletion_list_is_a_usage_error(root, tmp_path):
    for text in ('["a", 3]', "[not json", '{"ids": ["a"]}'):
        bad = tmp_path / "bad.delete"
        bad.write_text(text)
        r = subprocess.run(
            _rebalance_cmd(root, "--delete", str(bad)), capture_output=True, text=True
        )
        assert r.returncode == 2, (text, r.stderr)
        assert "bad.delete" in r.stderr and "Traceback" not in r.stderr
    assert not list(root.glob(".nightly-*"))


def test_second_rebalance_while_one_runs_exits_zero_and_leaves_nothing(root):
    raw = root.parent / "raw"
    with open(root / ".nightly.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a rebalance of this root is running
        r = subprocess.run(
            _rebalance_cmd(root, "--new", str(raw / "day-2.jsonl")), capture_output=True, text=True
        )
    assert r.returncode == 0, r.stderr
    assert "in progress" in r.stderr
    assert not list(root.glob(".nightly-*")) and not list(root.glob(".staging-*"))


def test_keep_after_a_rollback_never_deletes_newer_generations(root):
    g0 = read_current(root)
    g2 = run_rebalance(_night(root, 2)).generation
    g3 = run_rebalance(_night(root, 3)).generation
    set_current(root, g0)  # the operator rolls back
    r = run_rebalance(_night(root, 3, keep=2))
    assert r.status == "published" and r.generation not in (g2, g3)
    # g2 and g3 were published after g0 (the oldest kept on the new chain): both stay
    assert (root / g2).exists() and (root / g3).exists() and (root / g0).exists()
    assert r.removed == []


def test_generation_measured_before_displayed_sizes_is_not_extended(tmp_path, monkeypatch):
    """A generation whose samples an older equishard measured (images as stored, not turned by
    their EXIF orientation): its sideways photos may carry wrong costs, and a rebalance would
    carry them on; it stops, names the generation and says how to measure it again, and
    CURRENT stays."""
    import pytest

    from shards.store.manifest import ManifestError
    from tests.shards.night_helpers import first_night

    with monkeypatch.context() as m:  # prep and write as before (both run in this process)
        m.setattr("dataprep.image_header.displayed_orientation", lambda *a: 1)
        m.setattr("dataprep.prep.IMAGE_SIZES", None)
        root = first_night(tmp_path / "night")
    cur = read_current(root)
    with pytest.raises(ManifestError, match=r"counted images as stored.*--cache") as e:
        run_rebalance(_night(root, 2))
    assert cur in str(e.value)
    assert read_current(root) == cur


def test_keep_counts_nights_not_manifest_times(root):
    """Retention after a rollback when the manifests' times lie (copied, restored or fetched
    generations): what was CURRENT within the last ``--keep`` nights stays (bug: g3, CURRENT
    minutes before the rollback, was deleted because its manifest looked old)."""
    import os

    g0 = read_current(root)
    g2 = run_rebalance(_night(root, 2)).generation
    g3 = run_rebalance(_night(root, 3)).generation
    for g in (g2, g3):  # a restore from backup set every time to a year ago
        old = (root / g0 / "manifest.json").stat().st_mtime - 365 * 86400
        os.utime(root / g / "manifest.json", (old, old))
    set_current(root, g0)  # the operator rolls back
    r = run_rebalance(_night(root, 3, keep=2))
    assert r.status == "published"
    assert (root / g3).exists() and (root / g0).exists(), r.removed
    assert g3 not in r.removed


def _images_of(jsonl: Path) -> dict[str, list[str]]:
    out = {}
    for line in jsonl.read_text().splitlines():
        rec = json.loads(line)
        imgs = rec.get("image") or rec.get("images") or []
        out[rec["id"]] = [imgs] if isinstance(imgs, str) else list(imgs)
    return out


def test_new_samples_take_their_images_from_the_night_image_root(tmp_path):
    """``rebalance --image-root NEW``: prep measures the night's samples under NEW, and write
    must read their bytes there too. The parent's root holds files of the same names and sizes
    with other bytes: every published image of a new sample is NEW's file (bug: write resolved
    them against the parent's root and published the wrong images)."""
    import shutil

    from tests.shards.night_helpers import first_night

    root = first_night(tmp_path / "n")  # its own: the parent's image root is altered below
    raw = root.parent / "raw"
    new_root = tmp_path / "new-root"
    shutil.copytree(raw / "images", new_root / "images")
    wanted = _images_of(raw / "day-2.jsonl")
    names = {n for imgs in wanted.values() for n in imgs}
    assert names
    for n in names:  # the parent's copies: same name and size, other bytes
        data = bytearray((raw / n).read_bytes())
        mid = len(data) // 2
        data[mid : mid + 16] = bytes(b ^ 0x55 for b in data[mid : mid + 16])
        (raw / n).write_bytes(bytes(data))
    res = run_rebalance(_night(root, 2, image_root=str(new_root)))
    assert res.status == "published"
    from shards.read.dataset import GroupDataset, RankInfo

    m = open_generation(root)
    seen = 0
    for rank in range(m.dp):
        for batch in GroupDataset(root, RankInfo(rank=rank, world_size=m.dp), shuffle=False):
            for s in batch["samples"]:
                sid = s.meta["sample_id"]
                if wanted.get(sid):
                    got = s.images
                    assert got == [(new_root / n).read_bytes() for n in wanted[sid]], sid
                    seen += 1
    assert seen > 0


def test_a_night_measures_its_inputs_with_the_read_options_prep_recorded(root, tmp_path):
    """The first night's prep recorded its read options (``--image-root`` the raw folder); a
    night whose new input lies elsewhere (an incoming folder) and that names no image root of
    its own must resolve the new samples' images under the recorded root, as the first prep
    did: every new sample published, its images the raw folder's files (bug: the night's prep
    ran without the recorded options, resolved the images beside the input and rejected
    them all)."""
    from shards.read.dataset import GroupDataset, RankInfo

    raw = root.parent / "raw"
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    (incoming / "day-2.jsonl").write_text((raw / "day-2.jsonl").read_text())
    wanted = _images_of(raw / "day-2.jsonl")
    res = run_rebalance(RebalanceConfig(current=str(root), new=(str(incoming / "day-2.jsonl"),)))
    assert res.status == "published" and res.counts["rejected"] == 0, res.counts
    m = open_generation(root)
    seen = set()
    for rank in range(m.dp):
        for batch in GroupDataset(root, RankInfo(rank=rank, world_size=m.dp), shuffle=False):
            for s in batch["samples"]:
                sid = s.meta["sample_id"]
                if sid in wanted:
                    assert s.images == [(raw / n).read_bytes() for n in wanted[sid]], sid
                    seen.add(sid)
    assert seen == set(wanted)


def test_files_replaced_by_fifos_never_hang_a_reader_or_a_night(root, tmp_path):
    """Issue #37, unbounded waits: CURRENT, a manifest, the CURRENT history or LAST_NIGHT.json
    replaced by a FIFO (whose read would block forever) is refused by name, or rewritten, at
    once; every command finishes under its timeout."""
    import os

    from shards.store.manifest import ManifestError, load_manifest

    os.mkfifo(root / "CURRENT.history.new")
    os.replace(root / "CURRENT.history.new", root / "CURRENT.history")
    (root / "LAST_NIGHT.json").unlink(missing_ok=True)
    os.mkfifo(root / "LAST_NIGHT.json")
    r = subprocess.run(
        _rebalance_cmd(root, "--new", str(root.parent / "raw" / "day-2.jsonl"), "--json"),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "published", r.stderr
    assert (root / "LAST_NIGHT.json").is_file() and (root / "CURRENT.history").is_file()
    gen = read_current(root)
    (root / gen / "manifest.json").rename(tmp_path / "manifest.json")
    os.mkfifo(root / gen / "manifest.json")
    try:
        load_manifest(root / gen)
    except ManifestError as exc:
        assert "not a regular file" in str(exc)
    else:
        raise AssertionError("a FIFO manifest was read")
    (root / "CURRENT").unlink()
    os.mkfifo(root / "CURRENT")
    v = subprocess.run([sys.executable, "-m", "equishard", "verify", str(root)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert v.returncode != 0 and "not a regular file" in v.stdout + v.stderr


def _edit_fingerprint(path: Path) -> None:
    """The carried cost table rewritten as a valid table with one fingerprint changed."""
    import pyarrow as pa

    t = pq.read_table(path)
    fp = t.column("fingerprint").to_pylist()
    fp[0] = "0" * len(fp[0] or "x")
    i = t.schema.get_field_index("fingerprint")
    pq.write_table(t.set_column(i, "fingerprint", pa.array(fp, t.schema.field(i).type)), path)


def test_a_night_refuses_a_parent_whose_carried_tables_changed(root):
    """The parent's cost table and plan tell a night which samples are unchanged (their
    fingerprints) and where its groups lie; they are checked against the sha256 the parent's
    manifest records before use (bug: an edited copy was believed, and a sample marked
    unchanged there was copied from the parent's shards although its raw data had changed)."""
    from shards.store.manifest import ManifestError

    cur = read_current(root)
    for name in ("cost.parquet", "plan.parquet"):
        path = root / cur / name
        keep = path.read_bytes()
        if name == "cost.parquet":
            _edit_fingerprint(path)
        else:
            path.write_bytes(keep[:-1] + bytes([keep[-1] ^ 1]))
        with pytest.raises(ManifestError, match=re.escape(name) + " changed after it was written"):
            run_rebalance(_night(root, 2))
        assert read_current(root) == cur
        path.write_bytes(keep)
    assert run_rebalance(_night(root, 2)).status == "published"


def test_write_reusing_a_parent_checks_its_carried_tables(root):
    """The same check where write reads the parent's tables to find unchanged samples
    (``reuse_index``), whoever calls it."""
    import pyarrow as pa

    from dataprep import read_cost_table
    from shards.store.manifest import ManifestError
    from shards.write.parent import reuse_index

    gen = root / read_current(root)
    cost = read_cost_table(gen / "cost.parquet")
    step = pa.array([0] * cost.num_rows, pa.int64())
    groups, unchanged = reuse_index(str(gen), step, cost)
    assert groups and unchanged.num_rows == cost.num_rows  # the reference: all unchanged
    _edit_fingerprint(gen / "cost.parquet")
    with pytest.raises(ManifestError, match=r"cost\.parquet changed after it was written"):
        reuse_index(str(gen), step, cost)


def test_a_night_measures_new_samples_with_the_parents_estimate(tmp_path):
    """A parent prepped with an estimate (``--tokenizer estimate:chars_per_token=3``, no
    tokenizer file): the night measures its new samples the same way and publishes (bug: it
    looked up the recorded tokenizer's path, and a KeyError stopped every night)."""
    from tests.shards.night_helpers import first_night

    root = first_night(tmp_path / "n", tokenizer="estimate:chars_per_token=3")
    r = run_rebalance(_night(root, 2))
    assert r.status == "published"
    m = open_generation(root)
    assert m.raw["prep"]["tokenizer"] == {"mode": "estimate", "chars_per_token": 3.0}
    new = pq.read_table(root / m.generation / "cost.parquet")
    raw = (tmp_path / "n" / "raw" / "day-2.jsonl").read_text().splitlines()
    day2 = {json.loads(line)["id"] for line in raw}
    assert day2 & set(new.column("sample_id").to_pylist())


def test_a_night_given_another_tokenizer_is_refused_naming_it(root, tmp_path):
    """``--tokenizer`` names where the parent's tokenizer is now; a file with other bytes would
    count the new samples otherwise than the parent's: refused before anything is measured."""
    from shards.read.prep_settings import SettingsMismatch

    other = tmp_path / "other-tokenizer.json"
    tok = json.loads((root.parent / "raw" / "tokenizer.json").read_text())
    tok.setdefault("added_tokens", []).append(
        {"id": 99_999, "content": "<extra>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
    )  # fmt: skip
    other.write_text(json.dumps(tok))
    cur = read_current(root)
    with pytest.raises(SettingsMismatch, match=r"other-tokenizer\.json"):
        run_rebalance(_night(root, 2, tokenizer=str(other)))
    assert read_current(root) == cur


def test_history_lines_not_written_by_equishard_are_left_out(tmp_path):
    """read_history's contract: only lines as note_current writes them (an event string and a
    generation name inside the root); a damaged or hand-edited line is left out, never a path."""
    from shards.store.publish import note_current, read_history

    (tmp_path / "CURRENT.history").write_text(
        "\n".join(
            [
                json.dumps({"event": "current", "generation": "../../elsewhere"}),
                json.dumps({"event": 5, "generation": "gen-0123456789abcdef"}),
                json.dumps(["current", "gen-0123456789abcdef"]),
                "not json",
                json.dumps({"event": "night", "generation": "/abs"}),
            ]
        )
        + "\n"
    )
    note_current(tmp_path, "gen-0123456789abcdef", "night")
    assert read_history(tmp_path) == [("night", "gen-0123456789abcdef")]
