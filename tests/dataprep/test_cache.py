"""Prep's cache: unchanged samples keep their rows without being re-read; changes are seen."""

from __future__ import annotations

import json
import os

import pytest

from dataprep import PrepConfig, make_demo, read_cost_table, run_prep
from dataprep.demo import split_days


def _prep(demo, out, cache=None, workers=1, inputs=None):
    return run_prep(
        PrepConfig(
            inputs=(str(inputs or demo / "demo.jsonl"),),
            output=str(out),
            tokenizer=str(demo / "tokenizer.json"),
            image_root=str(demo),
            cache=cache,
            workers=workers,
            chunk_size=9,
        )
    )


def test_cache_reuses_rows_and_sees_changes(tmp_path):
    demo = tmp_path / "demo"
    make_demo(demo, samples=40, seed=2, images=10)
    first = tmp_path / "a.parquet"
    r1 = _prep(demo, first)
    assert r1.n_cached == 0
    for workers in (1, 2):
        out = tmp_path / f"b{workers}.parquet"
        r = _prep(demo, out, cache=str(first), workers=workers)
        assert r.n_cached == r.n_in == 40
        assert read_cost_table(out).equals(read_cost_table(first))
    # an image file changes (mtime): the samples using it are measured again
    img = sorted((demo / "images").iterdir())[0]
    os.utime(img, ns=(1, 1))
    users = sum(img.name in line for line in (demo / "demo.jsonl").read_text().splitlines())
    r = _prep(demo, tmp_path / "c.parquet", cache=str(first))
    assert users > 0 and r.n_cached == 40 - users
    # a record's text changes: measured again, with a new fingerprint
    lines = (demo / "demo.jsonl").read_text().splitlines()
    rec = json.loads(lines[3])
    rec["conversations"][-1]["value"] += " more words here"
    lines[3] = json.dumps(rec)
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join(lines) + "\n")
    r = _prep(demo, tmp_path / "d.parquet", cache=str(tmp_path / "c.parquet"), inputs=edited)
    assert r.n_cached == 39
    d = read_cost_table(tmp_path / "d.parquet").to_pydict()
    c = read_cost_table(tmp_path / "c.parquet").to_pydict()
    i = d["sample_id"].index(rec["id"])
    assert d["fingerprint"][i] != c["fingerprint"][i] and d["text_tokens"][i] > c["text_tokens"][i]


def test_split_days_is_deterministic(tmp_path):
    outs = []
    for k in range(2):
        demo = tmp_path / f"d{k}"
        make_demo(demo, samples=50, seed=1, images=10)
        split_days(demo, days=3, seed=1)
        outs.append(
            [
                (demo / n).read_bytes()
                for n in (
                    "day-1.jsonl",
                    "day-2.jsonl",
                    "day-3.jsonl",
                    "day-2.delete",
                    "day-3.delete",
                )
            ]
        )
    assert outs[0] == outs[1]
    day1 = outs[0][0].decode().splitlines()
    assert len(day1) == 30
    assert len(outs[0][3].decode().split()) == 3


