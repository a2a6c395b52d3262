"""One bad record is that record's errors row, never the end of the run: records nested too deep,
lone surrogates, image paths that leave --image-root; and the smaller contract gaps of prep."""

from __future__ import annotations

import json
import os

import pytest

from dataprep import PrepConfig, errors_path, merge_cost_tables, run_prep
from dataprep.errors import ErrorRateExceeded
from tests.conftest import write_image
from tests.dataprep.helpers import llava, run, write_jsonl

DEEP = "[" * 50_000 + "]" * 50_000


def test_deeply_nested_jsonl_record_is_its_row(tmp_path, tokenizer_path):
    lines = [json.dumps(llava("a")), '{"id": "deep", "x": ' + DEEP + "}", json.dumps(llava("b"))]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    _res, rows, errors = run(tmp_path, [tmp_path / "d.jsonl"], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["a", "b"]
    (e,) = errors
    assert e["reason"] == "too_deep" and e["line"] == 2 and "d.jsonl" in e["detail"]


def test_deeply_nested_json_list_record_is_its_row(tmp_path, tokenizer_path):
    text = "[" + json.dumps(llava("a")) + ", " + DEEP + ", " + json.dumps(llava("b")) + "]"
    (tmp_path / "d.json").write_text(text)
    _res, rows, errors = run(tmp_path, [tmp_path / "d.json"], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["a", "b"]
    (e,) = errors
    assert e["reason"] == "too_deep" and "d.json" in e["detail"] and e["location"].endswith("#1")


@pytest.mark.parametrize("tokenizer", ["real", "estimate:chars_per_token=4"])
def test_lone_surrogate_is_its_row_in_every_mode(tmp_path, tokenizer_path, tokenizer):
    tok = tokenizer_path if tokenizer == "real" else tokenizer
    lines = [
        json.dumps(llava("a")),
        json.dumps(llava("sur", answer="bad \ud800 text")),  # JSON writes it as "\ud800"
        json.dumps(llava("id\udfff")),
        json.dumps(llava("b")),
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    _res, rows, errors = run(tmp_path, [tmp_path / "d.jsonl"], tok)
    assert [r["sample_id"] for r in rows] == ["a", "b"]
    reasons = {e["line"]: e["reason"] for e in errors}
    assert reasons == {2: "invalid_text", 3: "bad_id"}


def test_image_paths_outside_the_root_are_rejected_unless_allowed(tmp_path, tokenizer_path):
    root = tmp_path / "root"
    write_image(root / "in.jpg", 64, 48)
    outside = write_image(tmp_path / "secret.jpg", 64, 48)
    os.symlink(outside, root / "link.jpg")
    recs = [
        llava("ok", "in.jpg"),
        llava("dotdot", "../secret.jpg"),
        llava("abs", str(outside)),
        llava("symlink", "link.jpg"),
        llava("parent", ".."),  # the root's parent itself: a path that ends in ".."
    ]
    jl = write_jsonl(tmp_path / "d.jsonl", recs)
    _res, rows, errors = run(tmp_path, [jl], tokenizer_path, image_root=str(root))
    assert [r["sample_id"] for r in rows] == ["ok"]
    assert {e["sample_id"]: e["reason"] for e in errors} == {
        "dotdot": "unsafe_path",
        "abs": "unsafe_path",
        "symlink": "unsafe_path",
        "parent": "unsafe_path",
    }
    assert all("--allow-outside-image-root" in e["detail"] for e in errors)
    _res, rows, errors = run(
        tmp_path, [jl], tokenizer_path, image_root=str(root), allow_outside_image_root=True
    )
    assert len(rows) == 4 and [e["sample_id"] for e in errors] == ["parent"]


def test_duplicate_id_rows_carry_the_line(tmp_path, tokenizer_path):
    jl = write_jsonl(tmp_path / "d.jsonl", [llava("a"), llava("b"), llava("a")])
    _res, rows, errors = run(tmp_path, [jl], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["a", "b"]
    assert [(e["reason"], e["line"]) for e in errors] == [("duplicate_id", 3)]


def test_aborted_prep_leaves_no_mismatched_pair(tmp_path, tokenizer_path):
    out = tmp_path / "out" / "cost.parquet"
    good = write_jsonl(tmp_path / "good.jsonl", [llava(f"g{i}") for i in range(5)])
    cfg = dict(output=str(out), tokenizer=tokenizer_path)
    run_prep(PrepConfig(inputs=(str(good),), **cfg))
    assert out.exists()
    bad = write_jsonl(tmp_path / "bad.jsonl", [llava("x")], raw_lines=["{broken"] * 5)
    with pytest.raises(ErrorRateExceeded) as e:
        run_prep(PrepConfig(inputs=(str(bad),), **cfg))
    assert errors_path(out).exists()  # the cause can be seen
    assert not out.exists()  # but no cost table of another run sits beside it
    assert "removed" in str(e.value)


def test_stale_temp_files_of_a_killed_prep_are_removed(tmp_path, tokenizer_path):
    out = tmp_path / "out" / "cost.parquet"
    out.parent.mkdir()
    dead = 2**22 + 12345  # no such process
    for name in (f".cost.parquet.tmp-{dead}", f".cost.errors.parquet.tmp-{dead}"):
        (out.parent / name).write_bytes(b"half")
    good = write_jsonl(tmp_path / "good.jsonl", [llava("g")])
    run_prep(PrepConfig(inputs=(str(good),), output=str(out), tokenizer=tokenizer_path))
    assert sorted(p.name for p in out.parent.iterdir()) == ["cost.errors.parquet", "cost.parquet"]


def test_split_prep_and_merge_keep_the_first_of_a_duplicate_id(tmp_path, tokenizer_path):
    recs = [llava("a"), llava("b"), llava("c"), llava("a"), llava("d"), llava("b")]
    jl = write_jsonl(tmp_path / "d.jsonl", recs)
    _res, single, single_err = run(tmp_path, [jl], tokenizer_path)
    parts = []
    for k in range(2):
        part = tmp_path / f"part{k}.parquet"
        run_prep(
            PrepConfig(
                inputs=(str(jl),),
                output=str(part),
                tokenizer=tokenizer_path,
                shard_index=k,
                num_shards=2,
                max_error_rate=1.0,
            )
        )
        parts.append(str(part))
    counts = merge_cost_tables(parts, str(tmp_path / "merged.parquet"))
    import pyarrow.parquet as pq

    merged = pq.read_table(tmp_path / "merged.parquet").to_pylist()
    merged_err = pq.read_table(errors_path(tmp_path / "merged.parquet")).to_pylist()
    strip = lambda rows: [{k: v for k, v in r.items()} for r in rows]  # noqa: E731
    assert strip(merged) == strip(single)
    assert sorted((e["sample_id"], e["reason"]) for e in merged_err) == sorted(
        (e["sample_id"], e["reason"]) for e in single_err
    )
    assert counts == {"in": 6, "written": 4, "rejected": 2}


def test_a_directory_turned_into_a_link_out_of_the_root_is_seen_by_the_next_run(tmp_path):
    """Directories' real paths are cached while images are checked against the image root: a
    cache kept for the process let a run trust what an earlier run had resolved, after the
    directory had become a symlink leading out of the root."""
    from dataprep.errors import SampleRejected
    from dataprep.image_refs import image_ref
    from dataprep.readers.base import ReadOptions

    root, outside = tmp_path / "root", tmp_path / "secret"
    (root / "imgs").mkdir(parents=True)
    outside.mkdir()
    write_image(root / "imgs" / "a.png", 4, 4)
    write_image(outside / "a.png", 4, 4)
    data = str(root / "data.jsonl")
    assert image_ref("imgs/a.png", data, ReadOptions(image_root=str(root)), "x#0").path
    (root / "imgs" / "a.png").unlink()
    (root / "imgs").rmdir()
    (root / "imgs").symlink_to(outside, target_is_directory=True)
    with pytest.raises(SampleRejected, match="outside the image root"):
        image_ref("imgs/a.png", data, ReadOptions(image_root=str(root)), "x#0")


HUGE = 4096  # the record size limit in these tests (256 MiB in use): the same code path


@pytest.mark.parametrize("chunk", [1, 2, 5])
@pytest.mark.parametrize("last", [False, True], ids=["inside", "last-without-newline"])
def test_a_jsonl_line_over_the_record_limit_is_its_row_unread(
    tmp_path, tokenizer_path, monkeypatch, chunk, last
):
    """A JSONL line longer than a record may be (a multi-gigabyte line was read whole by the
    scan and again by a worker, then parsed into many times its size: a worker out of memory
    and the run gone) is rejected as ``record_too_large`` naming the file and line, read only
    in bounded pieces; every other record is measured exactly as in the file without it, and
    the line numbers after it stay right. Reference: the same prep of the file without it."""
    monkeypatch.setattr("dataprep.readers.base.MAX_RECORD_BYTES", HUGE)
    recs = [llava(k, question=f"question {k}") for k in "abcd"]
    huge = json.dumps(llava("huge", question="x" * 3 * HUGE))
    lines = [json.dumps(r) for r in recs] + ["{not json"]  # line 5 (6 after the huge one)
    lines.insert(5 if last else 2, huge)
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + ("" if last else "\n"))
    write_jsonl(tmp_path / "ref.jsonl", recs)
    _res, rows, errors = run(tmp_path, [tmp_path / "d.jsonl"], tokenizer_path, chunk_size=chunk)
    ref = tmp_path / "ref"
    ref.mkdir()
    _r, want, _e = run(ref, [tmp_path / "ref.jsonl"], tokenizer_path, chunk_size=chunk)
    counts = ("sample_id", "llm_tokens", "text_tokens", "vit_tokens")
    assert [[r[c] for c in counts] for r in rows] == [[r[c] for c in counts] for r in want]
    e, bad = errors if not last else errors[::-1]
    line = 6 if last else 3
    assert (bad["reason"], bad["line"]) == ("malformed_json", 5 if last else 6)
    assert e["reason"] == "record_too_large" and e["line"] == line
    assert f"d.jsonl: line {line}: {len(huge)} bytes, more than the {HUGE}" in e["detail"]
    assert [r["location"].rsplit("#", 1)[1] for r in rows] == (
        ["0", "1", "2", "3"] if last else ["0", "1", "3", "4"]
    )


def test_a_tar_samples_json_over_the_record_limit_is_its_row_unread(
    tmp_path, tokenizer_path, monkeypatch
):
    """The same for a tar sample whose .json member is larger than a record may be: rejected
    by its size in the tar header, naming the tar and the sample, never read."""
    import tarfile

    from tests.dataprep.helpers import add_member

    monkeypatch.setattr("dataprep.readers.base.MAX_RECORD_BYTES", HUGE)
    small = json.dumps(llava("x")).encode()
    big = json.dumps(llava("y", question="x" * 3 * HUGE)).encode()
    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        add_member(tf, "k0.json", small)
        add_member(tf, "k1.json", big)
        add_member(tf, "k2.json", small.replace(b'"x"', b'"z"'))
    _res, rows, errors = run(tmp_path, [tmp_path / "s.tar"], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["x", "z"]
    (e,) = errors
    assert e["reason"] == "record_too_large" and e["sample_id"] == "k1"
    assert f"s.tar: 'k1'.json: {len(big)} bytes" in e["detail"]
