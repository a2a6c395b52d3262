"""Mutation testing with a maintained tool (cosmic-ray), one module at a time.

    make mutation MODULE=shards/store/current_guard.py       # or: python tools/mutation.py MODULE
    python tools/mutation.py --list                     # the modules and their tests
    python tools/mutation.py --resume /tmp/equishard-cosmic-XXXX  # finish a run that stopped

cosmic-ray plants every mutation its operators make in ``MODULE`` (comparisons, arithmetic,
boolean and unary operators, numbers, ``break``/``continue``, exception handlers, decorators
...), one at a time, in a scratch copy of the repository (the checkout is never touched), and
runs the module's tests (``tests/mutation/modules.toml``) with ``-x``: a mutant is killed when a
test fails. Survivors are listed with their diff; each must be killed by a new test or listed in
``tests/mutation/equivalent.toml`` with the reason it cannot change behaviour. The result goes to
``MUTATION.md`` (one section per module, the others kept): killed / (all - equivalent).

Numba kernels run as plain Python here (``NUMBA_DISABLE_JIT=1``): the same code, so the same
mutants, without recompiling every kernel per mutant; the kernels' agreement with their numba
builds is the suite's own job (tests/balancing/test_kernels_vs_reference.py). A module that holds
no kernel and whose tests run the kernels on real sizes (the plan over partitions) says
``jit = true`` in its entry: its tests run compiled, the kernels built once by the baseline run
and loaded from their cache by every mutant (a mutant there never touches a kernel's source).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tomllib
from mutation_sweep import _scratch  # tools/ is on sys.path beside this file

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "tests" / "mutation"
REPORT = REPO / "MUTATION.md"
TARGET = 0.90


def modules() -> dict[str, dict]:
    return tomllib.loads((CONFIG / "modules.toml").read_text())["modules"]


def equivalents() -> list[dict]:
    return tomllib.loads((CONFIG / "equivalent.toml").read_text()).get("equivalent", [])


def _config(module: str, tests: list[str], timeout: float) -> str:
    cmd = f"{sys.executable} -m pytest -x -q -p no:cacheprovider -p no:randomly " + " ".join(tests)
    return (
        "[cosmic-ray]\n"
        f'module-path = "{module}"\n'
        f"timeout = {timeout}\n"
        "excluded-modules = []\n"
        f'test-command = "{cmd}"\n'
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )


def _cr(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "cosmic-ray"
    return subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True)


RESULTS = CONFIG / "results"


def _source_digest(module: str, root: Path = REPO) -> str:
    return hashlib.sha256((root / module).read_bytes()).hexdigest()


def _key(it: dict) -> tuple:
    return (it["operator"], it["line"], it["occurrence"])


def previous(module: str) -> dict | None:
    """The last run's results of ``module`` (tests/mutation/results/), or None."""
    path = RESULTS / (module.replace("/", "__") + ".json")
    return json.loads(path.read_text()) if path.exists() else None


def _survivors(last: dict) -> set[tuple]:
    """The keys of the mutants ``last`` (a run's results) left alive."""
    return {_key(it) for it in last["items"] if it["outcome"] == "survived"}


def run(module: str, timeout: float | None = None, survivors_only: bool = False) -> dict:
    spec = modules()[module]
    keep = None
    if survivors_only:
        last = previous(module)
        if last is None or last["source_sha256"] != _source_digest(module):
            raise SystemExit(
                f"{module}: --survivors needs a last run of this very source "
                "(tests/mutation/results/); the module changed since, run it whole"
            )
        keep = _survivors(last)
    tests = spec["tests"]
    root = _scratch("equishard-cosmic-")  # the planted-bug sweep's scratch copy
    digest = _source_digest(module, root)  # the source measured (the checkout may move on)
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "PYTHONDONTWRITEBYTECODE": "1",
        "NUMBA_DISABLE_JIT": "0" if spec.get("jit") else "1",
        # tests whose references are slow to compute keep them here for the run's mutants
        # (keyed by what they depend on; tests/trainer_adapter/test_hf_video_inputs.py)
        "EQUISHARD_TEST_CACHE": str(root / "build" / "test-cache"),
    }
    # the baseline's own time sets each mutant's limit (a mutant that loops is a kill)
    t0 = time.perf_counter()
    base = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    took = time.perf_counter() - t0
    if base.returncode != 0:
        raise SystemExit(f"{module}: its tests fail unmutated:\n{base.stdout[-3000:]}")
    (root / "cr.toml").write_text(_config(module, tests, timeout or max(60.0, 4 * took)))
    r = _cr(["init", "cr.toml", "session.sqlite"], root, env)
    if r.returncode != 0:
        raise SystemExit(f"cosmic-ray init failed:\n{r.stderr[-3000:]}")
    skipped = _skip_annotations(root / "session.sqlite", root / module, keep)
    record = {
        "module": module,
        "tests": tests,
        "baseline_s": round(took, 1),
        "source_sha256": digest,
        "source": (root / module).read_text(),  # a run stopped mid-mutant leaves it mutated
        "annotations": skipped,
        "survivors_only": survivors_only,
        "env": {k: env[k] for k in RUN_ENV},
    }
    (root / RUN_RECORD).write_text(json.dumps(record))
    print(f"{module}: mutants running in {root} (resume there with --resume {root})", flush=True)
    return _finish(root, record)


