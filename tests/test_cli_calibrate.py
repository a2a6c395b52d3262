"""``equishard calibrate`` on the command line: every refusal is one line with the documented
exit code (2: a bad argument, 1: a failed run, nothing written), every limit at, below and above.

Planted bugs these catch: ``--heldout 1`` accepted (nothing left to fit), a negative warm-up
accepted, a FIFO given as a log read (a hang), a refused fit that still writes a file (a stale
calibration picked up by the next balance), a full disk reported without the path."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from equishard.cli import main


def _log(path, steps=12, ranks=4, seed=0, times=None):
    rng = np.random.default_rng(seed)
    lines = []
    for s in range(steps):
        pt = {}
        for name, (a, b, c) in (("vision", (2e-6, 3e-8, 1e-3)), ("llm", (5e-5, 1e-8, 2e-3))):
            items = [rng.integers(16, 900, int(rng.integers(1, 5))).tolist() for _ in range(ranks)]
            secs = [a * sum(i) + b * sum(x * x for x in i) + c * len(i) for i in items]
            pt[name] = {"seconds": times or secs, "items": items}
        lines.append(json.dumps({"step": s, "phase_times": pt}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(capsys, *args):
    code = main(["calibrate", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        (["--heldout", "1"], "--heldout"),
        (["--heldout", "-0.01"], "--heldout"),
        (["--heldout", "nan"], "--heldout"),
        (["--warmup", "-1"], "--warmup"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(tmp_path, capsys, opts, match):
    code, _, err = _run(capsys, _log(tmp_path / "l.jsonl"), "-o", tmp_path / "c.json", *opts)
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize(("heldout", "warmup"), [("0", "0"), ("0.99", "0"), ("0.25", "2")])
def test_limits_that_are_accepted(tmp_path, capsys, heldout, warmup):
    log = _log(tmp_path / "l.jsonl", steps=400 if heldout == "0.99" else 12)
    code, out, err = _run(
        capsys, log, "-o", tmp_path / "c.json", "--heldout", heldout, "--warmup", warmup
    )
    assert code == 0, err
    assert "wrote" in out and json.loads((tmp_path / "c.json").read_text())["vision"]


def test_a_log_that_is_no_regular_file_is_a_bad_argument(tmp_path, capsys):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    code, _, err = _run(capsys, fifo, "-o", tmp_path / "c.json")
    assert code == 2 and str(fifo) in err and "not a regular file" in err
    code, _, err = _run(capsys, tmp_path / "missing.jsonl", "-o", tmp_path / "c.json")
    assert code == 2 and "missing.jsonl" in err


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("garbage line", "l.jsonl:3: not a JSON record"),
        ("NaN time", "l.jsonl:2 (step 1) phase_times.vision.seconds[0]"),
        ("too few steps", "at least 12 needed"),
        ("times that do not grow", "does not grow with the items"),
    ],
)
def test_a_failed_fit_is_exit_1_and_writes_nothing(tmp_path, capsys, case, match):
    log = tmp_path / "l.jsonl"
    if case == "times that do not grow":
        _log(log, times=[0.5, 0.5, 0.5, 0.5])
    elif case == "too few steps":
        _log(log, steps=4, ranks=2)
    else:
        _log(log)
        lines = log.read_text().splitlines()
        if case == "garbage line":
            lines[2] = "{not json"
        else:
            rec = json.loads(lines[1])
            rec["phase_times"]["vision"]["seconds"][0] = float("nan")
            lines[1] = json.dumps(rec)
        log.write_text("\n".join(lines) + "\n")
    code, _, err = _run(capsys, log, "-o", tmp_path / "c.json")
    assert code == 1 and match in err and "no calibration written" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c.json").exists()


def test_a_full_disk_is_exit_1_naming_the_file(tmp_path, capsys, monkeypatch):
    import balancing.calibration_file as cf

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cf, "durable_replace", full)
    out = tmp_path / "c.json"
    code, _, err = _run(capsys, _log(tmp_path / "l.jsonl"), "-o", out)
    assert code == 1 and str(out) in err and "No space left" in err
    assert not out.exists() and not list(tmp_path.glob(".c.json.*"))  # no temporary left
