"""Install packages into this interpreter's environment at the lock's versions, with uv when it
is there (pinned in the lock, installed by pip first), else with pip:

    python tools/install.py -c constraints.txt -e ".[dev]" --no-build-isolation ...

uv resolves and installs the same set from the same indexes in well under half pip's time (on
the 2-core CI machine, from an empty cache: 45 s against 110 s for equishard[dev]'s 184
packages, bytecode compiled in both). uv does not read pip's configuration, so the indexes,
links, constraints and certificate that pip would use here (``pip config list``: its files and
its ``PIP_*`` variables) are passed to it; a setting that cannot be passed, or uv failing,
leaves the install to pip with the same arguments. Either way ``tools/lock.py check`` then
checks every version against the lock.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# pip's settings that uv takes, as its options (a value holding several, space-separated, is
# one option each); the others in PASSIVE change nothing uv does
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
PASSIVE = {"default-timeout", "timeout", "disable-pip-version-check", "progress-bar", "cert",
           "no-cache-dir", "cache-dir", "quiet", "verbose", "root-user-action"}  # fmt: skip


# the sections of pip's configuration that apply to an install, lowest precedence first: a
# key's value is its highest section's (another command's section, [freeze], applies to none)
SECTIONS = ("global", "install", ":env:")


def pip_settings(listing: str) -> list[tuple[str, str]]:
    """``pip config list``'s lines (``section.key='value'``, ``:env:`` for a ``PIP_*``
    variable) as the (key, value) pairs an install uses: each key once, with the value of its
    highest-precedence section (a variable over ``[install]`` over ``[global]``), in the order
    keys first appear."""
    found: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        if not sep or "." not in name:
            continue
        section, key = (x.strip() for x in name.rsplit(".", 1))
        if section not in SECTIONS:
            continue
        rank = SECTIONS.index(section)
        if key not in found or rank >= found[key][0]:
            found[key] = (rank, value.strip().strip("'\""))
    return [(key, value) for key, (_, value) in found.items()]


def uv_options(settings: list[tuple[str, str]]) -> tuple[list[str], dict[str, str]] | str:
    """uv's options and environment for pip's settings, or why uv cannot stand in for pip."""
    args: list[str] = []
    env: dict[str, str] = {}
    for key, value in settings:
        if key in OPTIONS:
            for item in value.split():
                args += [OPTIONS[key], item]
        elif key == "cert":
            env["SSL_CERT_FILE"] = value
        elif key == "no-index":
            if value.lower() in ("1", "true", "yes", "on"):
                args.append("--no-index")
        elif key not in PASSIVE:
            return f"pip's setting {key}={value!r} has no uv option here"
    # pip takes the best version and, of that version, the best file over every index it is
    # given; uv takes the best version over them all with this strategy, but a version's files
    # from the first index that has it: pip's main index goes first, so that a version there
    # comes with its platform wheels (a mirror's pure wheel of soundfile lacks libsndfile)
    main = next((v for k, v in settings if k == "index-url"), "https://pypi.org/simple")
    if "--no-index" not in args:
        args = ["--extra-index-url", main, *args]
    return [*args, "--index-strategy", "unsafe-best-match"], env


def uv_build_args(args: list[str]) -> list[str]:
    """pip's arguments for uv, builds isolated: ``--no-build-isolation`` (there so that a build
    takes the lock's setuptools, not the newest) becomes ``--build-constraints`` with each
    constraints file given, which pins the isolated builds' setuptools just as well. A build
    in the environment itself could import packages uv is installing into it at the same
    moment (seen once: an sdist's metadata build failing mid-install)."""
    if "--no-build-isolation" not in args:
        return list(args)
    out, lock = [], []
    for k, arg in enumerate(args):
        if arg == "--no-build-isolation":
            continue
        out.append(arg)
        if k and args[k - 1] in ("-c", "--constraint"):
            lock.append(arg)
    for path in lock:
        out += ["--build-constraints", path]
    return out


def _uv() -> str | None:
    """The environment's own uv (the lock's version), never another one on the PATH."""
    here = Path(sys.executable).parent / "uv"
    return str(here) if here.exists() else None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    pip = [sys.executable, "-m", "pip", "install", *args]
    uv = _uv()
    if uv is None:
        return subprocess.call(pip)
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    found = uv_options(pip_settings(listing.stdout)) if listing.returncode == 0 else "no listing"
    if isinstance(found, str):
        print(f"install: pip ({found})", flush=True)
        return subprocess.call(pip)
    options, env = found
    cmd = [uv, "pip", "install", "--python", sys.executable, "--compile-bytecode", *options,
           *uv_build_args(args)]  # fmt: skip
    rc = subprocess.call(cmd, env={**os.environ, **env})
    if rc:
        print(f"install: uv exited {rc}; installing with pip instead", flush=True)
        return subprocess.call(pip)
    return 0


if __name__ == "__main__":
    sys.exit(main())
