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
* **size**: ``chars`` of rendered text per sample, and of every value a template builds: an
  operation (``*``, ``+``, ``%``, ``**``, ``~``), a filter or a method call whose result would
  print longer (:func:`size_of`: a list holding one long string 1000 times prints 1000 times
  it), or which is given a number above the limit (``center``, ``zfill``, a format's width), is
  refused before it is computed; what a call returns is checked too. Before, such a template
  allocated gigabytes in one step (``'x' | center(10**10)``, ``s.replace('x', s)``, a string
  doubled by ``~``), past the time limit's reach: a MemoryError, or the process killed.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Iterator, Sized
from dataclasses import dataclass

from equishard.common.errors import EquishardError
from equishard.common.values import check_count, check_real

__all__ = [
    "RenderLimits",
    "TemplateLimit",
    "bounded",
    "bounded_call",
    "bounded_range",
    "check_result",
    "check_value",
    "size_of",
    "tick",
]


_SECONDS, _CHARS = 10.0, 4 << 20


class TemplateLimit(EquishardError):
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
        check_real(
            "render limit seconds ($EQUISHARD_TEMPLATE_SECONDS)", self.seconds, 0.0, lo_open=True
        )
        check_count("render limit chars ($EQUISHARD_TEMPLATE_CHARS)", self.chars, 1, 1 << 40)
        check_count("render limit source_chars", self.source_chars, 1, 1 << 40)


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


_DIGIT_BITS = 3.33  # bits a decimal digit holds: a number of more digits than the limit is refused


def _limit() -> int:
    return _BUDGET.limits.chars if _BUDGET.limits else _CHARS


def size_of(value, limit: int | None = None) -> int:
    """About how many characters ``value`` prints as (a walk that stops once past ``limit``, which
    counts a value held twice twice, as printing it does)."""
    if isinstance(value, str):  # the common case, fast
        return len(value)
    limit = _limit() if limit is None else limit
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v)
        elif isinstance(v, bool) or v is None:
            total += 5
        elif isinstance(v, int):
            total += v.bit_length() * 10 // 33 + 2  # digits: bits x log10(2)
        elif isinstance(v, dict):
            total += 2 + 8 * len(v)  # quotes, ": ", ", "
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 + 4 * len(v)  # quotes, ", "
            stack.extend(v)
        else:
            total += 32  # a float, a namespace, a function: printed short
        if len(stack) & 63 == 0:
            tick()
    return total


def check_value(value, what: str) -> None:
    """Refuse a value that would print longer than the limit."""
    limit = _limit()
    if (len(value) if isinstance(value, str) else size_of(value, limit)) > limit:
        raise TemplateLimit(f"{what} builds a value past the {limit}-character limit")


_SPEC_NUMBER = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?|\{[^{}]*:[^{}]*?(\d+)")


def _check_format(fmt: str, args, what: str) -> None:
    """A ``%`` or ``str.format`` format whose widths or precisions ask for more than the limit
    (or take them from the arguments, ``*``), or whose arguments print longer than it."""
    limit = _limit()
    for m in _SPEC_NUMBER.finditer(fmt):
        for n in m.groups():
            if n == "*" or (n and (len(n) > 12 or int(n) > limit)):
                raise TemplateLimit(f"{what} asks for a field of {n} characters (limit {limit})")
    if size_of(fmt, limit) + size_of(args, limit) > limit:
        raise TemplateLimit(f"{what} builds a value past the {limit}-character limit")


def check_result(op: str, left, right) -> None:
    """Refuse an operation whose result would break the size limit before it is computed."""
    tick()
    limit = _limit()
    ints = isinstance(left, int) and isinstance(right, int)
    if op == "**" and ints and right > 0 and left not in (0, 1, -1):
        if left.bit_length() * right > _DIGIT_BITS * limit:
            raise TemplateLimit(
                f"the template raises a number to the power {right}, past the {limit}-character "
                "limit"
            )
    elif op == "*" and ints:
        if left.bit_length() + right.bit_length() > _DIGIT_BITS * limit:
            raise TemplateLimit(f"the template multiplies numbers past the {limit}-digit limit")
    elif op == "*":
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(n, int) and n > 0 and n * size_of(seq, limit) > limit:
            raise TemplateLimit(
                f"the template builds a value of {n} x {size_of(seq, limit)} characters "
                f"(limit {limit})"
            )
    elif op == "+" and not ints:
        if size_of(left, limit) + size_of(right, limit) > limit:
            raise TemplateLimit(f"the template builds a value past the {limit}-character limit")
    elif op == "%" and isinstance(left, str):
        _check_format(left, right, "a % format")


def _int_args(args, kwargs, what: str) -> None:
    limit = _limit()
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > limit:
            raise TemplateLimit(f"{what} was given {a} (limit {limit})")


_MULTIPLYING = frozenset({"replace", "join", "indent"})


def _estimate(name: str, value, args, kwargs) -> int:
    """What a call that may multiply its input prints as, at most (0: nothing to add)."""
    limit = _limit()
    if name == "replace" and isinstance(value, str) and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, str) and isinstance(new, str):
            hits = value.count(old) if old else len(value) + 1
            return len(value) + hits * (len(new) - len(old))
    if name == "join":
        if isinstance(value, str):  # str.join(items)
            sep, items = value, (args[0] if args else ())
        else:  # the join filter: items | join(sep)
            items, sep = value, (args[0] if args else kwargs.get("d", ""))
        n = len(items) if isinstance(items, Sized) else 0
        return size_of(items, limit) + n * size_of(sep, limit)
    if name == "indent" and isinstance(value, str):
        width = args[0] if args else kwargs.get("width", 4)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        return len(value) + (value.count("\n") + 1) * pad
    return 0


def bounded_call(name: str, fn, value, args, kwargs):
    """Call ``fn`` (a filter, or a method of ``value``) after checking its inputs and what it
    would build, then check what it returned."""
    limit = _limit()
    what = f"the template's {name}()"
    _int_args(args, kwargs, what)
    if name in ("format", "format_map") and isinstance(value, str):
        _check_format(value, (args, kwargs), what)
    if (name in _MULTIPLYING and _estimate(name, value, args, kwargs) > limit) or (
        size_of(value, limit) + (size_of((args, kwargs), limit) if args or kwargs else 0) > limit
    ):
        raise TemplateLimit(f"{what} builds a value past the {limit}-character limit")
    out = fn(*args, **kwargs)
    check_value(out, what)
    return out


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
