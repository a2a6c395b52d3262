"""The prep stage as a whole: counts always add up, bad input is named, splits merge exactly."""

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dataprep import (
    DataprepError,
    ErrorRateExceeded,
    PrepConfig,
    errors_path,
    make_demo,
    merge_cost_tables,
    run_prep,
    table_metadata,
)
from dataprep.chat_template import load_template
from dataprep.text_tokens import TokenCounter, TokenizerSpec
from equishard.contracts.cost_table import METADATA_KEY
from tests.conftest import image_bytes, write_image
from tests.dataprep.helpers import llava, run, tree_digest, write_jsonl


def test_every_bad_input_kind_is_an_error_row_with_a_reason(tmp_path, tokenizer_path):
    write_image(tmp_path / "ok.jpg", 448, 448)
    (tmp_path / "zero.jpg").write_bytes(b"")
    (tmp_path / "trunc.jpg").write_bytes(image_bytes(640, 480)[:2000])
    (tmp_path / "junk.png").write_bytes(b"\x89PNG but not really")
    (tmp_path / "t.tiff").write_bytes(image_bytes(30, 30, "TIFF"))
    records = [
        llava("good", "ok.jpg"),
        llava("missing", "nope.jpg"),
        llava("zero", "zero.jpg"),
        llava("trunc", "trunc.jpg"),
        llava("junk", "junk.png"),
        llava("tiff", "t.tiff"),
        {"id": "empty", "conversations": []},
        {"id": "blank", "conversations": [{"from": "human", "value": "  "}]},
        {"id": "nonstr", "conversations": [{"from": "human", "value": 42}]},
        {"id": "role", "conversations": [{"from": "alien", "value": "hi"}]},
        llava("mismatch", ["ok.jpg"], question="<image> <image> two?"),
        {"id": ["bad"], "conversations": [{"from": "human", "value": "hi"}]},
        llava("good"),  # duplicate id
        [1, 2, 3],
    ]
    res, rows, errors = run(
        tmp_path, [write_jsonl(tmp_path / "bad.jsonl", records, ["{not json"])], tokenizer_path
    )
    assert [r["sample_id"] for r in rows] == ["good"]
    reasons = {(e["sample_id"] or e["location"].split("#")[1]): e["reason"] for e in errors}
    assert reasons == {
        "missing": "missing_image",
        "zero": "empty_image",
        "trunc": "truncated_image",
        "junk": "corrupt_image",
        "tiff": "unsupported_format",
        "empty": "empty_conversation",
        "blank": "empty_conversation",
        "nonstr": "non_string_text",
        "role": "bad_role",
        "mismatch": "image_placeholder_mismatch",
        "11": "bad_id",
        "good": "duplicate_id",
        "13": "not_an_object",
        "14": "malformed_json",
    }
    assert res.n_in == 15 and res.n_written == 1 and res.n_rejected == 14
    assert all(e["detail"] and e["source"] == "bad" for e in errors)
    missing = next(e for e in errors if e["reason"] == "missing_image")
    assert "nope.jpg" in missing["detail"] and missing["location"].endswith("bad.jsonl#1")
    assert res.reasons["empty_conversation"] == 2


def test_error_rate_aborts_with_clear_message_and_keeps_errors_table(tmp_path, tokenizer_path):
    recs = [llava(f"s{i}", "missing.jpg") for i in range(50)] + [llava(f"t{i}") for i in range(50)]
    path = write_jsonl(tmp_path / "d.jsonl", recs)
    out = tmp_path / "cost.parquet"
    with pytest.raises(ErrorRateExceeded, match="--max-error-rate"):
        run_prep(
            PrepConfig(
                inputs=(str(path),), output=str(out), tokenizer=tokenizer_path, chunk_size=10
            )
        )
    assert not out.exists()
    errs = pq.read_table(tmp_path / "cost.errors.parquet")
    assert errs.num_rows >= 2 and set(errs.column("reason").to_pylist()) == {"missing_image"}


