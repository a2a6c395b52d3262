"""``equishard report --steps``: the page of predicted against measured.

Planted bugs these catch: a persistently slow rank not named, a page that reads another log's
records or drops the ones it cannot draw silently, a command that takes both a generation and
logs (or neither)."""

from __future__ import annotations

import html
import json
import re

import numpy as np

from equishard.cli import main


def _log(path, steps=10, ranks=4, slow=2):
    rng = np.random.default_rng(0)
    lines = []
    for s in range(steps):
        pt = {}
        for name in ("vision", "llm"):
            items = [rng.integers(16, 900, int(rng.integers(1, 5))).tolist() for _ in range(ranks)]
            pred = [float(sum(i)) for i in items]
            secs = [p * 1e-4 * (1.4 if r == slow else 1.0) for r, p in enumerate(pred)]
            pt[name] = {"seconds": secs, "items": items, "predicted": pred}
        lines.append(json.dumps({"step": s, "phase_times": pt}))
    lines.append(json.dumps({"step": 99, "loss": 1.0}))  # a record without phase times
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_page_names_a_persistently_slow_rank(tmp_path, capsys):
    out = tmp_path / "steps.html"
    assert main(["report", "--steps", str(_log(tmp_path / "l.jsonl")), "-o", str(out)]) == 0
    page = out.read_text()
    assert "rank 2 (10 steps)" in page
    assert "10 (1 without phase times)" in page
    assert len(re.findall(r"src='data:image/png;base64,", page)) == 3
    data = json.loads(html.unescape(re.search(r'id="report-data">(.*?)</script>', page).group(1)))
    assert data["persistent_stragglers"] == {"2": 10}
    assert sum(data["attribution"].values()) == 10
    capsys.readouterr()
    log = tmp_path / "l.jsonl"
    assert main(["report", "--steps", str(log), "-o", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["counts"] == {"in": 11, "out": 10, "rejected": 1}  # in = out + rejected


def test_a_generation_or_logs_one_of_them(tmp_path, capsys):
    log = _log(tmp_path / "l.jsonl")
    assert main(["report", str(tmp_path), "--steps", str(log), "-o", str(tmp_path / "x.html")]) == 2
    assert main(["report", "-o", str(tmp_path / "x.html")]) == 2
    assert "one of them" in capsys.readouterr().err
    empty = tmp_path / "e.jsonl"
    empty.write_text(json.dumps({"step": 0, "loss": 1.0}) + "\n")
    assert main(["report", "--steps", str(empty), "-o", str(tmp_path / "x.html")]) == 1
    assert "no step records with phase times (1 without)" in capsys.readouterr().err
