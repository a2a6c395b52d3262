"""tools/install.py: the Makefile's installs go through uv with pip's own indexes, links,
constraints and certificate, or through pip where uv cannot stand in for it.

Bugs caught: an index or a constraints file of pip's configuration not passed to uv (uv would
resolve from PyPI alone, outside the machine's caps: the cap on torch in /etc/xdg/pip is how a
CUDA build is kept out); a setting dropped silently instead of leaving the install to pip; uv's
failure ending the install instead of pip taking it over; a uv from the PATH (another version than
the lock's) used."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import install  # noqa: E402

# `pip config list` on the CI machine (its files and its PIP_* variables)
LISTING = """:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def test_pip_settings_of_the_ci_machine_become_uv_options():
    args, env = install.uv_options(install.pip_settings(LISTING))
    assert args == [
        "--extra-index-url", "https://pypi.org/simple",  # first: its platform wheels taken
        "--find-links", "/opt/wheels",
        "--constraint", "/etc/xdg/pip/constraints.txt",
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/pypi-more/simple",
        "--index-strategy", "unsafe-best-match",
    ]  # fmt: skip
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}


@pytest.mark.parametrize(
    "line, want",
    [
        (
            "global.index-url='https://mirror/simple'",
            ["--extra-index-url", "https://mirror/simple", "--index-url", "https://mirror/simple"],
        ),
        ("global.no-index='true'", ["--no-index"]),
        ("global.no-index='false'", ["--extra-index-url", "https://pypi.org/simple"]),
        ("global.timeout='60'", ["--extra-index-url", "https://pypi.org/simple"]),
    ],
)
def test_each_setting_uv_takes(line, want):
    """pip's main index (PyPI unless set) is passed first: uv takes a version's files from the
    first index that has it, and a mirror's pure wheel of soundfile (no libsndfile) failed
    every test that read a recording."""
    args, _ = install.uv_options(install.pip_settings(line))
    assert args == [*want, "--index-strategy", "unsafe-best-match"]


def test_builds_are_isolated_with_the_locks_setuptools():
    """uv builds in environments of their own, pinned by the lock (a build in the environment
    being installed can import a package half-written into it)."""
    got = install.uv_build_args(
        ["-c", "constraints.txt", "-e", ".[dev]", "--no-build-isolation", "--config-settings",
         "editable_mode=compat"]
    )  # fmt: skip
    assert got == ["-c", "constraints.txt", "-e", ".[dev]", "--config-settings",
                   "editable_mode=compat", "--build-constraints", "constraints.txt"]  # fmt: skip
    assert install.uv_build_args(["-e", "."]) == ["-e", "."]


@pytest.mark.parametrize(
    "line", ["global.trusted-host='mirror'", "global.proxy='http://p:3128'", "install.pre='1'"]
)
def test_a_setting_uv_cannot_take_leaves_the_install_to_pip(line, monkeypatch, tmp_path):
    reason = install.uv_options(install.pip_settings(LISTING + line))
    assert isinstance(reason, str) and line.split(".", 1)[1].split("=")[0] in reason
    calls = _patched(monkeypatch, tmp_path, listing=LISTING + line, uv_rc=0)
    assert install.main(["-e", "."]) == 0
    assert [c[1:4] for c in calls] == [["-m", "pip", "install"]]


def _patched(monkeypatch, tmp_path, listing: str, uv_rc: int, uv: bool = True) -> list:
    """Every command main() starts, recorded; an environment with (or without) its own uv."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if uv:
        (bindir / "uv").write_text("")
    monkeypatch.setattr(install.sys, "executable", str(bindir / "python"))
    calls = []

    def call(cmd, env=None):
        calls.append(cmd)
        return uv_rc if cmd[0].endswith("/uv") else 0

    class Listed:
        returncode, stdout = 0, listing

    monkeypatch.setattr(install.subprocess, "call", call)
    monkeypatch.setattr(install.subprocess, "run", lambda *a, **k: Listed)
    return calls


def test_uv_installs_with_pips_settings(monkeypatch, tmp_path):
    calls = _patched(monkeypatch, tmp_path, LISTING, uv_rc=0)
    assert install.main(["-c", "constraints.txt", "-e", ".[dev]"]) == 0
    (cmd,) = calls
    assert cmd[0] == str(tmp_path / "bin" / "uv") and cmd[1:3] == ["pip", "install"]
    assert cmd[cmd.index("--python") + 1] == str(tmp_path / "bin" / "python")
    assert "--compile-bytecode" in cmd and cmd[-4:] == ["-c", "constraints.txt", "-e", ".[dev]"]
    assert "/etc/xdg/pip/constraints.txt" in cmd and "file:///opt/pypi-more/simple" in cmd


def test_uv_failing_hands_the_install_to_pip(monkeypatch, tmp_path, capsys):
    calls = _patched(monkeypatch, tmp_path, LISTING, uv_rc=2)
    assert install.main(["-e", "."]) == 0
    assert [c[0].endswith("/uv") for c in calls] == [True, False]
    assert calls[1][1:] == ["-m", "pip", "install", "-e", "."]
    assert "uv exited 2" in capsys.readouterr().out


def test_without_the_environments_own_uv_pip_installs(monkeypatch, tmp_path):
    calls = _patched(monkeypatch, tmp_path, LISTING, uv_rc=0, uv=False)
    assert install.main(["-e", "."]) == 0
    assert [c[1:4] for c in calls] == [["-m", "pip", "install"]]


def test_a_key_takes_its_highest_sections_value_as_pip_does():
    """pip reads a key from ``[global]``, then ``[install]``, then its ``PIP_*`` variable, each
    over the one before; another command's section does not apply. Bug caught: every section's
    value passed to uv (an index pip would not use, two ``--index-url``)."""
    listing = """global.index-url='https://a/simple'
:env:.index-url='https://c/simple'
install.index-url='https://b/simple'
install.find-links='/w'
global.find-links='/v'
freeze.exclude='x'
"""
    assert install.pip_settings(listing) == [
        ("index-url", "https://c/simple"),
        ("find-links", "/w"),
    ]
