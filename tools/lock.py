"""The install lock (``constraints.txt``): every package the README's two commands install, at
the version the suite last passed with.

    python tools/lock.py write constraints.txt   # pin what this environment has (make lock)
    python tools/lock.py diff constraints.txt    # what this environment has that the lock lacks
    python tools/lock.py check constraints.txt   # exit 1 unless equishard[dev]'s closure is pinned

``make test-latest`` installs the newest releases into ``.venv-latest`` and runs ``diff`` there,
so a new release elsewhere is met on purpose, not by a submission's CI.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

HEADER = """\
# The install lock: every package `make shards` and `make test` install (equishard[dev] and what
# it pulls in), at the versions the suite last passed with. The Makefile and CI install with
# `-c constraints.txt`; update on purpose: `make test-latest` (newest releases, what changed),
# then `make lock` once they pass. torch is the CPU build (the local +cpu label is not pinned).
"""
# installed by the virtual environment itself, never by our install
_OWN = {"pip", "equishard"}


def read_lock(path: Path) -> dict[str, str]:
    pins = {}
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise SystemExit(f"{path}:{n}: not a 'name==version' pin: {raw!r}")
        pins[canonicalize_name(name)] = version.strip()
    return pins


def installed() -> dict[str, str]:
    out = {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        if name and name not in _OWN:
            out[name] = dist.version
    return out


def closure(root: str = "equishard", extras: tuple[str, ...] = ("dev",)) -> set[str]:
    """Every distribution ``root[extras]`` requires, transitively, under this interpreter's
    markers (the packages an install of it takes)."""
    seen: set[str] = set()
    todo = [(canonicalize_name(root), set(extras))]
    done: set[tuple[str, frozenset]] = set()
    while todo:
        name, want = todo.pop()
        key = (name, frozenset(want))
        if key in done:
            continue
        done.add(key)
        seen.add(name)
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # a marker-less optional the environment lacks: check() reports it
        for raw in reqs:
            req = Requirement(raw)
            envs = [{**default_environment(), "extra": e} for e in (want or {""})]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((canonicalize_name(req.name), set(req.extras)))
    return seen - _OWN


def public(version: str) -> str:
    return Version(version).public


def write(path: Path) -> None:
    pins = {n: public(v) for n, v in installed().items()}
    lines = [f"{n}=={pins[n]}" for n in sorted(pins)]
    Path(path).write_text(HEADER + "\n".join(lines) + "\n")
    print(f"{path}: {len(lines)} pins")


def diff(path: Path) -> int:
    lock, have = read_lock(path), {n: public(v) for n, v in installed().items()}
    changed = [(n, lock[n], have[n]) for n in sorted(have) if n in lock and lock[n] != have[n]]
    new = sorted(set(have) - set(lock))
    gone = sorted(set(lock) - set(have))
    for n, old, now in changed:
        print(f"changed  {n}: {old} -> {now}")
    for n in new:
        print(f"new      {n}=={have[n]}")
    for n in gone:
        print(f"gone     {n} (locked {lock[n]})")
    print(f"{len(changed)} changed, {len(new)} new, {len(gone)} gone against {path}")
    return len(changed) + len(new) + len(gone)


def check(path: Path) -> list[str]:
    """Problems: a package of equishard[dev]'s closure that the lock does not pin, or that this
    environment has at another version than the lock's."""
    lock, have = read_lock(path), installed()
    problems = []
    for name in sorted(closure()):
        if name not in lock:
            problems.append(f"{name} is installed by equishard[dev] but not pinned in {path}")
        elif name not in have:
            problems.append(f"{name} is pinned ({lock[name]}) but not installed")
        elif public(have[name]) != lock[name]:
            problems.append(f"{name} {have[name]} installed, {path} pins {lock[name]}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["write", "diff", "check"])
    ap.add_argument("lock", type=Path)
    a = ap.parse_args(argv)
    if a.action == "write":
        write(a.lock)
        return 0
    if a.action == "diff":
        diff(a.lock)
        return 0
    problems = check(a.lock)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