def test_tokenizer_is_required_unless_estimate_is_named(tmp_path, tokenizer_path):
    path = write_jsonl(tmp_path / "d.jsonl", [llava("a")])
    with pytest.raises(ValueError, match="no tokenizer given"):
        PrepConfig(inputs=(str(path),), output=str(tmp_path / "c.parquet"), tokenizer=None)
    with pytest.raises(ValueError, match="does not exist"):
        PrepConfig(inputs=(str(path),), output=str(tmp_path / "c.parquet"), tokenizer="nope.json")
    res, rows, _ = run(tmp_path, [path], "estimate:chars_per_token=4")
    meta = table_metadata(res.output)
    assert meta["tokenizer"] == {"mode": "estimate", "chars_per_token": 4.0}
    rendered = load_template("chatml").render(
        [("user", "What is in the picture?"), ("assistant", "A dog in a park.")]
    )
    assert rows[0]["text_tokens"] == math.ceil(len(rendered) / 4)
    assert TokenCounter(TokenizerSpec.parse("estimate:chars_per_token=2")).count(
        ["abcdefg<image>"]
    ) == [4]
    run(tmp_path / "x", [path], tokenizer_path)
    assert (
        table_metadata(tmp_path / "x" / "out" / "cost.parquet")["tokenizer"]["mode"] == "tokenizer"
    )


def test_text_count_matches_the_tokenizer_and_counts_template_tokens(tmp_path, tokenizer_path):
    from tokenizers import Tokenizer

    text = "<|im_start|>user\nWhat color is the dog?<|im_end|>\n"
    direct = len(Tokenizer.from_file(tokenizer_path).encode(text, add_special_tokens=False))
    counter = TokenCounter(TokenizerSpec(path=tokenizer_path))
    assert counter.count([text]) == [direct]
    # each <image> is one placeholder token, excluded from the text count
    assert counter.count(["<image>" + text, text + "<image><image>"]) == [direct, direct]
    path = write_jsonl(tmp_path / "d.jsonl", [llava("a")])
    chatml = run(tmp_path / "c", [path], tokenizer_path, template="chatml")[1][0]["text_tokens"]
    plain = run(tmp_path / "p", [path], tokenizer_path, template="plain")[1][0]["text_tokens"]
    assert chatml > plain


def _demo(tmp_path: Path, n=300, seed=3) -> Path:
    make_demo(tmp_path / "demo", samples=n, seed=seed, images=40)
    return tmp_path / "demo"