RUN_RECORD = "mutation-run.json"  # in the scratch copy: what --resume needs
RUN_ENV = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "NUMBA_DISABLE_JIT", "EQUISHARD_TEST_CACHE")


def resume(root: Path) -> dict:
    """Run the mutants a stopped run left (its scratch copy ``root``, kept as it stopped:
    cosmic-ray's session records every result as it comes) and finish it as :func:`run`."""
    path = Path(root) / RUN_RECORD
    if not path.is_file():
        raise SystemExit(f"{root}: no {RUN_RECORD} here: not the scratch copy of a mutation run")
    record = json.loads(path.read_text())
    module = record["module"]
    if module not in modules():
        raise SystemExit(f"{root}: {module} is not in tests/mutation/modules.toml")
    source = record["source"].encode()
    if hashlib.sha256(source).hexdigest() != record["source_sha256"]:
        raise SystemExit(f"{path}: the recorded source of {module} is not the one measured")
    # the mutant that ran when the run stopped is still in the file: the measured source back
    (Path(root) / module).write_bytes(source)
    return _finish(Path(root), record)


def _finish(root: Path, record: dict) -> dict:
    """cosmic-ray's exec over the session's pending mutants, then its results as :func:`run`
    returns them (the scratch copy removed)."""
    module, survivors_only = record["module"], record["survivors_only"]
    digest, skipped = record["source_sha256"], record["annotations"]
    env = {**os.environ, **{k: str(record["env"][k]) for k in RUN_ENV}}  # only the run's own
    last = previous(module) if survivors_only else None
    keep = _survivors(last) if last else None
    r = _cr(["exec", "cr.toml", "session.sqlite"], root, env)
    if r.returncode != 0:
        raise SystemExit(f"cosmic-ray exec failed:\n{r.stderr[-3000:]}")
    dump = _cr(["dump", "session.sqlite"], root, env).stdout
    items = []
    source = (root / module).read_text().splitlines()
    for line in dump.splitlines():
        item, result = json.loads(line)
        mutation = item["mutations"][0]
        at = mutation["start_pos"][0]
        items.append(
            {
                "operator": mutation["operator_name"],
                "occurrence": mutation["occurrence"],
                "line": at,
                # the line as it read when mutated: equivalents are keyed by it, so they hold
                # when code above moves the line
                "text": source[at - 1].strip() if 0 < at <= len(source) else "",
                # killed / survived / incompetent; skipped (an annotation), or not run
                "outcome": (result or {}).get("test_outcome")
                or (result or {}).get("worker_outcome")
                or "not run",
                "diff": (result or {}).get("diff", ""),
            }
        )
    shutil.rmtree(root, ignore_errors=True)
    items = [it for it in items if it["outcome"] not in ("not run", "skipped")]
    if keep is not None:  # the rest stand as the last run of this same source left them
        skipped = last["annotations"]
        items += [it for it in last["items"] if _key(it) not in keep]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / (module.replace("/", "__") + ".json")).write_text(
        json.dumps(
            {
                "module": module,
                "source_sha256": digest,
                "annotations": skipped,
                "items": [{k: v for k, v in it.items() if k != "diff"} for it in items],
            },
            indent=0,
        )
    )
    return {
        "module": module,
        "tests": record["tests"],
        "baseline_s": record["baseline_s"],
        "items": items,
        "annotations": skipped,
    }


