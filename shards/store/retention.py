"""Retention of a generation root's old generations (docs/nightly.md, "Retention"): which ones
a night removes, by the CURRENT -> parent chain, publish times, and the root's CURRENT history
(manifest times can lie after a rollback, a copy or a fetch). CURRENT is never removed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from equishard.contracts.generation_names import MANIFEST
from shards.store.manifest import load_manifest
from shards.store.publish import read_current, read_history

__all__ = ["collect_generations"]


def _published_at(gen_dir: Path) -> int:
    """When a generation was published: its manifest is written last, just before the rename
    that publishes it, and the rename keeps its mtime."""
    return (gen_dir / MANIFEST).stat().st_mtime_ns


def collect_generations(root: Path, keep: int) -> list[str]:
    """Remove old generations; returns the removed ids. The rule (docs/nightly.md, "Retention"): a
    generation is kept when it is one of the first ``keep`` on the CURRENT -> parent chain, or
    one of the ``keep`` most recently published, or published after the oldest generation kept
    on the chain (so after a rollback of CURRENT, the generations rolled back from stay until
    the chain has moved past them), or CURRENT at any time within the last ``keep`` nights by
    the root's CURRENT history (``CURRENT.history``: manifest times can lie, e.g. after a copy
    or a fetch). CURRENT is never removed."""
    current = read_current(root)
    if current is None:
        return []
    chain, g = [], current
    while g and (root / g / MANIFEST).exists() and g not in chain:
        chain.append(g)
        g = load_manifest(root / g, check_files=False).parent
    complete = {d.name: _published_at(d) for d in root.glob("gen-*") if (d / MANIFEST).exists()}
    on_chain = chain[:keep]
    recent = sorted(complete, key=lambda n: complete[n], reverse=True)[:keep]
    oldest_kept = min(complete[n] for n in on_chain)
    kept = set(on_chain) | set(recent) | {current} | _current_lately(root, keep)
    removed = []
    for name in sorted(complete):
        if name in kept or complete[name] > oldest_kept:
            continue
        d = root / name
        trash = root / f".trash-{name}"
        os.replace(d, trash)  # disappears at once for new readers
        shutil.rmtree(trash, ignore_errors=True)
        (root / "errors" / f"{name}.errors.parquet").unlink(missing_ok=True)
        removed.append(name)
    for t in root.glob(".trash-gen-*"):  # left by a crash during an earlier collection
        shutil.rmtree(t, ignore_errors=True)
    return removed


def _current_lately(root: Path, keep: int) -> set[str]:
    """Every generation that became CURRENT within the last ``keep`` nights by the root's CURRENT
    history (a night's publish, or a move by hand such as a rollback, seen when the next night
    starts), not by manifest times, which a rollback, a copy or a fetch can make lie."""
    night, last, became = 0, None, []
    for event, gen in read_history(root):
        night += event == "night"
        if gen != last:
            became.append((night, gen))
        last = gen
    return {gen for n, gen in became if n > night - keep}
