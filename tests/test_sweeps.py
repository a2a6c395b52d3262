"""The split of the family sweeps between ``make test`` and ``make test-slow`` (tests/sweeps.py).

Bugs this catches: a family renamed in a sweep while its ``fast`` entry keeps the old name (the
family would leave ``make test`` without a word); a sweep whose ``fast`` set is empty; a family
that is in the sweeps but in none of them in ``make test``; CI that stops running the slow
members (then nothing would gate them)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tests import sweeps
from tests.sweeps import sweep

ROOT = Path(__file__).resolve().parent.parent


def _marks(params) -> dict[str, bool]:
    return {p.id: any(m.name == "slow" for m in p.marks) for p in params}


def test_members_outside_fast_are_slow_and_the_registry_holds_the_split(monkeypatch):
    monkeypatch.setattr(sweeps, "SWEEPS", {})
    params = sweep("s", ["a", "b", "c"], fast=["b"])
    assert _marks(params) == {"a": True, "b": False, "c": True}
    assert [p.values for p in params] == [("a",), ("b",), ("c",)]
    assert dict(sweeps.SWEEPS) == {"s": (("a", "b", "c"), frozenset({"b"}))}
    # tuples are a test's several arguments, named by ids
    params = sweep("t", [("a", 1), ("b", 2)], ids=["a-1", "b-2"], fast=["b-2"])
    assert [p.values for p in params] == [("a", 1), ("b", 2)]
    assert _marks(params) == {"a-1": True, "b-2": False}


@pytest.mark.parametrize(
    ("members", "fast", "ids", "error"),
    [
        (["a", "b"], ["c"], None, r"\['c'\] are not members"),
        (["a", "b"], [], None, "no member runs in make test"),
        (["a", "b"], ["a"], ["x"], "1 ids for 2 members"),
        (["a", "b"], ["x"], ["x", "x"], "or repeated"),
    ],
)
def test_a_split_that_would_drop_a_member_silently_is_refused(
    monkeypatch, members, fast, ids, error
):
    monkeypatch.setattr(sweeps, "SWEEPS", {})
    with pytest.raises(ValueError, match=error):
        sweep("s", members, fast=fast, ids=ids)
    assert not sweeps.SWEEPS


def test_a_name_registered_twice_is_refused(monkeypatch):
    monkeypatch.setattr(sweeps, "SWEEPS", {})
    sweep("s", ["a"], fast=["a"])
    with pytest.raises(ValueError, match="registered twice"):
        sweep("s", ["b"], fast=["b"])


def _sweeping_modules() -> list[str]:
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name != "test_sweeps.py" and re.search(r"\bsweep\(", path.read_text()):
            found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def test_every_family_in_a_sweep_is_in_make_test_through_one_of_them():
    pytest.importorskip("transformers")
    from dataprep.families import FAMILIES

    modules = _sweeping_modules()
    assert len(modules) >= 7, modules  # the sweeps this split was made for
    for name in modules:
        importlib.import_module(name)
    registered = dict(sweeps.SWEEPS)
    assert len(registered) >= 10, sorted(registered)

    def family_of(member: str) -> str | None:
        return next((f for f in FAMILIES if member == f or member.startswith(f + "-")), None)

    swept, fast = set(), set()
    for members, quick in registered.values():
        swept |= {family_of(m) for m in members} - {None}
        fast |= {family_of(m) for m in quick} - {None}
    assert len(swept) >= 18, sorted(swept)  # the image families are all in the sweeps
    assert swept <= fast, f"only in make test-slow: {sorted(swept - fast)}"


def test_ci_runs_the_slow_members_after_make_test():
    lines = [
        ln.strip()
        for ln in (ROOT / ".ci" / "run").read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    assert lines[-2:] == ["make test", "make test-slow"], lines
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r'^test-slow:.*\n\t.*pytest -m "slow"', makefile, re.M), "test-slow"
    assert re.search(r'^test:.*\n\t.*pytest -m "not slow"', makefile, re.M), "test"
