"""The calibration file ``equishard calibrate`` writes and ``balance``, ``rebalance``, ``train``
and :class:`~trainer_adapter.redistribute.RedistributePolicy` read.

::

    {"format": "equishard-calibration", "version": 1,
     "vision": {"alpha": A, "beta": B, "gamma": C},      # seconds per token, per squared
     "llm": {"alpha": A, "beta": B, "gamma": C},         # token, per item
     "audio": {...},                                      # where the run had an audio phase
     "fit": {"vision": {"points": N, "intercept_s": .., "median_rel_error": ..,
                        "p90_rel_error": .., "heldout_median_rel_error": .., ...}, ...},
     "measurements": {"log": "steps.jsonl", "sha256": "...", "steps": [first, last],
                      "warmup": W, "heldout_steps": H},
     "model": "...", "hardware": "...", "software": {"python": .., "numpy": .., ...}}

A hand-written file with only the phases' coefficients (``{"vision": {"alpha", "beta"},
"llm": {...}}``, the form before ``calibrate`` existed) reads as before. Every other key, and
a phase with any field but ``alpha``/``beta``/``gamma``, is refused: the file is a user's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from equishard.common.durable import durable_replace
from equishard.common.local_files import read_small

__all__ = [
    "FORMAT",
    "LIMIT",
    "describe_machine",
    "read_calibration",
    "software_versions",
    "write_calibration",
]

FORMAT, VERSION = "equishard-calibration", 1
LIMIT = 1 << 20  # bytes a calibration file may have
_PHASES = ("vision", "audio", "llm")
_META = ("format", "version", "fit", "measurements", "model", "hardware", "software")


def software_versions() -> dict:
    """The versions a measurement depends on (absent packages left out)."""
    out = {"python": platform.python_version()}
    for pkg in ("numpy", "scipy", "torch", "transformers", "equishard"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def read_calibration(path: str | Path) -> tuple[dict[str, dict], str]:
    """``({phase: {"alpha", "beta"[, "gamma"]}}, digest)`` of a calibration file, its keys
    checked (the values by :class:`~balancing.cost_model.PhaseCost`); ``vision`` and ``llm``
    are required."""
    raw = read_small(path, LIMIT)
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict):
        raise TypeError("not a JSON object")
    unknown = set(data) - set(_PHASES) - set(_META)
    if unknown:
        raise TypeError(f"unknown key(s) {sorted(unknown)}")
    if "format" in data and (data["format"], data.get("version")) != (FORMAT, VERSION):
        raise TypeError(
            f"format {data['format']!r} version {data.get('version')!r}; this equishard reads "
            f"{FORMAT!r} version {VERSION}"
        )
    for name in ("vision", "llm"):
        if name not in data:
            raise KeyError(name)
    costs = {}
    for name in _PHASES:
        if name in data:
            if not isinstance(data[name], dict):
                raise TypeError(f"'{name}' is not an object")
            costs[name] = data[name]
    return costs, hashlib.sha256(raw).hexdigest()


def write_calibration(path: str | Path, fits: dict, meta: dict) -> Path:
    """Write the fitted phases (``{phase: PhaseFit}``, with ``heldout`` errors merged into
    ``meta["fit"]``) and ``meta`` atomically: a reader never sees half a file."""
    doc = {"format": FORMAT, "version": VERSION}
    for name in _PHASES:
        if name in fits:
            doc[name] = fits[name].cost.describe() | {"gamma": fits[name].cost.gamma}
    doc["fit"] = {name: fits[name].describe() | meta.get("fit", {}).get(name, {}) for name in fits}
    for key in ("measurements", "model", "hardware"):
        if key in meta:
            doc[key] = meta[key]
    doc["software"] = meta.get("software") or software_versions()
    out = Path(path)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")  # O_EXCL, no link
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
        durable_replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def describe_machine() -> str:
    """This machine, in words (where the log records no hardware)."""
    return (
        f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, {sys.platform}"
    )