def test_demo_is_deterministic_and_has_the_promised_mix(tmp_path):
    a = make_demo(tmp_path / "a", samples=400, seed=7, images=30)
    make_demo(tmp_path / "b", samples=400, seed=7, images=30)
    make_demo(tmp_path / "c", samples=400, seed=8, images=30)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b") != tree_digest(tmp_path / "c")
    assert 0.05 < a.text_only / 400 < 0.15 and 0.65 < a.single_image / 400 < 0.85
    recs = [json.loads(line) for line in (tmp_path / "a" / "demo.jsonl").read_text().splitlines()]
    turns = [len(r["conversations"]) // 2 for r in recs]
    assert min(turns) == 1 and max(turns) <= 8
    imgs = [len(r["image"]) for r in recs if isinstance(r.get("image"), list)]
    assert min(imgs) >= 2 and max(imgs) <= 6


def test_workers_and_chunking_do_not_change_the_table(tmp_path, tokenizer_path):
    demo = _demo(tmp_path)
    inputs = [demo / "demo.jsonl"]
    one = run(tmp_path / "w1", inputs, tokenizer_path, workers=1, chunk_size=1000)[1]
    two = run(tmp_path / "w2", inputs, tokenizer_path, workers=2, chunk_size=37)[1]
    # one worker over many units: each unit's encode overlaps the next unit's reading
    piped = run(tmp_path / "w1c", inputs, tokenizer_path, workers=1, chunk_size=23)[1]
    assert one == two == piped and len(one) == 300


def test_local_workers_are_capped_at_the_usable_cores(tmp_path, tokenizer_path, monkeypatch):
    """``--workers 64`` on a 2-core machine starts 2 processes, and the table is the same as
    one worker's (reference: the cores seen, through ``EQUISHARD_CORES``). Planted bug this
    catches: a process per requested worker (each its own interpreter and tokenizer:
    ``--workers 1024`` on 2 cores ran out of memory, and was no faster)."""
    import concurrent.futures

    import dataprep.prep as prep_module

    sizes = []

    class Recording(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, max_workers=None, *a, **kw):
            sizes.append(max_workers)
            super().__init__(max_workers, *a, **kw)

    monkeypatch.setattr(prep_module, "ProcessPoolExecutor", Recording)
    monkeypatch.setenv("EQUISHARD_CORES", "2")
    demo = _demo(tmp_path)
    inputs = [demo / "demo.jsonl"]
    many = run(tmp_path / "w64", inputs, tokenizer_path, workers=64, chunk_size=20)[1]
    one = run(tmp_path / "w1", inputs, tokenizer_path, workers=1, chunk_size=1000)[1]
    assert sizes == [2] and many == one


def test_a_local_ray_cluster_gets_at_most_the_usable_cores(monkeypatch):
    """The same cap for ``--engine ray`` when it starts its own cluster on this machine
    (no address): ``--workers 64`` on 2 cores declares 2 CPUs; a cluster named by address keeps
    its own. Planted bug this catches: a local cluster of 64 CPUs on 2 cores (a Ray worker
    process, with its tokenizer, per task in flight)."""
    ray = pytest.importorskip("ray")

    from equishard.common.ray_engine import RayOptions, init_ray

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("EQUISHARD_CORES", "2")
    init_ray(RayOptions(num_cpus=64))
    init_ray(RayOptions(num_cpus=1))
    init_ray(RayOptions(address="auto", num_cpus=64))
    assert [c.get("num_cpus") for c in calls] == [2, 1, None]
    assert [c["address"] for c in calls] == [None, None, "auto"]


def test_shard_split_and_merge_equal_one_run(tmp_path, tokenizer_path):
    demo = _demo(tmp_path)
    extra = write_jsonl(tmp_path / "extra.jsonl", [llava(f"x{i}") for i in range(7)], ["{broken"])
    inputs = (str(demo / "demo.jsonl"), str(extra))
    full = tmp_path / "full.parquet"
    run_prep(
        PrepConfig(
            inputs=inputs,
            output=str(full),
            tokenizer=tokenizer_path,
            chunk_size=50,
            max_error_rate=1,
        )
    )
    parts = []
    for k in (2, 0, 1):  # any order
        part = tmp_path / f"part{k}.parquet"
        run_prep(
            PrepConfig(
                inputs=inputs,
                output=str(part),
                tokenizer=tokenizer_path,
                chunk_size=50,
                shard_index=k,
                num_shards=3,
                max_error_rate=1,
            )
        )
        parts.append(str(part))
    sizes = [pq.read_metadata(p).num_rows for p in parts]
    assert all(s > 0 for s in sizes)
    merged = tmp_path / "merged.parquet"
    counts = merge_cost_tables(parts, str(merged))
    assert pq.read_table(merged).equals(pq.read_table(full))
    assert table_metadata(merged) == table_metadata(full)
    assert pq.read_table(tmp_path / "merged.errors.parquet").equals(
        pq.read_table(tmp_path / "full.errors.parquet")
    )
    assert counts == {"in": 308, "written": 307, "rejected": 1}
    with pytest.raises(DataprepError, match=r"missing shard\(s\) \[0\]"):
        merge_cost_tables(parts[:1] + parts[2:], str(tmp_path / "m2.parquet"))
    # a part an older equishard measured (images as stored, no image_sizes mark) is not mixed in
    meta = table_metadata(parts[1])
    del meta["image_sizes"]
    old = pq.read_table(parts[1]).replace_schema_metadata({METADATA_KEY: json.dumps(meta)})
    pq.write_table(old, parts[1])
    with pytest.raises(DataprepError, match="image_sizes differs"):
        merge_cost_tables(parts, str(tmp_path / "m3.parquet"))


def test_merge_keeps_the_first_of_an_id_across_parts(tmp_path, tokenizer_path):
    a = write_jsonl(tmp_path / "a.jsonl", [llava("same"), llava("other")])
    b = write_jsonl(tmp_path / "b.jsonl", [llava("same")])
    parts = []
    for k in range(2):
        p = tmp_path / f"p{k}.parquet"
        run_prep(
            PrepConfig(
                inputs=(str(a), str(b)),
                output=str(p),
                tokenizer=tokenizer_path,
                shard_index=k,
                num_shards=2,
                max_error_rate=1,
            )
        )
        parts.append(str(p))
    counts = merge_cost_tables(parts, str(tmp_path / "m.parquet"))  # a single run's rule
    assert counts == {"in": 3, "written": 2, "rejected": 1}
    rows = pq.read_table(tmp_path / "m.parquet").to_pylist()
    assert [r["sample_id"] for r in rows] == ["same", "other"]
    assert rows[0]["location"].endswith("a.jsonl#0")
    (dup,) = pq.read_table(errors_path(tmp_path / "m.parquet")).to_pylist()
    assert dup["reason"] == "duplicate_id" and dup["location"].endswith("b.jsonl#0")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"inputs": ()}, "no inputs"),
        ({"output": "x.csv"}, ".parquet"),
        ({"workers": 0}, "workers"),
        ({"shard_index": 3, "num_shards": 3}, "shard-index"),
        ({"vision_policy": "fixed:1"}, "fixed:SIZE/PATCH"),
        ({"template": "nope"}, "unknown template"),
    ],
)
def test_config_errors_say_cause_and_fix(tmp_path, tokenizer_path, kwargs, match):
    base = {"inputs": ("a.jsonl",), "output": "c.parquet", "tokenizer": tokenizer_path}
    with pytest.raises(ValueError, match=match):
        PrepConfig(**(base | kwargs))


