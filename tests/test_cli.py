"""The equishard command line: help a newcomer can follow, and a real round trip."""

import re
import subprocess
import sys

import pyarrow.parquet as pq

from equishard.cli import main


def test_prep_help_explains_every_option(capsys):
    try:
        main(["prep", "--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for opt in [
        "--tokenizer",
        "--vision-policy",
        "--template",
        "--image-root",
        "--workers",
        "--shard-index",
        "--num-shards",
        "--max-error-rate",
        "internvl",
        "qwen2vl",
        "fixed:S/P",
    ]:
        assert opt in out
    # every policy the spec parser knows has a line of its own in the policies section
    from dataprep.policies import POLICIES

    policies = out.split("vision policies (--vision-policy):")[1].split("examples:")[0]
    for name in POLICIES:
        assert re.search(rf"^  {re.escape(name)}\b|; {re.escape(name)}:", policies, re.M), name


def test_demo_prep_merge_round_trip(tmp_path):
    demo = tmp_path / "demo"
    assert main(["demo", str(demo), "--samples", "60", "--seed", "1", "--images", "10"]) == 0
    args = [str(demo / "demo.jsonl"), "--tokenizer", str(demo / "tokenizer.json"), "--no-progress"]
    assert main(["prep", *args, "-o", str(tmp_path / "c.parquet")]) == 0
    for k in range(2):
        assert (
            main(
                [
                    "prep",
                    *args,
                    "--shard-index",
                    str(k),
                    "--num-shards",
                    "2",
                    "-o",
                    str(tmp_path / f"p{k}.parquet"),
                ]
            )
            == 0
        )
    assert (
        main(
            [
                "merge",
                str(tmp_path / "p1.parquet"),
                str(tmp_path / "p0.parquet"),
                "-o",
                str(tmp_path / "m.parquet"),
            ]
        )
        == 0
    )
    assert pq.read_table(tmp_path / "m.parquet").equals(pq.read_table(tmp_path / "c.parquet"))


def test_console_script_reports_errors_with_nonzero_exit(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "equishard",
            "prep",
            "nope.jsonl",
            "-o",
            str(tmp_path / "c.parquet"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "no tokenizer given" in r.stderr
