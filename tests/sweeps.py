"""Sweeps over model families: which members ``make test`` runs, which wait for ``make
test-slow``.

A sweep runs one contract (the packer equals the processor, a balanced step equals one
process's, ...) for every family or architecture. Each member costs seconds (a real processor
on real images, a model in gloo ranks), and all of them together are a third of the suite. So
``make test`` runs a few members of each sweep, chosen to span the routes the code takes, and
marks the rest ``slow``: ``make test-slow`` runs them and CI runs both (``.ci/run``), so every
member is still a gate before anything lands. ``tests/test_sweeps.py`` checks that every
registered family is in ``make test`` through at least one sweep.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

# sweep name -> (every member, the members make test runs); filled as test modules import
SWEEPS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {}


def sweep(name: str, members: Iterable, *, fast: Iterable[str], ids: Iterable[str] | None = None):
    """``members`` as pytest parameters named by ``ids`` (default: the members themselves),
    those whose id is not in ``fast`` marked ``slow``.

    Raises ``ValueError`` for a name registered twice, a ``fast`` id that is not in the sweep
    (a renamed family would otherwise drop out of ``make test`` silently), an empty ``fast``
    (the sweep's contract would not run in ``make test`` at all) or ids that do not name the
    members one to one."""
    members = tuple(members)
    ids = tuple(members if ids is None else ids)
    fast = frozenset(fast)
    if name in SWEEPS:
        raise ValueError(f"sweep {name!r} is registered twice: give each sweep its own name")
    if len(ids) != len(members) or len(set(ids)) != len(ids):
        raise ValueError(f"sweep {name!r}: {len(ids)} ids for {len(members)} members, or repeated")
    if not fast:
        raise ValueError(f"sweep {name!r}: no member runs in make test; name at least one")
    unknown = sorted(fast - set(ids))
    if unknown:
        raise ValueError(f"sweep {name!r}: {unknown} are not members; members: {list(ids)}")
    SWEEPS[name] = (ids, fast)
    slow = pytest.mark.slow
    return [
        pytest.param(*(m if isinstance(m, tuple) else (m,)), id=i, marks=() if i in fast else slow)
        for m, i in zip(members, ids, strict=True)
    ]