def _annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where the module's annotations are, when ``from __future__ import annotations`` makes
    them strings never evaluated: a mutant there cannot change behaviour."""
    import ast

    tree = ast.parse(source)
    future = any(
        isinstance(n, ast.ImportFrom)
        and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )
    if not future:
        return []
    spans = []
    for node in ast.walk(tree):
        found = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            args = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
            found = [x.annotation for x in args if x is not None and x.annotation is not None]
            found += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            found = [node.annotation]
        spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in found]
    return spans


def _skip_annotations(session: Path, path: Path, keep: set | None = None) -> int:
    """Mark every mutant inside an annotation as skipped before it runs; how many. With
    ``keep`` (the last run's survivors), every other mutant is skipped too."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    spans = _annotation_spans(path.read_text())
    n = 0
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in db.work_items:
            m = item.mutations[0]
            pos = tuple(m.start_pos)
            again = keep is None or (m.operator_name, m.start_pos[0], m.occurrence) in keep
            if any(lo <= pos < hi for lo, hi in spans) or not again:
                db.set_result(
                    item.job_id,
                    WorkResult(worker_outcome=WorkerOutcome.SKIPPED),
                )
                n += 1
    return n


def _is_equivalent(module: str, item: dict, eqs: list[dict], lines: list[str]) -> str | None:
    """The reason ``item`` is listed as equivalent, or None. An entry names its module and
    operator (globs: ``balancing/_kernels/*.py``, ``core/ReplaceBinaryOperator_*``) and the
    line mutated: by its ``source`` (the stripped line, exactly; with ``nth``, the index of
    this operator's mutant among those on that line, left to right), by its ``text`` (a glob
    of the stripped line: a mutant of every line that reads so, e.g. every kernel's
    ``@njit(cache=True*``), or by its ``line`` number (with an ``occurrence``). The line's text
    is the one the item recorded when it ran (``text``), else the module's line now."""
    from fnmatch import fnmatchcase

    here = item.get("text")
    if here is None:
        here = lines[item["line"] - 1].strip() if 0 < item["line"] <= len(lines) else None
    for e in eqs:
        if not (fnmatchcase(module, e["module"]) and fnmatchcase(item["operator"], e["operator"])):
            continue
        if "source" in e:
            if here == e["source"] and e.get("nth", item.get("nth")) == item.get("nth"):
                return e["reason"]
        elif "text" in e:
            if here is not None and fnmatchcase(here, e["text"]):
                return e["reason"]
        elif (
            e["line"] == item["line"]
            and e.get("occurrence", item["occurrence"]) == item["occurrence"]
        ):
            return e["reason"]
    return None


def number_on_lines(items: list[dict]) -> None:
    """Give each item its ``nth``: its index among the mutants of its operator on its line, in
    the order of their occurrence (left to right)."""
    by_line: dict[tuple, list[dict]] = {}
    for it in items:
        by_line.setdefault((it["operator"], it["line"]), []).append(it)
    for group in by_line.values():
        for k, it in enumerate(sorted(group, key=lambda it: it["occurrence"])):
            it["nth"] = k


def summarize(res: dict) -> dict:
    eqs = equivalents()
    path = REPO / res["module"]
    lines = path.read_text().splitlines() if path.exists() else []
    killed = survived = equivalent = incompetent = 0
    survivors = []
    number_on_lines(res["items"])
    for it in res["items"]:
        why = _is_equivalent(res["module"], it, eqs, lines)
        if it["outcome"] == "killed":
            killed += 1
        elif it["outcome"] == "incompetent":
            incompetent += 1  # not valid code (cosmic-ray's own check): no test can run
        elif why:
            equivalent += 1
            it["reason"] = why
        else:
            survived += 1
            survivors.append(it)
    total = killed + survived
    return {
        **res,
        "killed": killed,
        "survived": survived,
        "equivalent": equivalent,
        "incompetent": incompetent,
        "score": killed / total if total else 1.0,
        "survivors": survivors,
    }


def render(s: dict) -> str:
    if s["killed"] + s["survived"]:
        score = (
            f"**Score {100 * s['score']:.1f} %** (killed / (killed + survived); target "
            f"{100 * TARGET:.0f} %)."
        )
    else:
        score = (
            "**No mutant to measure**: cosmic-ray's operators change operators, constants "
            "and branches, and this module has none outside its annotations (what it does is "
            "a sequence of calls: its tests check that sequence directly)."
        )
    lines = [
        f"## `{s['module']}`",
        "",
        f"Tests: {', '.join(f'`{t}`' for t in s['tests'])} (baseline {s['baseline_s']} s). "
        f"Mutants: {len(s['items'])}; killed {s['killed']}, survived {s['survived']}, "
        f"equivalent {s['equivalent']}, incompetent {s['incompetent']}; "
        f"{s['annotations']} more in annotations not run (never evaluated). " + score,
        "",
    ]
    eq = [it for it in s["items"] if "reason" in it]
    if eq:
        lines += ["Equivalent (listed in `tests/mutation/equivalent.toml`):", ""]
        lines += [f"- line {it['line']}, {it['operator']}: {it['reason']}" for it in eq]
        lines.append("")
    if s["survivors"]:
        lines += ["Surviving (to kill with a test, or to list as equivalent):", ""]
        for it in s["survivors"]:
            diff = "\n".join(
                x for x in it["diff"].splitlines() if x.startswith(("+", "-")) and x[1:2] != x[:1]
            )
            lines += [f"- line {it['line']}, {it['operator']}:", "", "```diff", diff, "```", ""]
    return "\n".join(lines) + "\n"


_HEAD = """# Mutation testing

Measured with cosmic-ray (`make mutation MODULE=path/to/module.py`, `tools/mutation.py`): each
mutant its operators make in the module, run against the module's tests
(`tests/mutation/modules.toml`). Equivalent mutants are listed with their reason in
`tests/mutation/equivalent.toml`. One section per module, rewritten when it is run again. A run
that stopped (a session's end) is finished with `python tools/mutation.py --resume DIR`, its
scratch copy as the run printed it.
"""


def core_modules() -> list[str]:
    """The modules the suite must hold at the target (``core`` in modules.toml, globs)."""
    return tomllib.loads((CONFIG / "modules.toml").read_text()).get("core", [])


def _summary(body: dict[str, str]) -> str:
    """A table of every measured module's score, then the core modules not measured yet."""
    rows = [
        "| module | score | killed | survived | equivalent | run |",
        "|---|---|---|---|---|---|",
    ]
    for name in sorted(body):
        text = body[name]
        counts = re.search(r"killed (\d+), survived (\d+), equivalent (\d+)", text)
        score = re.search(r"\*\*Score ([\d.]+) %\*\*", text)
        run = re.search(r"Run (\d{4}-\d{2}-\d{2})", text)
        k, sv, eq = counts.groups() if counts else ("?", "?", "?")
        rows.append(
            f"| `{name}` | {score.group(1) + ' %' if score else 'no mutant'} | {k} | {sv} | "
            f"{eq} | {run.group(1) if run else '?'} |"
        )
    files = sorted(
        str(f.relative_to(REPO))
        for pattern in core_modules()
        for f in REPO.glob(pattern)
        if f.name != "__init__.py"
    )
    missing = [f for f in dict.fromkeys(files) if f not in body]
    out = "\n".join(rows) + "\n"
    if missing:
        out += (
            f"\nCore modules not measured yet ({len(missing)}, `core` in "
            "`tests/mutation/modules.toml`): " + ", ".join(f"`{m}`" for m in missing) + ".\n"
        )
    return out


def write_report(s: dict | None = None) -> None:
    """Rewrite MUTATION.md: ``s``'s section (when given) and the summary at the top."""
    text = REPORT.read_text() if REPORT.exists() else _HEAD
    sections = re.split(r"(?m)^(?=## `)", text)
    body = {re.match(r"## `([^`]+)`", x).group(1): x for x in sections[1:]}
    if s is not None:
        body[s["module"]] = render(s)
        stamp = time.strftime("%Y-%m-%d")
        body[s["module"]] = body[s["module"]].replace(
            "\n\n", f"\n\nRun {stamp}, cosmic-ray {_version()}.\n\n", 1
        )
    REPORT.write_text(
        _HEAD.rstrip() + "\n\n" + _summary(body) + "\n" + "".join(body[k] for k in sorted(body))
    )


def _version() -> str:
    from importlib.metadata import version

    return version("cosmic-ray")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("module", nargs="?", help="a module listed in tests/mutation/modules.toml")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--timeout", type=float, help="seconds per mutant (default: 4x baseline)")
    ap.add_argument(
        "--report", action="store_true", help="only rewrite MUTATION.md's summary table"
    )
    ap.add_argument(
        "--survivors",
        action="store_true",
        help="run only the last run's survivors again (the module's source unchanged since)",
    )
    ap.add_argument(
        "--resume",
        type=Path,
        metavar="DIR",
        help="finish a stopped run: its scratch copy, as the run printed it",
    )
    a = ap.parse_args(argv)
    if a.report:
        write_report()
        return 0
    if a.resume:
        res = resume(a.resume)
    elif a.list or not a.module:
        for name, spec in modules().items():
            print(f"{name}: {' '.join(spec['tests'])}")
        return 0
    elif a.module not in modules():
        print(f"{a.module}: not in tests/mutation/modules.toml; add it with its tests")
        return 2
    else:
        res = run(a.module, a.timeout, a.survivors)
    s = summarize(res)
    write_report(s)
    print(render(s))
    return 0 if s["score"] >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
