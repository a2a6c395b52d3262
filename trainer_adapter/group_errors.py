"""One rank's error in a balanced step, raised on every rank of the DP group.

Balancing is collective: every rank must reach every exchange of a step. A rank that raised on
its own (inputs the wrapper refuses, rows that do not match their grids, the module failing on
what it received: an out-of-memory error on the rank that got the big images) would leave the
others waiting in the step's next collective, and their logs would say nothing of the cause:
gloo fails them when the rank's process exits ("connection closed"), NCCL waits for its
timeout (10 minutes by default). So the wrappers catch such an error and take it into a
collective that every rank reaches anyway (the gather of the item tables, the agreement on the
decoder's masks, the agreement on the outputs), and every rank raises :class:`StepRefused`
there with every failing rank's reason: no extra collective, and the ranks stay in step (a loop
that catches :class:`StepRefused` on every rank may skip the batch and go on).
"""

from __future__ import annotations

import torch.distributed as dist

from equishard.common.errors import EquishardError

__all__ = ["StepRefused", "raise_together", "reason_of"]


class StepRefused(EquishardError, ValueError):
    """A rank of the group refused or failed this step of a balanced module; raised on every
    rank with every failing rank's reason (``reasons``: group rank -> reason). On a failing
    rank the original error is the ``__cause__``."""

    def __init__(self, message: str, reasons: dict[int, str]):
        super().__init__(message)
        self.reasons = dict(reasons)


def reason_of(error: BaseException) -> str:
    """How a rank's error reads in the others' logs: a refusal (``ValueError``) by its message,
    any other error with its type (``RuntimeError: CUDA out of memory ...``)."""
    if isinstance(error, ValueError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def raise_together(
    reasons: list[str | None], where: str, cause: BaseException | None = None
) -> None:
    """Raise :class:`StepRefused` if any rank gave a reason (``reasons``: every rank's, by group
    rank, as gathered: every rank calls this with the same list, so all raise or none does).
    ``cause``: this rank's own error, chained."""
    failed = {r: m for r, m in enumerate(reasons) if m is not None}
    if not failed:
        return
    by_reason: dict[str, list[int]] = {}
    for r, m in failed.items():
        by_reason.setdefault(m, []).append(r)
    parts = [
        f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} of {len(reasons)}: {m}"
        for m, rs in by_reason.items()
    ]
    message = f"{where} stopped on every rank of the group; " + " | ".join(parts)
    raise StepRefused(message, failed) from cause


def gather_reasons(reason: str | None, group: dist.ProcessGroup | None) -> list[str | None]:
    """Every rank's reason (None where it has none). Collective; only called when some rank
    has one (known from a collective before it), so a clean step does not pay for it."""
    out: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, reason, group=group)
    return out
