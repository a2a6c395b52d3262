"""Plant known bugs in a scratch copy of the repository and check that the tests catch each one.

The mutants are data, one TOML file per package under ``tests/mutants/``: each replaces one
snippet of one file (the snippet must occur there exactly as written, ``occurrences`` times, 1
unless given, so a mutant that no longer applies is reported instead of silently passing) and
names the tests that must fail. Before any mutant, the same tests run on the unmodified copy and
must pass; a mutant counts as caught when its tests fail (not when a test module fails to
import: the planted code is then broken, reported as such). ``tests/test_mutants.py`` checks, in
``make test``, that every mutant still applies and names tests that exist. A mutant of a numba
module runs with its own empty numba cache: numba checks a cached kernel against its own source
file only, so a kernel inlining a mutated helper of another module would otherwise run unmutated
from the cache (a bug reported missed), or stay mutated in it after the mutant is undone.

    .venv/bin/python tools/mutation_sweep.py            # all, a markdown table at the end
    .venv/bin/python tools/mutation_sweep.py --list
    .venv/bin/python tools/mutation_sweep.py --only detach-encoder,mmscale-identity
    .venv/bin/python tools/mutation_sweep.py --package balancing
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
MUTANTS = REPO / "tests" / "mutants"


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    occurrences: int = 1
    package: str = ""


def load_mutations(folder: Path = MUTANTS) -> list[Mutation]:
    """Every mutant of every ``*.toml`` file in ``folder``, in file then listing order."""
    out = []
    for path in sorted(folder.glob("*.toml")):
        for entry in tomllib.loads(path.read_text())["mutant"]:
            out.append(Mutation(**{**entry, "tests": tuple(entry["tests"])}, package=path.stem))
    return out


def _scratch(prefix: str = "equishard-mutant-") -> Path:
    """A copy of the tracked and untracked-unignored files (no .venv, no build output)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    dst = Path(tempfile.mkdtemp(prefix=prefix))
    for f in filter(None, files):
        src = REPO / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    return dst


def _verdict(returncode: int, tail: str) -> str:
    """A mutant is caught when its tests fail or error while running; pytest's exit code 2
    (interrupted: a test module failed to import) means the planted code itself is broken, which
    proves nothing about the tests."""
    if returncode == 0:
        return "MISSED"
    if returncode == 2 or "during collection" in tail:
        return "BROKEN (the planted code fails at import)"
    return "caught"


def _run_tests(
    root: Path, tests: tuple[str, ...], timeout: float, numba_cache: str | None = None
) -> tuple[int, float, str]:
    """``numba_cache``: a directory for numba's caches in place of the copy's ``__pycache__``."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    if numba_cache is not None:
        env["NUMBA_CACHE_DIR"] = numba_cache
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return 1, time.perf_counter() - t0, "timed out"
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    failed = [x for x in lines if x.startswith(("FAILED ", "ERROR "))]
    tail = lines[-1:] or [""]
    # the failing tests' names too: a baseline failure must say which test failed
    return r.returncode, time.perf_counter() - t0, " | ".join([*failed[:3], tail[0]])


def run_mutant(root: Path, m: Mutation, timeout: float) -> tuple[str, float, str]:
    """Plant ``m`` in the copy at ``root``, run its tests, undo it: (verdict, seconds, tail)."""
    path = root / m.file
    original = path.read_text()
    found = original.count(m.old)
    if found != m.occurrences:
        return f"NOT APPLIED (snippet found {found}x)", 0.0, ""
    path.write_text(original.replace(m.old, m.new))
    # numba checks a cached kernel against its own file only: a kernel that inlines a mutated
    # helper from another module (a heap, a table kernel) would run from the unmutated run's
    # cache (a bug missed), and one compiled with the mutant would stay cached after it is
    # undone (later mutants failing for its bug): a mutant of a numba module compiles into its
    # own, empty cache directory
    scratch_cache = tempfile.mkdtemp(prefix="numba-") if "@njit" in original else None
    try:
        code, secs, tail = _run_tests(root, m.tests, timeout, scratch_cache)
    finally:
        path.write_text(original)
        if scratch_cache is not None:
            shutil.rmtree(scratch_cache, ignore_errors=True)
    return _verdict(code, tail), secs, tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="", help="comma-separated mutation names")
    ap.add_argument("--package", default="", help="only the mutants of tests/mutants/NAME.toml")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per test run")
    args = ap.parse_args(argv)
    mutations = load_mutations()
    chosen = [
        m
        for m in mutations
        if (not args.only or m.name in args.only.split(","))
        and (not args.package or m.package == args.package)
    ]
    if args.list:
        for m in chosen:
            print(f"{m.package:16s} {m.name:32s} {m.what}")
        return 0
    root = _scratch()
    try:
        needed = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        code, secs, tail = _run_tests(root, needed, args.timeout)
        ok = code == 0
        print(f"unmutated copy: {'pass' if ok else 'FAIL'} ({secs:.0f} s) {tail}", flush=True)
        if not ok:
            print("the tests fail without any mutation; fix that first", file=sys.stderr)
            return 2
        rows = []
        for m in chosen:
            verdict, secs, tail = run_mutant(root, m, args.timeout)
            rows.append((m, verdict, secs, tail))
            if not verdict.startswith("NOT APPLIED"):
                print(f"{m.name}: {verdict} ({secs:.0f} s) {tail}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n| mutation | planted bug | result | tests run | seconds |")
    print("|---|---|---|---|---|")
    for m, result, secs, _ in rows:
        tests = ", ".join(t.split("::")[-1] if "::" in t else Path(t).name for t in m.tests)
        print(f"| {m.name} | {m.what} | {result} | {tests} | {secs:.0f} |")
    return 0 if all(r[1] == "caught" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
