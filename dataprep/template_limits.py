"""Limits on rendering someone else's chat template: time and size per sample.

A Jinja template is code from a model repository. The sandbox already blocks escapes (no
attribute access to internals, no file or process access); these limits bound what remains: a
loop nested three deep over ``range``, ``strftime_now`` with a 100 MB format, a string grown by
``*`` or ``+`` to hundreds of megabytes, or simply a render of 300 MB that the tokenizer would
then abort the process on. Each limit, when hit, is that sample's errors row naming the limit
(:class:`TemplateLimit`), and the run goes on.

* **time**: ``seconds`` per render. Checked at every function call, attribute and item lookup,
  arithmetic and ``range`` step the template makes, between output chunks, and (in a process's
  main thread, where Python allows it) by a ``SIGALRM`` timer that interrupts anything else.
* **size**: ``chars`` of rendered text per sample; a ``*`` or ``+`` whose result would be larger,
  or a ``**`` with an exponent above 4096, is refused before it is computed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["RenderLimits", "TemplateLimit", "bounded", "bounded_range", "check_result", "tick"]


_SECONDS, _CHARS = 10.0, 4 << 20


class TemplateLimit(Exception):
    """A chat template went past a render limit (the message names it)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RenderLimits:
    seconds: float = _SECONDS  # per sample's render
    chars: int = _CHARS  # rendered characters per sample (the tokenizer gets at most this)
    source_chars: int = 1 << 20  # template source, checked once where it is compiled

    @classmethod
    def from_env(cls) -> RenderLimits:
        """``$EQUISHARD_TEMPLATE_SECONDS`` and ``$EQUISHARD_TEMPLATE_CHARS`` where set."""
        import os

        try:
            return cls(
                seconds=float(os.environ.get("EQUISHARD_TEMPLATE_SECONDS") or _SECONDS),
                chars=int(os.environ.get("EQUISHARD_TEMPLATE_CHARS") or _CHARS),
            )
        except ValueError as exc:
            raise ValueError(
                f"$EQUISHARD_TEMPLATE_SECONDS / $EQUISHARD_TEMPLATE_CHARS: {exc}"
            ) from None

    def __post_init__(self) -> None:
        if not (0 < self.seconds < float("inf")) or self.chars < 1 or self.source_chars < 1:
            raise ValueError(
                f"render limits must be positive and finite, got seconds={self.seconds}, "
                f"chars={self.chars}, source_chars={self.source_chars}"
            )


class _Budget(threading.local):
    deadline: float = float("inf")
    limits: RenderLimits | None = None
    calls: int = 0


_BUDGET = _Budget()


def tick() -> None:
    """Raise :class:`TemplateLimit` once the current render's time is up (cheap otherwise)."""
    b = _BUDGET
    b.calls += 1
    if b.calls & 63 == 0 and time.monotonic() > b.deadline:
        raise TemplateLimit(
            f"rendering took longer than the {b.limits.seconds:g} s limit per sample"
        )


def check_result(op: str, left, right) -> None:
    """Refuse an operation whose result would break the size limit before it is computed."""
    tick()
    limit = _BUDGET.limits.chars if _BUDGET.limits else RenderLimits().chars
    if op == "**" and isinstance(right, int) and abs(right) > 4096 and left not in (0, 1, -1):
        raise TemplateLimit(f"the template raises a number to the power {right} (limit 4096)")
    sized = (str, bytes, list, tuple)
    if op == "*":
        seq, n = (left, right) if isinstance(left, sized) else (right, left)
        if isinstance(seq, sized) and isinstance(n, int) and len(seq) * n > limit:
            raise TemplateLimit(
                f"the template builds a value of {len(seq) * n} items (limit {limit} characters)"
            )
    if (
        op == "+"
        and isinstance(left, sized)
        and isinstance(right, sized)
        and len(left) + len(right) > limit
    ):
        raise TemplateLimit(f"the template builds a value past the {limit}-character limit")


def bounded_range(*args) -> Iterator[int]:
    """``range`` for templates: at most 100000 items (the sandbox's own limit), each step
    counted against the render's time."""
    r = range(*args)
    if len(r) > 100_000:
        raise TemplateLimit(f"range of {len(r)} items (limit 100000)")
    for i in r:
        tick()
        yield i


@contextlib.contextmanager
def bounded(limits: RenderLimits):
    """The time budget of one render: ticks see the deadline; in the main thread a
    ``SIGALRM`` timer also interrupts code that makes no call (restored afterwards)."""
    b = _BUDGET
    outer = (b.deadline, b.limits)
    b.deadline, b.limits = time.monotonic() + limits.seconds, limits
    use_alarm = threading.current_thread() is threading.main_thread() and hasattr(
        signal, "setitimer"
    )
    outer_timer = (0.0, 0.0)
    if use_alarm:
        outer_timer = signal.getitimer(signal.ITIMER_REAL)
        if outer_timer[0] and outer_timer[0] <= limits.seconds + 1:
            use_alarm = False  # another timer (a test's timeout, say) fires first: it stays
    previous, t0 = None, time.monotonic()
    if use_alarm:

        def _alarm(signum, frame):
            raise TemplateLimit(
                f"rendering took longer than the {limits.seconds:g} s limit per sample"
            )

        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, limits.seconds + 0.5)
    try:
        yield
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if outer_timer[0]:  # the other timer goes on with what it had left
                left = max(outer_timer[0] - (time.monotonic() - t0), 1e-3)
                signal.setitimer(signal.ITIMER_REAL, left, outer_timer[1])
        b.deadline, b.limits = outer