def test_unreadable_inputs_stop_with_the_file_named(tmp_path, tokenizer_path):
    (tmp_path / "obj.json").write_text('{"not": "a list"}')
    (tmp_path / "x.csv").write_text("a,b")
    for bad, match in [
        ("obj.json", "must hold a list"),
        ("x.csv", "unknown input format"),
        ("none.jsonl", "no such"),
    ]:
        with pytest.raises(DataprepError, match=match):
            run(tmp_path, [tmp_path / bad], tokenizer_path)


@pytest.mark.parametrize("which", ["cost", "errors"])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path, tokenizer_path, which):
    """A Parquet dataset given as input and as -o (or as the errors table next to -o): prep
    replaced the user's dataset with its cost table (data loss, exit 0)."""
    import pyarrow as pa

    data = tmp_path / ("in.parquet" if which == "cost" else "out.errors.parquet")
    rows = [{"id": "a", "conversations": json.dumps([{"from": "human", "value": "hi"}])}]
    pq.write_table(pa.Table.from_pylist(rows), data)
    before = data.read_bytes()
    out = data if which == "cost" else tmp_path / "out.parquet"
    with pytest.raises(ValueError, match=rf"is the input .*its {which} table"):
        PrepConfig(inputs=(str(data),), output=str(out), tokenizer=tokenizer_path)
    assert data.read_bytes() == before


def test_the_demo_never_writes_over_a_users_directory(tmp_path):
    """``equishard demo DIR`` deleted DIR/images/ and replaced DIR/tokenizer.json whatever they
    were (a user's dataset lost its images). It writes into a new or empty directory, or one a
    demo wrote (again and again, as make shards does), and refuses any other."""
    user = tmp_path / "mine"
    (user / "images").mkdir(parents=True)
    (user / "images" / "cat.jpg").write_bytes(b"precious")
    (user / "tokenizer.json").write_text("precious")
    with pytest.raises(ValueError, match="holds files the demo did not write"):
        make_demo(user, samples=3)
    assert (user / "images" / "cat.jpg").read_bytes() == b"precious"
    assert (user / "tokenizer.json").read_text() == "precious"
    demo = tmp_path / "demo"
    first = make_demo(demo, samples=3, seed=1)
    again = make_demo(demo, samples=3, seed=1)  # its own directory: replaced, the same
    assert first == again and (demo / "demo.jsonl").is_file()
    (demo / ".equishard-demo").unlink()  # a demo from before the marker: its files alone
    make_demo(demo, samples=3, seed=1)


