"""BENCHMARKS.md is what ``make bench`` writes from the stored results (bench/results/*.json):
a section edited by hand only in the file (as the GPU runs once were) is lost the next time
anyone runs ``make bench``, so it must be in the stored results too."""

from __future__ import annotations

import json
from pathlib import Path

from bench.run import BENCHMARKS, HERE, render

ROOT = Path(__file__).resolve().parent.parent


def test_benchmarks_md_is_rendered_from_the_stored_results():
    results = {
        name: json.loads((HERE / "results" / f"{name}.json").read_text())
        for name in BENCHMARKS
        if (HERE / "results" / f"{name}.json").exists()
    }
    rendered = render(results).splitlines()
    on_disk = (ROOT / "BENCHMARKS.md").read_text().splitlines()
    first = next(
        (k for k, (a, b) in enumerate(zip(rendered, on_disk, strict=False)) if a != b),
        None if len(rendered) == len(on_disk) else min(len(rendered), len(on_disk)),
    )
    assert first is None, (
        f"BENCHMARKS.md differs from render(bench/results) at line {first + 1}: store the "
        "section's text in its bench/results/NAME.json ('markdown') so make bench keeps it"
    )
