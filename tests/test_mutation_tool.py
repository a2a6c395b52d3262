"""make mutation's own logic (tools/mutation.py): which mutants are skipped as annotations,
how equivalents are counted, and that its configuration names real modules and tests."""

from __future__ import annotations

import sys
from fnmatch import fnmatchcase
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import mutation  # noqa: E402


def test_annotations_are_skipped_only_under_the_future_import():
    src = "from __future__ import annotations\n\ndef f(a: int | None = 1) -> str | None:\n    return a | 2\n"
    spans = mutation._annotation_spans(src)
    assert ((3, 9), (3, 19)) in spans and ((3, 28), (3, 38)) in spans
    assert not any(lo <= (4, 13) < hi for lo, hi in spans)  # the body's | is mutated
    assert mutation._annotation_spans(src.replace("from __future__ import annotations", "")) == []


def test_equivalents_are_counted_apart_and_the_score_is_killed_over_the_rest(monkeypatch):
    eq = [{"module": "m.py", "operator": "op", "line": 3, "reason": "why"}]
    monkeypatch.setattr(mutation, "equivalents", lambda: eq)
    items = [
        {"operator": "op", "line": 3, "occurrence": 0, "outcome": "survived", "diff": ""},
        {"operator": "op", "line": 4, "occurrence": 0, "outcome": "survived", "diff": ""},
        {"operator": "op", "line": 5, "occurrence": 0, "outcome": "killed", "diff": ""},
        {"operator": "op", "line": 6, "occurrence": 0, "outcome": "incompetent", "diff": ""},
    ]
    s = mutation.summarize({"module": "m.py", "tests": [], "baseline_s": 1, "items": items,
                            "annotations": 0})  # fmt: skip
    assert (s["killed"], s["survived"], s["equivalent"], s["incompetent"]) == (1, 1, 1, 1)
    assert s["score"] == 0.5 and [it["line"] for it in s["survivors"]] == [4]
    assert "**Score 50.0 %**" in mutation.render(s)


def test_the_configuration_names_real_modules_and_tests():
    mods = mutation.modules()
    for module, spec in mods.items():
        assert (ROOT / module).is_file(), module
        for t in spec["tests"]:
            assert (ROOT / t.split("::")[0]).is_file(), t
    for e in tomllib.loads((ROOT / "tests/mutation/equivalent.toml").read_text())["equivalent"]:
        named = [m for m in mods if fnmatchcase(m, e["module"])]
        assert named and e["reason"].strip(), e
        if "source" in e:  # a line's exact text: some module it names has that line
            assert any(
                x.strip() == e["source"] for m in named for x in (ROOT / m).read_text().splitlines()
            ), e
        elif "text" in e:  # a line's text (a glob): some module it names has such a line
            assert any(
                fnmatchcase(x.strip(), e["text"])
                for m in named
                for x in (ROOT / m).read_text().splitlines()
            ), e
        else:
            assert 0 < e["line"] <= len((ROOT / e["module"]).read_text().splitlines()), e


def test_an_equivalent_by_text_matches_every_such_line_of_the_modules_it_names(tmp_path):
    lines = ["import x", "@njit(cache=True)", "def f():", "    @njit(cache=True)  ", "y = 1"]
    eq = [
        {
            "module": "balancing/_kernels/*.py",
            "operator": "op",
            "text": "@njit(cache=True)",
            "reason": "why",
        }
    ]

    def item(line, op="op"):
        return {"operator": op, "line": line, "occurrence": 0}

    k = "balancing/_kernels/heap.py"
    assert mutation._is_equivalent(k, item(2), eq, lines) == "why"
    assert mutation._is_equivalent(k, item(4), eq, lines) == "why"
    assert mutation._is_equivalent(k, item(5), eq, lines) is None
    assert mutation._is_equivalent(k, item(2, "other"), eq, lines) is None
    assert mutation._is_equivalent("balancing/steps.py", item(2), eq, lines) is None
    assert mutation._is_equivalent(k, item(99), eq, lines) is None
    glob = [{**eq[0], "text": "@njit(cache=True*"}]
    more = [*lines, "@njit(cache=True, nogil=True)  # a comment"]
    assert mutation._is_equivalent(k, item(6), glob, more) == "why"
    assert mutation._is_equivalent(k, item(1), glob, more) is None
    ops = [{"module": k, "operator": "core/Replace*_Sub_*", "line": 5, "reason": "r"}]
    assert mutation._is_equivalent(k, item(5, "core/ReplaceBinaryOperator_Sub_Add"), ops, lines)
    assert not mutation._is_equivalent(k, item(5, "core/NumberReplacer"), ops, lines)


def test_the_summary_lists_each_measured_module_and_the_core_ones_not_measured(monkeypatch):
    monkeypatch.setattr(
        mutation, "core_modules", lambda: ["balancing/steps.py", "shards/store/*.py"]
    )
    body = {
        "balancing/steps.py": "## `balancing/steps.py`\n\nRun 2026-01-02, cosmic-ray 8.\n\n"
        "Mutants: 9; killed 8, survived 1, equivalent 0, incompetent 0. **Score 88.9 %** (x)\n"
    }
    out = mutation._summary(body)
    assert "| `balancing/steps.py` | 88.9 % | 8 | 1 | 0 | 2026-01-02 |" in out
    assert "`shards/store/publish.py`" in out and "`shards/store/__init__.py`" not in out
    assert "`balancing/steps.py`," not in out.split("not measured yet")[1]


