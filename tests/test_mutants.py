"""The mutation sweep's data (``tests/mutants/*.toml``) stays runnable: every planted bug still
applies to the code as it is, leaves a file Python can still compile, and names tests that exist.
A mutant whose snippet moved or whose test was renamed would otherwise be reported only when
someone runs the slow sweep; one whose planted code does not compile (a ``\n`` inside a TOML
literal string stays a backslash and an n) is "caught" by a SyntaxError at import, whatever
the tests check: two such were listed as caught until 2026-11-28."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
from mutation_sweep import load_mutations  # noqa: E402

MUTATIONS = load_mutations()


def test_names_are_unique():
    names = [m.name for m in MUTATIONS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("m", MUTATIONS, ids=lambda m: m.name)
def test_mutant_applies_and_names_existing_tests(m):
    path = REPO / m.file
    assert path.is_file(), f"{m.name}: {m.file} does not exist"
    assert m.file.startswith(m.package.replace(".", "/") + "/") or m.package == "cli", (
        f"{m.name} plants a bug in {m.file} but is listed in tests/mutants/{m.package}.toml"
    )
    found = path.read_text().count(m.old)
    assert found == m.occurrences, (
        f"{m.name}: its snippet occurs {found}x in {m.file} (expected {m.occurrences}); "
        "the code moved: update the mutant in tests/mutants/"
    )
    assert m.old != m.new and m.tests
    if m.file.endswith(".py"):
        try:
            compile(path.read_text().replace(m.old, m.new), m.file, "exec")
        except SyntaxError as exc:
            pytest.fail(
                f"{m.name}: the planted code does not compile ({exc}); a test failing "
                "on it proves nothing"
            )
    for test in m.tests:
        file, _, node = test.partition("::")
        assert (REPO / file).is_file(), f"{m.name}: test file {file} does not exist"
        if node:
            func = node.split("[")[0].split("::")[-1]
            source = (REPO / file).read_text()
            assert re.search(rf"^\s*def {re.escape(func)}\(", source, re.M), (
                f"{m.name}: {file} has no test {func}"
            )


# make test-slow (CI): the planted-bug sweep's own run; make test checks every mutant applies
@pytest.mark.slow
def test_the_sweep_counts_a_failing_test_as_caught_and_a_broken_import_as_nothing(tmp_path):
    """A tiny project run through the sweep's own test runner: a behaviour change its test sees
    is caught, an untested one is missed, and planted code that cannot import is reported
    broken (the planted-SyntaxError mutants listed as caught until 2026-11-28)."""
    from mutation_sweep import _run_tests, _verdict

    (tmp_path / "mod.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "test_mod.py").write_text(
        "from mod import double\n\n\ndef test_double():\n    assert double(3) == 6\n"
    )
    verdicts = {}
    for name, body in {
        "none": "def double(x):\n    return 2 * x\n",
        "behaviour": "def double(x):\n    return 3 * x\n",
        "syntax": "def double(x):\n    return 2 * x\\n\n",
        "import": "raise ImportError('planted')\n",
    }.items():
        (tmp_path / "mod.py").write_text(body)
        code, _, tail = _run_tests(tmp_path, ("test_mod.py",), 60)
        verdicts[name] = _verdict(code, tail)
    assert verdicts["none"] == "MISSED"
    assert verdicts["behaviour"] == "caught"
    assert verdicts["syntax"].startswith("BROKEN") and verdicts["import"].startswith("BROKEN")


# make test-slow (CI): the planted-bug tool's numba path; make test checks every mutant applies
@pytest.mark.slow
def test_a_mutated_numba_helper_is_seen_by_the_kernels_that_inline_it(tmp_path):
    """A cached numba kernel is checked against its own file only: after an unmutated run has
    filled the caches, a bug planted in a helper that another module's kernel inlines ran from
    the stale cache and was reported missed (the indexed heap's two planted bugs, until
    2026-11-29). The sweep's ``run_mutant`` compiles such a mutant into its own cache, and leaves
    the copy's caches as the unmutated code built them."""
    from mutation_sweep import Mutation, _run_tests, run_mutant

    (tmp_path / "helper.py").write_text(
        "from numba import njit\n\n\n@njit(cache=True)\ndef inc(x):\n    return x + 1\n"
    )
    (tmp_path / "kernel.py").write_text(
        "from numba import njit\n\nfrom helper import inc\n\n\n"
        "@njit(cache=True)\ndef twice_inc(x):\n    return 2 * inc(x)\n"
    )
    (tmp_path / "test_kernel.py").write_text(
        "from kernel import twice_inc\n\n\ndef test_it():\n    assert twice_inc(1) == 4\n"
    )
    code, _, _ = _run_tests(tmp_path, ("test_kernel.py",), 120)
    assert code == 0 and list(tmp_path.glob("__pycache__/*.nbi"))  # caches written
    m = Mutation(
        name="inc-by-two",
        what="planted",
        file="helper.py",
        old="return x + 1",
        new="return x + 2",
        tests=("test_kernel.py",),
    )
    (tmp_path / "helper.py").write_text((tmp_path / "helper.py").read_text().replace(m.old, m.new))
    stale, _, _ = _run_tests(tmp_path, m.tests, 120)  # what the sweep ran before
    (tmp_path / "helper.py").write_text((tmp_path / "helper.py").read_text().replace(m.new, m.old))
    assert stale == 0  # numba's behaviour the sweep must work around: the bug ran unseen
    verdict, _, _ = run_mutant(tmp_path, m, 120)
    assert verdict == "caught"
    code, _, _ = _run_tests(tmp_path, m.tests, 120)
    assert code == 0  # undone, and no mutated kernel left in the copy's caches