def test_cache_from_before_displayed_sizes_measures_image_rows_again(tmp_path):
    """A cost table written before images were counted as displayed (its metadata has no
    ``image_sizes``; a sideways photo has its stored size there): text-only rows are reused,
    rows with images measured again, so the sideways photo gets its displayed size."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from equishard.contracts.cost_table import METADATA_KEY, table_metadata
    from tests.conftest import write_image

    demo = tmp_path / "demo"
    make_demo(demo, samples=40, seed=2, images=10)
    photo = next(p for p in sorted((demo / "images").iterdir()) if p.suffix == ".jpg")
    assert photo.name in (demo / "demo.jsonl").read_text()
    write_image(photo, 600, 200, "JPEG", orientation=6)
    first = tmp_path / "a.parquet"
    _prep(demo, first)
    table = pq.read_table(first)
    meta = table_metadata(first)
    assert meta["image_sizes"] == "displayed"
    sizes = [
        (w, h)
        for row in table.to_pylist()
        for w, h in zip(row["image_widths"], row["image_heights"], strict=True)
    ]
    assert (200, 600) in sizes and (600, 200) not in sizes  # the photo, as displayed
    del meta["image_sizes"]
    rows = table.to_pylist()
    for r in rows:  # as the old prep measured the sideways photo: the stored size
        r["image_widths"], r["image_heights"] = r["image_heights"], r["image_widths"]
    old = tmp_path / "old.parquet"
    pq.write_table(
        pa.Table.from_pylist(rows, schema=table.schema).replace_schema_metadata(
            {METADATA_KEY: json.dumps(meta)}
        ),
        old,
    )
    r = _prep(demo, tmp_path / "b.parquet", cache=str(old))
    with_images = sum(1 for row in rows if row["num_images"])
    assert with_images and r.n_cached == r.n_in - with_images
    assert read_cost_table(tmp_path / "b.parquet").equals(read_cost_table(first))
    # from a table that says its sizes are displayed, every row is reused
    assert _prep(demo, tmp_path / "c.parquet", cache=str(first)).n_cached == r.n_in


def _prep_with(demo, out, **kw):
    base = dict(
        inputs=(str(demo / "demo.jsonl"),),
        output=str(out),
        tokenizer=str(demo / "tokenizer.json"),
        image_root=str(demo),
        chunk_size=9,
    )
    return run_prep(PrepConfig(**{**base, **kw}))


OTHER_SETTINGS = {
    "tokenizer": dict(tokenizer="estimate:chars_per_token=3"),
    "vision_policy": dict(vision_policy="fixed:336/14"),
    "template": dict(template="vicuna"),
}


@pytest.mark.parametrize("setting", OTHER_SETTINGS, ids=list(OTHER_SETTINGS))
def test_a_cache_measured_with_other_settings_is_refused(tmp_path, setting):
    """``--cache`` reuses rows by sample id and cache key (the record and image files), which
    say nothing of how the row was counted: a cost table of another tokenizer, policy or
    template would lend its counts to this prep's table, labelled with this prep's settings
    (bug: every row reused, the table's text or vision tokens those of the other setting).
    Reference: the same prep without a cache counts otherwise."""
    demo = tmp_path / "demo"
    make_demo(demo, samples=30, seed=2, images=8)
    first = tmp_path / "a.parquet"
    _prep_with(demo, first)
    fresh = read_cost_table(
        _prep_with(demo, tmp_path / "f.parquet", **OTHER_SETTINGS[setting]).output
    )
    assert not fresh.equals(read_cost_table(first))  # the setting does change the counts
    out = tmp_path / "b.parquet"
    with pytest.raises(ValueError, match=f"measured with other settings.*{setting}"):
        _prep_with(demo, out, cache=str(first), **OTHER_SETTINGS[setting])
    assert not out.exists()


def test_a_cache_is_used_when_only_the_tokenizer_path_differs(tmp_path):
    """The tokenizer is compared by its bytes: the same file at another path (a copy on
    another machine, a nightly run given --tokenizer) reuses every row."""
    import shutil

    demo = tmp_path / "demo"
    make_demo(demo, samples=30, seed=2, images=8)
    first = tmp_path / "a.parquet"
    _prep_with(demo, first)
    moved = tmp_path / "elsewhere" / "tok.json"
    moved.parent.mkdir()
    shutil.copy(demo / "tokenizer.json", moved)
    r = _prep_with(demo, tmp_path / "b.parquet", cache=str(first), tokenizer=str(moved))
    assert r.n_cached == r.n_in == 30


def test_a_cache_of_header_checked_images_is_refused_for_a_decode_prep(tmp_path):
    """Rows whose images were only header-checked cannot stand in for a prep that decodes
    every image (bug: a truncated image inside a cached row passed --check-images decode);
    a decode-checked cache serves a header prep."""
    demo = tmp_path / "demo"
    make_demo(demo, samples=30, seed=2, images=8)
    header, decode = tmp_path / "h.parquet", tmp_path / "d.parquet"
    _prep_with(demo, header)
    with pytest.raises(ValueError, match="checked images with 'header'"):
        _prep_with(demo, tmp_path / "x.parquet", cache=str(header), check_images="decode")
    _prep_with(demo, decode, check_images="decode")
    r = _prep_with(demo, tmp_path / "y.parquet", cache=str(decode))
    assert r.n_cached == r.n_in == 30


def test_an_aborted_refresh_in_place_keeps_the_cache(tmp_path):
    """``prep NEW -o cost.parquet --cache cost.parquet`` refreshes a table in place; a run that
    stops on its error rate removed the older table beside its new errors, which here is the
    user's cache (a full prep of everything to get it back). It is kept, and said so."""
    from dataprep import ErrorRateExceeded

    demo = tmp_path / "demo"
    make_demo(demo, samples=30, seed=2, images=8)
    cost = tmp_path / "cost.parquet"
    _prep(demo, cost)
    before = cost.read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "conversations": []}\n' * 5)
    cfg = PrepConfig(
        inputs=(str(demo / "demo.jsonl"), str(bad)),
        output=str(cost),
        tokenizer=str(demo / "tokenizer.json"),
        image_root=str(demo),
        cache=str(cost),
        max_error_rate=0.0,
    )
    with pytest.raises(ErrorRateExceeded, match="this run's --cache\\) is kept"):
        run_prep(cfg)
    assert cost.read_bytes() == before