def test_an_equivalent_by_source_holds_when_the_line_moves_and_names_one_mutant_of_it():
    """Keyed by the line's text and the mutant's index on it: lines inserted above (a moved
    import) keep the entry; another mutant of the same operator on the line, or the same text
    after an edit of the line, does not match."""
    eq = [
        {
            "module": "m.py",
            "operator": "op",
            "source": "x = a | b | c",
            "nth": 1,
            "reason": "why",
        }
    ]
    items = [
        {"operator": "op", "occurrence": 7, "line": 10, "text": "x = a | b | c"},
        {"operator": "op", "occurrence": 8, "line": 10, "text": "x = a | b | c"},
        {"operator": "op", "occurrence": 9, "line": 12, "text": "x = a | b"},
    ]
    mutation.number_on_lines(items)
    assert [it["nth"] for it in items] == [0, 1, 0]
    assert [mutation._is_equivalent("m.py", it, eq, []) for it in items] == [None, "why", None]
    moved = [{**it, "line": it["line"] + 3, "occurrence": it["occurrence"] + 2} for it in items]
    mutation.number_on_lines(moved)
    assert [mutation._is_equivalent("m.py", it, eq, []) for it in moved] == [None, "why", None]
    # an item without a recorded text is looked up in the module's lines as they are now
    bare = {"operator": "op", "occurrence": 1, "line": 2, "nth": 1}
    assert mutation._is_equivalent("m.py", bare, eq, ["", "x = a | b | c"]) == "why"
    assert mutation._is_equivalent("m.py", bare, eq, ["", "x = a | b | d"]) is None


def test_a_stopped_run_resumes_from_its_scratch_copy(tmp_path, monkeypatch):
    """--resume DIR: the module's measured source is put back (a run stopped mid-mutant leaves
    the mutant in the file), cosmic-ray's exec runs again in the stopped run's copy with the
    run's own environment, and the results are those of the whole session (the earlier ones
    kept), written as a run writes them; a folder that is no run's copy, or a record whose
    source is not the measured one, is refused."""
    import hashlib
    import json

    import pytest

    with pytest.raises(SystemExit, match=r"no mutation-run\.json here"):
        mutation.main(["--resume", str(tmp_path)])  # the command line's way in, no module named
    module = "dataprep/policies/smolvlm.py"
    root = tmp_path / "run"
    (root / "dataprep" / "policies").mkdir(parents=True)
    source = "a = 1\nb = a + 2\n"
    (root / module).write_text(source.replace("+", "-"))  # stopped with a mutant in place
    env = {k: f"<{k}>" for k in mutation.RUN_ENV}
    digest = hashlib.sha256(source.encode()).hexdigest()
    record = {"module": module, "tests": ["t.py"], "baseline_s": 3.5, "source_sha256": digest,
              "source": source, "annotations": 4, "survivors_only": False, "env": env}  # fmt: skip
    (root / mutation.RUN_RECORD).write_text(json.dumps(record | {"source": "a = 2\n"}))
    with pytest.raises(SystemExit, match="not the one measured"):
        mutation.resume(root)
    (root / mutation.RUN_RECORD).write_text(json.dumps(record))

    def item(line, outcome):
        m = {"operator_name": "core/Op", "occurrence": 0, "start_pos": [line, 0]}
        return json.dumps([{"mutations": [m]}, outcome and {"test_outcome": outcome}])

    calls = []

    def fake_cr(args, cwd, env_):
        calls.append((args[0], cwd, {k: env_[k] for k in mutation.RUN_ENV}))
        assert (cwd / module).read_text() == source  # the measured source, not the mutant
        out = "\n".join([item(1, "killed"), item(2, "survived"), item(2, None)])
        return mutation.subprocess.CompletedProcess(args, 0, out if args[0] == "dump" else "", "")

    monkeypatch.setattr(mutation, "_cr", fake_cr)
    monkeypatch.setattr(mutation, "RESULTS", tmp_path / "results")
    res = mutation.resume(root)
    assert [c[0] for c in calls] == ["exec", "dump"] and all(c[1] == root for c in calls)
    assert all(c[2] == env for c in calls)
    assert [(it["line"], it["outcome"]) for it in res["items"]] == [(1, "killed"), (2, "survived")]
    assert res["items"][1]["text"] == "b = a + 2"
    assert (res["baseline_s"], res["annotations"], res["tests"]) == (3.5, 4, ["t.py"])
    saved = json.loads((tmp_path / "results" / "dataprep__policies__smolvlm.py.json").read_text())
    assert saved["source_sha256"] == digest and len(saved["items"]) == 2
    assert not root.exists()  # the scratch copy removed once its results are kept
