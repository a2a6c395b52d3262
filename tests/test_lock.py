"""The install lock (constraints.txt, tools/lock.py): what a fresh clone installs is pinned, so
a new release elsewhere cannot change what the suite runs against (a transformers release
changed a processor helper's meaning and failed every submission's CI)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import lock  # noqa: E402

LOCK = ROOT / "constraints.txt"


def test_every_package_equishard_dev_installs_is_pinned():
    """equishard[dev]'s whole closure under this interpreter is in the lock: a dependency added
    to pyproject.toml without `make lock` fails here (and the Makefile's install stops)."""
    pins = lock.read_lock(LOCK)
    missing = sorted(lock.closure() - set(pins))
    assert not missing, f"not pinned in constraints.txt: {missing}"
    assert pins["torch"] == "2.13.0"  # the CPU build the brief keeps
    # the build backend is pinned too (pip's installs build without isolation, uv's builds are
    # constrained by the lock), and so is the installer itself (tools/install.py)
    assert {"setuptools", "wheel", "uv"} <= set(pins)


def test_the_closure_follows_extras_and_markers():
    """The walk takes a requirement's extras (equishard[dev] -> equishard[hf,...] ->
    transformers) and skips one whose marker this interpreter fails."""
    names = lock.closure()
    assert {"transformers", "moto", "ray", "s3fs", "megatron-energon", "pytest"} <= names
    core = lock.closure(extras=())
    assert "transformers" not in core and "moto" not in core and "numpy" in core


@pytest.mark.parametrize("line", ["torch", "torch>=2", "==1.0", "torch==", "torch = 2"], ids=str)
def test_a_lock_line_that_is_not_a_pin_is_refused_naming_its_line(tmp_path, line):
    p = tmp_path / "c.txt"
    p.write_text(f"# header\nnumpy==2.0\n{line}\n")
    with pytest.raises(SystemExit, match=r"c\.txt:3: not a 'name==version' pin"):
        lock.read_lock(p)


def test_diff_names_every_change(tmp_path, capsys, monkeypatch):
    p = tmp_path / "c.txt"
    p.write_text("numpy==1.0\nold-thing==3\ntorch==2.13.0\n")
    monkeypatch.setattr(
        lock, "installed", lambda: {"numpy": "2.0", "torch": "2.13.0+cpu", "newer": "1"}
    )
    assert lock.diff(p) == 3
    out = capsys.readouterr().out
    assert "changed  numpy: 1.0 -> 2.0" in out
    assert "new      newer==1" in out and "gone     old-thing" in out
    assert "torch" not in out  # a local +cpu label is the same release


def test_check_reports_a_version_off_the_lock(tmp_path, monkeypatch):
    p = tmp_path / "c.txt"
    names = sorted(lock.closure())
    p.write_text("".join(f"{n}==1\n" for n in names))
    have = dict.fromkeys(names, "1")
    have[names[0]] = "2"
    monkeypatch.setattr(lock, "installed", lambda: have)
    assert lock.check(p) == [f"{names[0]} 2 installed, {p} pins 1"]


def test_written_lock_round_trips(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "installed", lambda: {"b-pkg": "1.2+cpu", "a": "3"})
    p = tmp_path / "c.txt"
    lock.write(p)
    assert lock.read_lock(p) == {"a": "3", "b-pkg": "1.2"}


def test_every_install_in_the_makefile_takes_the_lock():
    """Every pip install the README's commands reach goes through $(PIP) (-c constraints.txt);
    only test-latest, which exists to try the newest releases, installs without it."""
    text = (ROOT / "Makefile").read_text()
    targets = re.split(r"\n(?=[A-Za-z$][^\n:=]*:(?!=))", text)
    bare = []
    for block in targets:
        name = block.split(":", 1)[0].strip()
        for line in block.splitlines():
            if (
                "pip install" in line
                and name != "test-latest"
                and not line.lstrip("\t").startswith("PIP ")
            ):
                bare.append((name, line.strip()))
    assert not bare, bare
    assert "$(PIP)" in text and "-c $(LOCK)" in text
