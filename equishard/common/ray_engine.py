"""Run a stage's independent pieces of work as Ray tasks (``--engine ray``).

prep measures its work units (record ranges of the inputs) and write its streams (one per plan
rank) in Ray tasks; the driver consumes the results **in submission order**, so what it writes
is the same as a local run's, byte for byte. :func:`ordered_map` keeps a bounded number of tasks
in flight (memory stays flat however long the input), and Ray retries a task whose worker
process or node died (``max_retries``); the task functions are written to be re-run safely
(prep's are pure, write's resume a stream from its finished shards). An exception raised by the
task's own code is not retried: it is deterministic, and is raised in the driver as itself.

Every node must see the paths a task touches (inputs, images, tokenizer, the output's staging
directory): run Ray over a shared file system, or publish to an object store (``shards.store.storage``).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from equishard.common.options import option
from equishard.common.values import check_count, check_task_timeout
from equishard.common.workers import usable_cores

__all__ = [
    "DEFAULT_TASK_TIMEOUT",
    "ENGINES",
    "ENGINE_OPTION",
    "RAY_ADDRESS_OPTION",
    "TASK_TIMEOUT_OPTION",
    "RayOptions",
    "init_ray",
    "ordered_map",
    "task_cause",
]

ENGINES = ("local", "ray")
DEFAULT_TASK_TIMEOUT = 1800.0

# the options of every command that can run on Ray, declared once ({what}: what it runs)
ENGINE_OPTION = option(
    "local: {what} in worker processes on this machine (default); ray: in Ray tasks on a Ray "
    "cluster (needs equishard[ray]; every node must see the input and output paths). --workers "
    "then is the number of tasks at a time (a local cluster gets that many CPUs)",
    choices=ENGINES,
)
RAY_ADDRESS_OPTION = option(
    "the Ray cluster to run on: auto, HOST:PORT or ray://HOST:10001 (default: $RAY_ADDRESS, "
    "else start a local cluster)",
    metavar="ADDR",
)
TASK_TIMEOUT_OPTION = option(
    "a task still running after S seconds counts as stuck (a frozen worker, a hung mount): with "
    "--engine ray it is killed and run again, and after 3 tries the run fails naming it; a "
    "local worker process is killed and the run fails naming it at once (default: 1800; 0: no "
    "limit)",
    metavar="S",
    type=float,
    parse=lambda seconds: seconds or None,  # 0: no limit
)
_HINT = "install Ray with: pip install 'equishard[ray]'"


@dataclass(frozen=True, kw_only=True)
class RayOptions:
    """Where and how to run: ``address`` of a running cluster (``auto``, ``HOST:PORT`` or
    ``ray://HOST:10001``); None starts a local cluster, or joins ``RAY_ADDRESS`` when set.
    ``num_cpus`` caps a local cluster this process starts; ``max_retries`` is how often a task
    whose worker died is run again."""

    address: str | None = None
    num_cpus: int | None = None
    max_retries: int = 3
    # seconds a task may run before it counts as stuck (a frozen worker, a hung mount): it is
    # killed and run again, up to max_retries times, then the run fails naming it; None: no limit
    task_timeout: float | None = DEFAULT_TASK_TIMEOUT

    def __post_init__(self) -> None:
        check_count("max_retries", self.max_retries, 0, 1000)
        check_task_timeout(self.task_timeout)
        check_count("num_cpus (None: all)", self.num_cpus, 1, 1 << 20, none=True)


def init_ray(opts: RayOptions):
    """The ``ray`` module, connected to ``opts.address`` (or a new local cluster); a process
    already connected keeps its connection."""
    try:
        import ray
    except ImportError:
        raise ImportError(f"--engine ray needs the ray package; {_HINT}") from None
    if not ray.is_initialized():
        address = opts.address or os.environ.get("RAY_ADDRESS") or None
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
        if address is None and opts.num_cpus is not None:
            # a local cluster runs on this machine's cores: --workers 1024 there would start
            # a Ray worker (an interpreter, a tokenizer) per task in flight, out of memory
            kwargs["num_cpus"] = min(opts.num_cpus, usable_cores())
        ray.init(address=address, **kwargs)
    return ray


def task_cause(exc: BaseException) -> BaseException:
    """The task's own exception inside Ray's wrapper (``RayTaskError``), else ``exc``."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def ordered_map(
    fn: Callable,
    items: Iterable,
    *,
    opts: RayOptions,
    inflight: int,
    name: str | None = None,
    star: bool = False,
) -> Iterator:
    """``fn(item)`` (``fn(*item)`` with ``star``) for every item as Ray tasks, yielded in item
    order; at most ``inflight`` tasks are submitted and not yet consumed. ``fn`` must be
    importable (a module-level function): the workers import it by reference."""
    if inflight < 1:
        raise ValueError(f"inflight must be >= 1, got {inflight}")
    ray = init_ray(opts)
    remote = ray.remote(fn).options(
        max_retries=opts.max_retries,
        retry_exceptions=False,
        num_cpus=1,
        name=name or fn.__name__,
    )

    def submit(x):
        return remote.remote(*x) if star else remote.remote(x)

    label = name or getattr(fn, "__name__", "task")
    it = iter(items)
    # (ref, item, tries): a stuck task is killed and its item submitted again
    pending: deque = deque([submit(x), x, 1] for _, x in zip(range(inflight), it, strict=False))
    try:
        while pending:
            entry = pending[0]
            try:
                result = ray.get(entry[0], timeout=opts.task_timeout)
            except ray.exceptions.GetTimeoutError:
                ray.cancel(entry[0], force=True)  # a frozen worker is killed, not waited for
                if entry[2] > opts.max_retries:
                    pending.popleft()
                    raise RuntimeError(
                        f"a Ray task of {label} made no progress for {opts.task_timeout:g} s, "
                        f"{entry[2]} times (item {_describe(entry[1])}); a frozen worker or a "
                        "hung mount? nothing was published; raise --task-timeout if the task "
                        "needs longer, or run again to resume"
                    ) from None
                entry[0], entry[2] = submit(entry[1]), entry[2] + 1
                continue
            except ray.exceptions.RayTaskError as exc:
                pending.popleft()
                raise task_cause(exc) from None
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as exc:
                pending.popleft()
                raise RuntimeError(
                    f"a Ray task of {label} failed {opts.max_retries + 1} times "
                    f"(its worker or node died): {exc}; nothing was published, run again to resume"
                ) from None
            pending.popleft()
            nxt = next(it, _END)
            if nxt is not _END:
                pending.append([submit(nxt), nxt, 1])
            yield result
    finally:
        # stopped early (a task's error, the consumer gone): the tasks in flight finish before
        # the error reaches the caller, so that none still writes when it reports or re-runs.
        # Not ray.cancel while they run: cancelling a task as it completes can crash the driver
        # (Ray's "Check failed ... Tried to complete task that was not pending",
        # ray-project/ray#54846, seen here with ray 2.60). Only a task still running after the
        # task timeout is killed (it is stuck, not completing).
        if pending:
            refs = [e[0] for e in pending]
            _, stuck = ray.wait(refs, num_returns=len(refs), timeout=opts.task_timeout)
            for ref in stuck:
                ray.cancel(ref, force=True)


def _describe(item) -> str:
    """A short name of a work item for messages (a work unit's input and records)."""
    if isinstance(item, tuple):
        item = item[-1]
    path = getattr(item, "path", None)
    if path is not None:
        first = getattr(item, "first", 0)
        return f"{path} records {first}..{first + getattr(item, 'count', 0) - 1}"
    if isinstance(item, dict) and "rank" in item:
        return f"stream of rank {item['rank']}"
    return repr(item)[:120]


_END = object()