@pytest.mark.parametrize("chunk", [1, 2, 100])
def test_errors_name_the_line_of_the_file_blank_lines_counted(tmp_path, tokenizer_path, chunk):
    """An errors row names the line an editor shows (1-based, blank lines counted), whatever
    the work units' size. Reference: the lines written here."""
    good = json.dumps(llava("a"))
    lines = [good, "", "", "{not json", good.replace('"a"', '"b"'), "   ", "", "[1, 2"]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    _, _, errors = run(tmp_path, [path], tokenizer_path, chunk_size=chunk)
    assert sorted(e["line"] for e in errors) == [4, 8]


def test_a_parquet_input_of_many_row_groups_splits_into_shards_exactly(tmp_path, tokenizer_path):
    """Each record of a Parquet input has one global index across its row groups; prep split
    into shards keeps records [T*k/N, T*(k+1)/N) of the whole input in shard k (a planted bug,
    every row group numbering its records from 0, put the whole input in shard 0 and the other
    shards empty, which a check of the ids alone did not see). Reference: the input's order."""
    import pyarrow as pa

    rows = [{"id": f"p{i}", **{k: v for k, v in llava(f"p{i}").items() if k != "id"}}
            for i in range(23)]  # fmt: skip
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5)
    assert pq.ParquetFile(path).metadata.num_row_groups == 5
    ids, sizes = [], []
    for k in range(3):
        out = tmp_path / f"part{k}.parquet"
        run_prep(
            PrepConfig(
                inputs=(str(path),),
                output=str(out),
                tokenizer=tokenizer_path,
                shard_index=k,
                num_shards=3,
            )
        )
        got = pq.read_table(out).column("sample_id").to_pylist()
        ids += got
        sizes.append(len(got))
    assert sorted(ids) == sorted(r["id"] for r in rows)
    assert sizes == [7, 8, 8]  # records [23k/3, 23(k+1)/3) of the whole input, in order
    assert ids == [r["id"] for r in rows]


def test_a_ray_workers_measurer_never_outlives_its_run(tmp_path, tokenizer_path):
    """A worker of a long-lived Ray cluster keeps its Measurer between tasks; kept across runs
    (keyed by the configuration alone), a run after the tokenizer file was edited in place was
    measured with the old tokenizer while the table recorded the new one's sha256. Called as Ray
    calls it, with the run's token."""
    from dataprep.prep import _measure_task, _measurer
    from dataprep.readers import scan_inputs

    data = write_jsonl(tmp_path / "d.jsonl", [llava(f"s{i}") for i in range(3)])
    tok = tmp_path / "tokenizer.json"
    tok.write_bytes(Path(tokenizer_path).read_bytes())
    cfg = PrepConfig(inputs=(str(data),), output=str(tmp_path / "c.parquet"), tokenizer=str(tok))
    unit = next(iter(scan_inputs([str(data)], 64)))

    def llm(result):
        return result.batch.column("llm_tokens").to_pylist()

    before = llm(_measure_task(cfg, unit, "run-1"))
    spec = json.loads(tok.read_text())  # the same file, now dropping spaces before counting
    spec["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": ""}
    tok.write_text(json.dumps(spec))
    want = llm(_measurer(cfg).measure(unit))
    assert want != before
    assert llm(_measure_task(cfg, unit, "run-1")) == before  # the same run: the same measurer
    assert llm(_measure_task(cfg, unit, "run-2")) == want


def test_a_model_directory_names_its_tokenizer(tmp_path, tokenizer_path):
    """``--tokenizer DIR`` (a model directory as downloaded, as ``--template`` takes) counts
    with DIR/tokenizer.json exactly as naming the file does; a directory without one is
    refused saying what to give."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes(Path(tokenizer_path).read_bytes())
    assert TokenizerSpec.parse(str(model)).path == str(model / "tokenizer.json")
    data = write_jsonl(tmp_path / "d.jsonl", [llava(f"s{i}") for i in range(4)])
    by_dir = run(tmp_path / "a", [data], str(model))[1]
    by_file = run(tmp_path / "b", [data], tokenizer_path)[1]
    assert [r["llm_tokens"] for r in by_dir] == [r["llm_tokens"] for r in by_file]
    (model / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"has no tokenizer\.json"):
        TokenizerSpec.parse(str(model))
