"""Bad arguments and bad paths give one line on stderr and exit 2, never a traceback; a summary
piped into a reader that closes early ends quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from equishard.cli import main
from tests.shards.conftest import build_inputs


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("clierr")
    demo, cost, plan = build_inputs(root, samples=40)
    assert main(["write", str(plan), "--cost-table", str(cost), "--out", str(root / "gen")]) == 0
    return {"demo": demo, "cost": cost, "plan": plan, "gen": root / "gen"}


def _cases(m: dict, tmp: Path) -> list[tuple[list[str], str]]:
    d, cost, plan, gen = m["demo"], str(m["cost"]), str(m["plan"]), str(m["gen"])
    tok = str(d / "tokenizer.json")
    jl = str(d / "demo.jsonl")
    unwritable = tmp / "blocker"  # a file: nothing can be created below it (even as root)
    unwritable.write_text("")
    prep = ["prep", jl, "--tokenizer", tok, "-o", str(tmp / "c.parquet")]
    (tmp / "pl").mkdir()  # a cost table named as the plan balance writes into that directory
    own = tmp / "pl" / "plan.parquet"
    own.write_bytes(Path(cost).read_bytes())
    write = ["write", plan, "--cost-table", cost, "--out", str(tmp / "g")]
    garbage = tmp / "garbage.parquet"
    garbage.write_bytes(b"PAR1 not a table at all")
    truncated = tmp / "cut.parquet"
    truncated.write_bytes(Path(cost).read_bytes()[:-100])
    return [
        (["balance", str(own), "--dp", "4", "-o", str(tmp / "pl")], "is the plan's own"),
        (["balance", cost, "--dp", "4", "--nodes", "0", "-o", str(tmp / "p")], "--nodes"),
        (
            ["balance", cost, "--dp", "4", "--target-batch", "0.5", "-o", str(tmp / "p")],
            "--target-batch",
        ),
        (
            ["balance", cost, "--dp", "4", "--target-batch", "inf", "-o", str(tmp / "p")],
            "--target-batch",
        ),
        ([*prep, "--vision-policy", "internvl:patch_size=0"], "patch_size"),
        ([*prep, "--vision-policy", "internvl:tile_size=0"], "tile_size"),
        ([*prep, "--vision-policy", "qwen2vl:merge_size=0"], "merge_size"),
        ([*prep, "--vision-policy", "qwen2vl:patch_size=0"], "patch_size"),
        (
            [
                "prep",
                jl,
                "--tokenizer",
                "estimate:chars_per_token=inf",
                "-o",
                str(tmp / "c.parquet"),
            ],
            "finite",
        ),
        ([*prep, "--cache", str(tmp / "missing.parquet")], "--cache"),
        # a negative timeout failed every task at once, NaN never timed out
        ([*prep, "--task-timeout", "-1"], "--task-timeout"),
        ([*prep, "--task-timeout", "nan"], "--task-timeout"),
        ([*write, "--task-timeout", "-5"], "--task-timeout"),
        (["prep", jl, "--tokenizer", tok, "-o", str(unwritable / "sub" / "c.parquet")], "blocker"),
        (["verify", cost], "not a generation"),
        (["inspect", cost], "not a generation"),
        (["report", cost, "-o", str(tmp / "r.html")], "not a generation"),
        (["report", gen, "-o", str(unwritable / "x" / "r.html")], "blocker"),
        # a published generation never changes: -o over its manifest broke it
        (["report", gen, "-o", str(next(Path(gen).glob("gen-*/manifest.json")))], "is inside"),
        ([*prep[:-2], "-o", str(next(Path(gen).glob("gen-*/cost.parquet")))], "is inside"),
        (["balance", cost, "--dp", "4", "-o", str(next(Path(gen).glob("gen-*")))], "is inside"),
        (["balance", cost, "--dp", "4", "-o", str(unwritable / "plan")], "blocker"),
        (["write", plan, "--cost-table", cost, "--out", str(unwritable / "g")], "blocker"),
        (["merge", cost, "-o", str(unwritable / "d" / "m.parquet")], "blocker"),
        (["demo", str(tmp / "demo"), "--days", "0"], "--days"),
        (["verify", str(tmp / "nothing-here")], "no such"),
        # more digits than any size (float() made it inf: an OverflowError traceback)
        ([*write, "--shard-size", "9" * 40], "bad size"),
        ([*write, "--shard-size", "2048TB"], "1PB"),
        # pyarrow's "Parquet magic bytes not found in footer" named no file
        (["balance", str(garbage), "--dp", "4", "-o", str(tmp / "p")], "garbage.parquet"),
        (["balance", str(truncated), "--dp", "4", "-o", str(tmp / "p")], "cut.parquet"),
        (["write", plan, "--cost-table", str(garbage), "--out", str(tmp / "g")], "garbage.parquet"),
        (["write", plan, "--cost-table", str(truncated), "--out", str(tmp / "g")], "cut.parquet"),
    ]


def test_each_bad_argument_is_one_line_and_exit_2(made, tmp_path, capsys):
    for argv, needle in _cases(made, tmp_path):
        code = main(argv)
        err = capsys.readouterr().err
        lines = [x for x in err.splitlines() if x.strip()]
        assert code == 2, (argv, err)
        assert len(lines) == 1 and "Traceback" not in err, (argv, err)
        assert needle in lines[0], (argv, lines[0])


def test_huge_target_batch_is_one_step_not_an_overflow(made, tmp_path, capsys):
    """More samples per group than the table holds: every sample in one step, no overflow."""
    assert main(["balance", str(made["cost"]), "--dp", "4", "--target-batch", "100000",
                 "-o", str(tmp_path / "p")]) == 0  # fmt: skip
    report = json.loads((tmp_path / "p" / "report.json").read_text())
    assert report["counts"]["in"] == report["counts"]["out"] and report["counts"]["steps"] == 1


def test_train_checks_its_shards_before_starting_processes(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "equishard", "train", "--shards", str(tmp_path / "none"),
         "--nproc", "2", "--dp", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "--shards" in r.stderr and "Traceback" not in r.stderr
    assert "torch.distributed" not in r.stderr and "ChildFailedError" not in r.stderr


@pytest.mark.parametrize("sub", ["inspect", "verify"])
def test_summary_into_a_closed_pipe_ends_quietly(made, sub):
    p = subprocess.Popen(
        [sys.executable, "-m", "equishard", sub, str(made["gen"])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.close()  # the reader is gone before anything was printed (like `| head -0`)
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err


def _with_row0(table, column: str, value, typ):
    import pyarrow as pa

    vals = table.column(column).to_pylist()
    vals[0] = value
    return table.set_column(table.schema.get_field_index(column), column, pa.array(vals, typ))


@pytest.mark.parametrize(
    ("column", "value", "typ", "why"),
    [
        ("vit_tokens", None, "int64", "vit_tokens is missing"),
        ("llm_tokens", -5, "int64", "llm_tokens is missing or negative"),
        ("sample_id", None, "string", "sample_id is missing"),
        ("sample_id", "DUP", "string", None),
        ("vit_seq_lens", [-3], "list<int32>", "negative length"),
        # written into the sample's document, which no reader takes
        ("vit_seq_lens", [1024, None], "list<int32>", "vit_seq_lens holds a missing value"),
        # sums of such counts overflow 64-bit integers (the plan was made, silently wrong)
        ("llm_tokens", 2**62, "int64", "llm_tokens is above the plausible"),
        ("vit_tokens", 2**40, "int64", "vit_tokens is above the plausible"),
        ("num_images", 2**30, "int32", "num_images is above the plausible"),
    ],
)
def test_balance_refuses_a_cost_table_row_it_cannot_use(
    made, tmp_path, capsys, column, value, typ, why
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string()}
    types["list<int32>"] = pa.list_(pa.int32())
    t = pq.read_table(made["cost"])
    meta = t.schema.metadata
    if value == "DUP":
        value, why = t.column("sample_id")[1].as_py(), "more than once"
    bad = _with_row0(t, column, value, types[typ]).replace_schema_metadata(meta)
    pq.write_table(bad, tmp_path / "bad.parquet")
    code = main(["balance", str(tmp_path / "bad.parquet"), "--dp", "4", "-o", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert code == 2 and why in err and "bad.parquet" in err and "rows [0" in err, err
    # refused before any plan is written (the repeated ids are checked beside the build)
    assert not (tmp_path / "p" / "plan.parquet").exists()


def test_inspect_names_what_the_costs_were_measured_with(made):
    """The generation describes its prep settings: inspect prints the policy, template and
    tokenizer (with its digest) that prep recorded, and --json carries them whole."""
    import hashlib

    out = subprocess.run(
        [sys.executable, "-m", "equishard", "inspect", str(made["gen"])],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    tok = made["demo"] / "tokenizer.json"
    digest = hashlib.sha256(tok.read_bytes()).hexdigest()
    assert "measured with: vision policy internvl:" in out.stdout
    assert "template chatml (" in out.stdout
    assert f"tokenizer {tok.resolve()} (sha256 {digest[:12]})" in out.stdout
    info = json.loads(
        subprocess.run(
            [sys.executable, "-m", "equishard", "inspect", str(made["gen"]), "--json"],
            capture_output=True,
            text=True,
        ).stdout
    )
    assert info["prep"]["tokenizer"]["sha256"] == digest
    assert info["prep"]["vision_policy"]["spec"].startswith("internvl:")


@pytest.mark.parametrize(
    "command",
    [
        ["merge", "{fifo}", "-o", "{out}/m.parquet"],
        ["balance", "{fifo}", "--dp", "2", "-o", "{out}/p"],
        ["write", "{out}/plan", "--cost-table", "{fifo}", "--out", "{out}/g"],
    ],
    ids=["merge", "balance", "write"],
)
def test_a_fifo_given_as_a_table_is_refused_not_read(tmp_path, command):
    """Opening a FIFO waits for a writer: a cost table path that names one blocked merge and
    balance forever (bug: the command hung; write said it did not exist). Refused at once,
    naming it, exit 2."""
    fifo = tmp_path / "cost.parquet"
    os.mkfifo(fifo)
    (tmp_path / "plan").mkdir()  # write's plan: files that exist (checked first)
    for name in ("plan.parquet", "report.json"):
        (tmp_path / "plan" / name).write_text("")
    args = [a.format(fifo=fifo, out=tmp_path) for a in command]
    r = subprocess.run(
        [sys.executable, "-m", "equishard", *args], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r.stderr
    assert "not a regular file" in r.stderr and str(fifo) in r.stderr


def _model_dir_with(tmp: Path, name: str) -> Path:
    d = tmp / "model"
    d.mkdir()
    os.mkfifo(d / name)
    return d


NAMED_FILES = {
    # what a user names: a template file, a model directory whose template or config is a
    # FIFO, a tokenizer, a calibration; each blocked its command forever (reading a FIFO waits
    # for a writer) or read a file of any size whole
    "template .jinja": (lambda t: _fifo(t / "t.jinja"), "prep", "--template"),
    "template dir's chat_template.jinja": (
        lambda t: _model_dir_with(t, "chat_template.jinja"),
        "prep",
        "--template",
    ),
    "template dir's tokenizer_config.json": (
        lambda t: _model_dir_with(t, "tokenizer_config.json"),
        "prep",
        "--template",
    ),
    "template JSON of 2 GB": (lambda t: _sparse(t / "t.jinja", 2 << 30), "prep", "--template"),
    "tokenizer": (lambda t: _fifo(t / "tokenizer.json"), "prep", "--tokenizer"),
    "calibration": (lambda t: _fifo(t / "cal.json"), "balance", "--calibration"),
    "calibration of 2 GB": (lambda t: _sparse(t / "cal.json", 2 << 30), "balance", "--calibration"),
}


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # no disk used: its size alone is refused
    return path


@pytest.mark.parametrize("case", NAMED_FILES, ids=list(NAMED_FILES))
def test_a_named_file_that_is_no_regular_file_is_refused_not_read(made, tmp_path, case):
    """Refused at once naming the file, exit 2 (bug: prep --template x.jinja and
    balance --calibration hung forever on a FIFO; a template or calibration of any size was
    read whole)."""
    make, command, flag = NAMED_FILES[case]
    bad = make(tmp_path)
    tok, jl = str(made["demo"] / "tokenizer.json"), str(made["demo"] / "demo.jsonl")
    args = {
        "prep": ["prep", jl, "--tokenizer", tok, "-o", str(tmp_path / "c.parquet")],
        "balance": ["balance", str(made["cost"]), "--dp", "2", "-o", str(tmp_path / "p")],
    }[command]
    args = [a for a in args if not (flag == "--tokenizer" and a in ("--tokenizer", tok))]
    r = subprocess.run(
        [sys.executable, "-m", "equishard", *args, flag, str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and bad.name in r.stderr
    assert "not a regular file" in r.stderr or "bytes, more than" in r.stderr


@pytest.mark.parametrize("name", ["data.jsonl", "data.json", "data.parquet", "data.tar"])
def test_an_input_that_is_no_regular_file_is_refused_not_read(made, tmp_path, name):
    """prep's inputs are named files too: a FIFO given as an input blocked the scan forever."""
    bad = _fifo(tmp_path / name)
    tok = str(made["demo"] / "tokenizer.json")
    r = subprocess.run(
        [sys.executable, "-m", "equishard", "prep", str(bad), "--tokenizer", tok, "-o",
         str(tmp_path / "c.parquet")],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "not a regular file" in r.stderr and name in r.stderr


def test_write_refuses_a_missing_image_size_inside_a_row(made, tmp_path, capsys):
    """A null inside a row's image_widths (balance reads only the required columns) went into
    the sample's document, which every reader then refused: a generation nobody could read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(made["cost"])
    meta = t.schema.metadata
    row = next(i for i, n in enumerate(t.column("num_images").to_pylist()) if n)
    widths = t.column("image_widths").to_pylist()
    widths[row] = [None] * len(widths[row])
    bad = t.set_column(
        t.schema.get_field_index("image_widths"),
        "image_widths",
        pa.array(widths, pa.list_(pa.int32())),
    ).replace_schema_metadata(meta)
    pq.write_table(bad, tmp_path / "bad.parquet")
    argv = ["write", str(made["plan"]), "--cost-table", str(tmp_path / "bad.parquet")]
    assert main([*argv, "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert "image_widths holds a missing value" in err and "bad.parquet" in err
    assert not (tmp_path / "g" / "CURRENT").exists()


def test_a_full_disk_during_write_is_exit_1_naming_the_root(made, tmp_path, capsys, monkeypatch):
    """ENOSPC while a shard is written: a failure while working (exit 1, not the bad-argument
    2), one line naming where it was writing (the OSError itself names no file)."""
    import shards.write.stream_writer as sw
    from tests.shards.full_disk import FullDisk

    real_init = sw._ShardFile.__init__

    def init(self, path, *args):
        real_init(self, path, *args)
        self.f = FullDisk(self.f)

    monkeypatch.setattr(sw._ShardFile, "__init__", init)
    out = tmp_path / "full"
    code = main(["write", str(made["plan"]), "--cost-table", str(made["cost"]), "--out", str(out)])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == 1 and len(err) == 1, err
    assert "No space left on device" in err[0] and str(out) in err[0]


@pytest.mark.parametrize(
    ("argv", "usage", "hint"),
    [
        (
            ["balance", "c.parquet", "--dp", "2", "-o", "p", "--q-tt", "5"],
            "equishard balance",
            "--q-t",
        ),
        (
            ["balance", "c.parquet", "--dp", "2", "-o", "p", "--seeed=5"],
            "equishard balance",
            "--seed",
        ),
        (["verify", "gen", "--fasst"], "equishard verify", "--fast"),
        (
            ["prep", "d.jsonl", "-o", "c.parquet", "--tokeniser", "t.json"],
            "equishard prep",
            "--tokenizer",
        ),
    ],
)
def test_a_mistyped_option_names_the_subcommand_and_what_it_may_have_meant(
    argv, usage, hint, capsys
):
    """Before, argparse printed the top-level usage and no suggestion."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: {usage}" in err and "usage: equishard [-h] [--version]" not in err
    wrong = next(a for a in argv if a.startswith("--") and a.split("=")[0] not in ("--dp",))
    assert f"{wrong.split('=')[0]}: did you mean {hint}" in err


def test_an_argument_nothing_resembles_gets_no_suggestion(capsys):
    with pytest.raises(SystemExit):
        main(["verify", "gen", "--zzzzzz", "extra"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzz extra" in err and "did you mean" not in err
