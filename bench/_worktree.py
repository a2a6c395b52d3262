"""A checkout of an earlier commit beside this one, and runs alternated between the two: how
the benchmarks measure "this change against the commit before it" in one run, on one machine.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["alternated", "worktree"]


@contextmanager
def worktree(repo: Path, commit: str, path: Path) -> Iterator[Path]:
    """A detached git worktree of ``commit`` at ``path`` for the ``with`` block, removed
    after it whatever happens."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), commit],
        cwd=repo,
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(path)],
            cwd=repo,
            check=False,
            capture_output=True,
        )


def alternated(repeats: int, trees: dict[str, Path]) -> Iterator[tuple[int, str, Path]]:
    """(repeat, name, tree) for every repeat and tree, each tree going first in turn: the
    machine's drift during a run falls on all of them alike."""
    pairs = tuple(trees.items())
    for k in range(repeats):
        for name, tree in pairs if k % 2 == 0 else pairs[::-1]:
            yield k, name, tree