def _rewrite(src, dst, edit) -> None:
    """``src`` with its rows edited by ``edit(rows)``, under ``src``'s own metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    rows = table.to_pylist()
    edit(rows)
    from equishard.contracts.cost_table import METADATA_KEY, table_metadata

    meta = {METADATA_KEY: json.dumps(table_metadata(src))}
    pq.write_table(
        pa.Table.from_pylist(rows, schema=table.schema).replace_schema_metadata(meta), dst
    )


def _edit_text(rows) -> None:
    # a text row's count raised, keeping the table's row rules (llm = text + image tokens)
    r = next(r for r in rows if r["num_images"] == 0)
    r["text_tokens"] += 5
    r["llm_tokens"] += 5


def _edit_image_row(rows, what: str) -> None:
    # an image row's text share lowered (its LLM total kept), or its vision tokens raised, or
    # its first image's width changed: each keeps the table's row rules
    r = next(r for r in rows if r["num_images"] > 0)
    if what == "text":
        r["text_tokens"] -= 1
    elif what == "vision":
        r["vit_seq_lens"][0] += 4
        r["vit_tokens"] += 4
    else:
        r["image_widths"][0] += 1


def _paste(other):
    def edit(rows) -> None:
        rows[:] = other  # another setting's rows under this table's metadata

    return edit


def _strip_seals(rows) -> None:
    for r in rows:  # a table from before rows were sealed: input keys only
        r["cache_key"] = r["cache_key"].partition(".")[0]


EDITS = ["text row", "image row: text", "image row: vision", "image row: width"]


@pytest.mark.parametrize("case", [*EDITS, "pasted rows", "unsealed keys"])
def test_a_cache_row_is_reused_only_with_its_seal(tmp_path, case):
    """A cache row is reused by sample id and input key (record bytes, image file stats), which
    say nothing of its counts: a row whose counts were edited since (keeping the row rules),
    rows of another template pasted under this table's metadata, were handed on as measured
    (bug: the output table held the edited or foreign counts under this prep's settings). Rows
    are sealed with their counts and settings, and one that does not match is measured again.
    Reference: the same prep without a cache."""
    demo = tmp_path / "demo"
    make_demo(demo, samples=30, seed=2, images=8)
    first, fresh = tmp_path / "a.parquet", tmp_path / "fresh.parquet"
    _prep_with(demo, first)
    _prep_with(demo, fresh)
    vicuna = tmp_path / "v.parquet"
    _prep_with(demo, vicuna, template="vicuna")
    edit, remeasured = {
        "text row": (_edit_text, 1),
        "image row: text": (lambda rows: _edit_image_row(rows, "text"), 1),
        "image row: vision": (lambda rows: _edit_image_row(rows, "vision"), 1),
        "image row: width": (lambda rows: _edit_image_row(rows, "width"), 1),
        "pasted rows": (_paste(read_cost_table(vicuna).to_pylist()), 30),
        "unsealed keys": (_strip_seals, 30),
    }[case]
    cache = tmp_path / "cache.parquet"
    _rewrite(first, cache, edit)
    assert not read_cost_table(cache).equals(read_cost_table(fresh))
    out = tmp_path / "b.parquet"
    r = _prep_with(demo, out, cache=str(cache))
    assert r.n_cached == 30 - remeasured
    assert read_cost_table(out).equals(read_cost_table(fresh))
