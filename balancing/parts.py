"""Where the workers of a plan over partitions run (:mod:`balancing.partitioned`): in this process
(:class:`LocalParts`, for tests and for checking a partitioning on one machine) or as Ray actors,
one a partition, spread over a cluster (:class:`RayParts`). Both answer the driver the same way:
a method called on every worker with its own arguments, the answers in partition order; and the
repeated-id check across workers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from balancing.cost_model import CostModel
from balancing.plan_part import PlanPart
from equishard.common.options import option
from equishard.common.ray_engine import (
    DEFAULT_TASK_TIMEOUT,
    ENGINES,
    RAY_ADDRESS_OPTION,
    TASK_TIMEOUT_OPTION,
    RayOptions,
    init_ray,
    task_cause,
)
from equishard.common.values import check_count, check_task_timeout

__all__ = [
    "MAX_PARTITIONS",
    "BalanceEngine",
    "LocalParts",
    "Parts",
    "RayParts",
    "open_parts",
    "partition_bounds",
    "repeated_ids_message",
]

MAX_PARTITIONS = 4096


@dataclass(frozen=True, kw_only=True)
class BalanceEngine:
    """Where ``balance`` plans: in this process, whole (the default) or over ``partitions`` of
    the table; or over partitions on a Ray cluster (``engine="ray"``)."""

    engine: str = field(
        default="local",
        metadata=option(
            "local: plan in this process (default); ray: plan over partitions of the table, "
            "one Ray worker each, spread over a Ray cluster (needs equishard[ray]; every node "
            "must see the cost table): each worker holds its rows, the driver numbers per "
            "group. Over partitions steps are not refined and a table with an audio phase is "
            "refused",
            choices=ENGINES,
        ),
    )
    partitions: int | None = field(
        default=None,
        metadata=option(
            "plan over P partitions of the table's rows, ISF within each (default: none with "
            "--engine local; the cluster's CPUs with --engine ray); the same table, seed and P "
            "give the same plan on either engine",
            metavar="P",
        ),
    )
    ray_address: str | None = field(default=None, metadata=RAY_ADDRESS_OPTION)
    task_timeout: float | None = field(default=DEFAULT_TASK_TIMEOUT, metadata=TASK_TIMEOUT_OPTION)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        check_count("--partitions", self.partitions, 1, MAX_PARTITIONS, none=True)
        check_task_timeout(self.task_timeout)
        if self.ray_address and self.engine != "ray":
            raise ValueError("--ray-address is for --engine ray; add --engine ray or drop it")

    @property
    def partitioned(self) -> bool:
        """Is the plan made over partitions (not whole, in this process)?"""
        return self.engine == "ray" or self.partitions is not None


def partition_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Rows (start, stop) of each of ``parts`` partitions of ``n`` rows: as equal as can be, in
    table order."""
    if not 1 <= parts <= max(n, 1):
        raise ValueError(f"cannot cut {n} rows into {parts} partitions: give 1..{max(n, 1)}")
    cuts = [n * i // parts for i in range(parts + 1)]
    return list(itertools.pairwise(cuts))


def open_parts(engine: BalanceEngine, path: str, n: int, cost_model: CostModel):
    """(the workers, their partitions' row bounds) of a plan of the ``n`` rows at ``path``."""
    if engine.engine == "local":
        bounds = partition_bounds(n, min(engine.partitions, max(n, 1)))
        return LocalParts(path, bounds, cost_model), bounds
    opts = RayOptions(address=engine.ray_address, task_timeout=engine.task_timeout)
    ray = init_ray(opts)
    want = engine.partitions or max(1, int(ray.cluster_resources().get("CPU", 1)))
    bounds = partition_bounds(n, min(want, max(n, 1)))
    return RayParts(path, bounds, cost_model, opts), bounds


def repeated_ids_message(path: str, found: list[list[str]]) -> str | None:
    """The refusal of a table whose ids repeat (``found``: each worker's repeats), or None."""
    ids = [x for got in found for x in got][:5]
    if not ids:
        return None
    return (
        f"{path}: sample_id appears more than once, e.g. {ids}; fix or drop those rows (prep "
        "writes valid tables)"
    )


class Parts:
    """The workers of one plan, one per partition (``specs``: each one's ``PlanPart``
    arguments after the table's path)."""

    def __len__(self) -> int:
        raise NotImplementedError

    def call(self, method: str, args: Sequence[tuple]) -> list:
        """``method(*args[i])`` on worker i, for every worker; their answers in order."""
        raise NotImplementedError

    def repeated_ids(self) -> list[list[str]]:
        """Each worker's repeated ids among those whose hash names it."""
        raise NotImplementedError

    def peaks(self) -> list[int]:
        """Each worker's peak resident memory, in bytes."""
        return self.call("peak", [()] * len(self))

    def close(self) -> None:
        """Let the workers go."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalParts(Parts):
    """Every worker a ``PlanPart`` of this process."""

    def __init__(self, path: str, bounds, cost_model: CostModel) -> None:
        self.parts = [PlanPart(path, i, a, b, cost_model) for i, (a, b) in enumerate(bounds)]

    def __len__(self) -> int:
        return len(self.parts)

    def call(self, method: str, args: Sequence[tuple]) -> list:
        return [getattr(p, method)(*a) for p, a in zip(self.parts, args, strict=True)]

    def repeated_ids(self) -> list[list[str]]:
        k = len(self.parts)
        buckets = [p.id_buckets(k) for p in self.parts]
        return [p.check_ids(*[b[j] for b in buckets]) for j, p in enumerate(self.parts)]


class RayParts(Parts):
    """Every worker a Ray actor, spread over the cluster ``opts`` names (a local one where none);
    an actor that dies fails the plan (nothing is written), a call that outlasts
    ``opts.task_timeout`` too."""

    def __init__(self, path: str, bounds, cost_model: CostModel, opts: RayOptions) -> None:
        self.ray = ray = init_ray(opts)
        self.opts = opts
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        actor = ray.remote(PlanPart).options(
            num_cpus=min(1.0, cpus / len(bounds)),
            max_restarts=0,
            scheduling_strategy="SPREAD",
        )
        self.actors = [actor.remote(path, i, a, b, cost_model) for i, (a, b) in enumerate(bounds)]

    def __len__(self) -> int:
        return len(self.actors)

    def _get(self, refs):
        ray = self.ray
        try:
            return ray.get(refs, timeout=self.opts.task_timeout)
        except ray.exceptions.RayTaskError as exc:
            raise task_cause(exc) from None
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"a worker of balance --engine ray made no progress for "
                f"{self.opts.task_timeout:g} s; nothing was published: raise --task-timeout if "
                "a partition needs longer, or use more partitions"
            ) from None
        except ray.exceptions.RayActorError as exc:
            raise RuntimeError(
                f"a worker of balance --engine ray died ({type(exc).__name__}: out of memory, or "
                "its node lost?); nothing was published: run again, with more partitions if "
                "memory ran out"
            ) from None

    def call(self, method: str, args: Sequence[tuple]) -> list:
        refs = [getattr(a, method).remote(*x) for a, x in zip(self.actors, args, strict=True)]
        return self._get(refs)

    def repeated_ids(self) -> list[list[str]]:
        k = len(self.actors)
        # each worker's ids in k objects: worker j is handed the j-th of every worker's
        sent = [a.id_buckets.options(num_returns=k).remote(k) for a in self.actors]
        sent = [s if k > 1 else [s] for s in sent]
        refs = [a.check_ids.remote(*[s[j] for s in sent]) for j, a in enumerate(self.actors)]
        return self._get(refs)

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
