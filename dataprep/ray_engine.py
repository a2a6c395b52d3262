"""Run a stage's independent pieces of work as Ray tasks (``--engine ray``).

prep measures its work units (record ranges of the inputs) and write its streams (one per plan
rank) in Ray tasks; the driver consumes the results **in submission order**, so what it writes
is the same as a local run's, byte for byte. :func:`ordered_map` keeps a bounded number of tasks
in flight (memory stays flat however long the input), and Ray retries a task whose worker
process or node died (``max_retries``); the task functions are written to be re-run safely
(prep's are pure, write's resume a stream from its finished shards). An exception raised by the
task's own code is not retried: it is deterministic, and is raised in the driver as itself.

Every node must see the paths a task touches (inputs, images, tokenizer, the output's staging
directory): run Ray over a shared file system, or publish to an object store (``shards.storage``).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ENGINES", "RayOptions", "init_ray", "ordered_map"]

ENGINES = ("local", "ray")
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

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ValueError(f"num_cpus must be >= 1 (or None for all), got {self.num_cpus}")


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
            kwargs["num_cpus"] = opts.num_cpus
        ray.init(address=address, **kwargs)
    return ray


def _cause(exc: BaseException) -> BaseException:
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

    it = iter(items)
    pending: deque = deque(submit(x) for _, x in zip(range(inflight), it, strict=False))
    try:
        while pending:
            ref = pending.popleft()
            try:
                result = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                raise _cause(exc) from None
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as exc:
                raise RuntimeError(
                    f"a Ray task of {name or fn.__name__} failed {opts.max_retries + 1} times "
                    f"(its worker or node died): {exc}; nothing was published, run again to resume"
                ) from None
            nxt = next(it, _END)
            if nxt is not _END:
                pending.append(submit(nxt))
            yield result
    finally:
        # stopped early (a task's error, the consumer gone): the tasks in flight finish before
        # the error reaches the caller, so that none still writes when it reports or re-runs.
        # Not ray.cancel: cancelling a task as it completes can crash the driver (Ray's "Check
        # failed ... Tried to complete task that was not pending", ray-project/ray#54846, seen
        # here with ray 2.60), which would replace the task's own error with Ray's abort.
        if pending:
            ray.wait(list(pending), num_returns=len(pending))


_END = object()
