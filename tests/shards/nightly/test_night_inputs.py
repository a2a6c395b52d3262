"""What a night combines before it plans (``shards.nightly.night_inputs``), against a model of the rule
written with Python sets: the parent's samples, the night's new table (an id the parent has is
an update when its fingerprint differs, an unchanged resubmission when not) and the deletion
list (applied last, to anything). Also: the night's key changes with every input that changes
what the night would do, so a rerun is a no-op only when it is the same night."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from shards.nightly.night_inputs import combine_tables, night_key, read_deletions

IDS = st.sampled_from([f"s{i}" for i in range(8)])


def _table(rows: dict[str, str]) -> pa.Table:
    return pa.table(
        {
            "sample_id": pa.array(list(rows), pa.string()),
            "fingerprint": pa.array(list(rows.values()), pa.string()),
        }
    )


@settings(max_examples=300, deadline=None)
@given(
    parent=st.dictionaries(IDS, st.sampled_from("ab"), max_size=8),
    new=st.dictionaries(IDS, st.sampled_from("ab"), max_size=8),
    deletions=st.lists(st.one_of(IDS, st.just("nowhere")), max_size=5),
)
def test_combined_table_and_counts_equal_the_set_model(tmp_path_factory, parent, new, deletions):
    out = tmp_path_factory.mktemp("night") / "cost.parquet"
    combined, counts, changed = combine_tables(_table(parent), _table(new), deletions, {}, out)

    deleted = set(deletions)
    updated = {i for i in new if i in parent and parent[i] != new[i]}
    unchanged = {i for i in new if i in parent and parent[i] == new[i]}
    added = set(new) - set(parent)
    want = {i: f for i, f in {**parent, **new}.items() if i not in deleted}
    got = dict(
        zip(*(combined.column(c).to_pylist() for c in ("sample_id", "fingerprint")), strict=True)
    )
    assert got == want and combined.num_rows == len(want)  # every id once, the newest content
    assert (
        pq.read_table(out).column("sample_id").to_pylist()
        == combined.column("sample_id").to_pylist()
    )
    assert counts == {
        "carried_in": len(parent),
        "new": len(added),
        "updated": len(updated - deleted),  # an update deleted the same night is a deletion
        "unchanged_resubmitted": len(unchanged - deleted),
        "deleted": len(deleted & (set(parent) | added)),
        "deletions_not_found": len(deleted - set(parent) - set(new)),
        "out": len(want),
    }
    assert changed == deleted | updated


def test_night_key_changes_with_every_input(tmp_path):
    new = tmp_path / "day.jsonl"
    new.write_text("{}\n")
    delete = tmp_path / "day.delete"
    delete.write_text("a\n")
    base = dict(new=(str(new),), delete=str(delete), image_root="/img", tokenizer="/tok.json")
    key = night_key(SimpleNamespace(**base))
    assert night_key(SimpleNamespace(**base)) == key  # the same night: a rerun is a no-op
    variants = [
        {**base, "image_root": "/other"},  # images read from elsewhere
        {**base, "tokenizer": "/other.json"},
        {**base, "delete": None},
        {**base, "new": ()},
    ]
    keys = {night_key(SimpleNamespace(**v)) for v in variants}
    assert key not in keys and len(keys) == len(variants)
    delete.write_text("b\n")  # another deletion list at the same path
    assert night_key(SimpleNamespace(**base)) != key
    delete.write_text("a\n")
    os.utime(new, ns=(1, 1))  # the new file changed (its mtime; its size is in too)
    assert night_key(SimpleNamespace(**base)) != key


def test_deletion_lists_as_lines_or_json(tmp_path):
    lines = tmp_path / "d.txt"
    lines.write_text("# ids removed on request\n a \n\nb\n#c\n")
    assert read_deletions(str(lines)) == ["a", "b"]
    js = tmp_path / "d.json"
    js.write_text('["x", "y"]')
    assert read_deletions(str(js)) == ["x", "y"]
    assert read_deletions(None) == []


def test_new_samples_are_read_from_the_nights_image_root(tmp_path):
    """The combined table's metadata names, per input, the image root its rows were measured
    under: the parent's inputs keep theirs, the night's inputs take the night's root, even
    where a parent input of the same path was measured under another (a resubmitted file)."""
    from shards.nightly.night_inputs import night_meta

    day1, day2 = str(tmp_path / "day-1.jsonl"), str(tmp_path / "day-2.jsonl")
    meta = {
        "read_options": {"image_root": "/old", "image_roots": [(day1, "/old"), (day2, "/old")]},
        "tokenizer": "kept",
    }
    cfg = SimpleNamespace(new=(day2,), image_root=str(tmp_path / "night"))
    got = night_meta(meta, cfg)
    assert got["tokenizer"] == "kept"
    assert sorted(got["read_options"]["image_roots"]) == [
        (day1, "/old"),
        (day2, str((tmp_path / "night").resolve())),
    ]
    # no root given tonight: the parent's root, for the night's inputs too
    got = night_meta(meta, SimpleNamespace(new=(day2,), image_root=None))
    assert sorted(got["read_options"]["image_roots"]) == [(day1, "/old"), (day2, "/old")]
