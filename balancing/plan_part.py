"""One partition of a cost table as a worker of a plan over partitions holds it
(:mod:`balancing.partitioned`): its rows' ids and loads, its ISF groups, and its rows of the plan.

A worker reads rows ``start`` to ``stop`` of the table, validates them, and answers the driver in
turn: its loads at the rows that choose the caps (:meth:`PlanPart.sample`), its ISF groups'
statistics and its random batches (:meth:`PlanPart.group`), the samples of its groups the last
step dissolves (:meth:`PlanPart.dissolve`, :meth:`PlanPart.regroup`), then its rows of each slice
of the plan in (step, rank) order (:meth:`PlanPart.order`, :meth:`PlanPart.rows`). The repeated-id
check runs across workers: each sends every id to the worker its hash names
(:meth:`PlanPart.id_buckets`), which finds the repeats among them (:meth:`PlanPart.check_ids`).
No method reads another partition's rows; what a worker holds is its share of the table, about
a tenth of it in its groups, and what one call sends.
"""

from __future__ import annotations

import resource

import numpy as np
import pyarrow as pa

from balancing._kernels.tables import _nb_counting_argsort
from balancing.cost_model import CostModel
from balancing.isf import FLAG_LEFTOVER, FLAG_OVERSIZE, ISFParams, isf_group
from balancing.loads import sample_loads
from balancing.plan_quality import group_stats, random_batches, random_summary
from equishard.common.repeated_ids import _buffers, _one_array, repeated_mask
from equishard.common.repeated_ids_kernel import nb_id_hashes
from equishard.contracts.columns import LLM_TOKENS, VIT_TOKENS
from equishard.contracts.cost_table import iter_cost_rows, table_phases, validate_cost_table
from equishard.contracts.phases import check_balanced, encoder_phases
from equishard.contracts.shared_tower import fold_shared_towers

__all__ = ["LOAD_ROWS", "OVERSIZE_IDS", "PlanPart"]

OVERSIZE_IDS = 20  # oversize samples a report names
LOAD_ROWS = 1 << 16  # rows read, checked and costed at a time


class PlanPart:
    """Rows ``start`` to ``stop`` of the cost table at ``path``, partition ``index``; read and
    checked by :meth:`load`. Methods are called in the order the module describes."""

    def __init__(self, path: str, index: int, start: int, stop: int, cost_model: CostModel) -> None:
        self.path, self.index, self.start, self.stop = path, index, start, stop
        self.cost_model = cost_model

    def load(self) -> dict:
        """Read and check the rows, :data:`LOAD_ROWS` at a time (a chunk's columns are let go
        once its loads are made); their loads. The partition's row count, its encoder phases'
        names, whether it holds media, and each load's sum (the last step weighs its samples by
        the means over all partitions)."""
        n = self.stop - self.start
        # filled chunk by chunk in place: concatenating chunks would hold every array twice
        self.loads: dict[str, np.ndarray] = {}
        self.v = np.empty(n, dtype=np.int64)
        self.t_group = np.empty(n, dtype=np.int64)
        ids = []
        others, media = (), False
        at = 0
        for table in iter_cost_rows(self.path, self.start, self.stop, chunk_rows=LOAD_ROWS):
            b = at + table.num_rows
            where = f"{self.path} (rows {self.start + at}..{self.start + b - 1})"
            table_phases(table, self.path)
            table = fold_shared_towers(table)
            check_balanced(encoder_phases(table.column_names), where)
            validate_cost_table(table, where, repeated_ids=False)
            sl = sample_loads(table, self.cost_model, where)
            others, media = sl.others, sl.has_media
            for k, x in sl.loads.items():
                if k not in self.loads:
                    if at:  # a phase the first chunk did not have: not one table
                        raise ValueError(f"{where}: its columns differ from the rows before")
                    self.loads[k] = np.empty(n, dtype=np.float64)
                self.loads[k][at:b] = x
            ids.append(_one_array(sl.table.column("sample_id")))
            self.v[at:b] = sl.tokens(VIT_TOKENS)
            self.t_group[at:b] = np.maximum(sl.tokens(LLM_TOKENS), 1)  # as build_plan groups
            at = b
            del table, sl
        self.ids = pa.concat_arrays(ids) if len(ids) > 1 else ids[0]
        del ids
        pa.default_memory_pool().release_unused()  # arrow's allocator keeps freed pages
        return {
            "rows": self.stop - self.start,
            "others": [p.name for p in others],
            "has_media": media,
            "sums": {k: float(x.sum()) for k, x in self.loads.items()},
        }

    def sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vision and LLM tokens (as ISF groups them) at the partition's ``rows``."""
        return self.v[rows], self.t_group[rows]

    def group(self, params: ISFParams, seed: int, batch: int, d: int) -> dict:
        """ISF over the partition's samples (seeded by ``seed`` and the partition's index), and
        its random batches of ``batch`` in steps of ``d``: each group's statistics and flag,
        the samples each kind of group holds, the first oversize ids; the random batches'
        summary (``plan_quality.random_summary``)."""
        rng = np.random.default_rng([seed, self.index])
        groups = isf_group(self.v, self.t_group, params, rng)
        del self.v, self.t_group
        self.group_of = groups.group_of.astype(np.int64, copy=False)
        self.n_groups = groups.n_groups
        flag = groups.flags[groups.group_of]
        oversize = np.flatnonzero(flag == FLAG_OVERSIZE)
        stats, _ = random_batches(self.loads, batch, np.random.default_rng([seed + 1, self.index]))
        return {
            "stats": group_stats(self.group_of, self.loads, groups.n_groups),
            "flags": groups.flags,
            "kept_per_round": groups.kept_per_round,
            "oversize": (int(oversize.size), self.ids.take(pa.array(oversize[:OVERSIZE_IDS]))),
            "leftover_samples": int((flag == FLAG_LEFTOVER).sum()),
            "random": random_summary(stats, d),
        }

    def dissolve(self, offset: int, dissolved: np.ndarray) -> dict:
        """Number the partition's groups from ``offset`` (their ids in the whole plan); the
        table rows of the samples of its ``dissolved`` groups (partition-local ids) with their
        loads."""
        held = np.zeros(self.n_groups, dtype=np.bool_)
        held[dissolved] = True
        self.members = np.flatnonzero(held[self.group_of])
        self.group_of += offset
        self.offset = offset
        return {
            "rows": self.start + self.members,
            "loads": {k: x[self.members] for k, x in self.loads.items()},
        }

    def regroup(self, groups: np.ndarray) -> None:
        """The last step's group (plan-wide id) of each sample :meth:`dissolve` gave."""
        self.group_of[self.members] = groups
        del self.members, self.loads

    def order(
        self, slots: np.ndarray, last_slots: np.ndarray, first_last: int, n_slots: int
    ) -> None:
        """Sort the partition's rows by their group's slot (step x D + rank), stably: ``slots``
        of its own groups, ``last_slots`` of the last step's groups (ids from
        ``first_last``), every slot below ``n_slots`` (the plan's steps x D)."""
        own = self.group_of < first_last
        slot = np.empty(self.group_of.size, dtype=np.int64)
        slot[own] = slots[self.group_of[own] - self.offset]
        slot[~own] = last_slots[self.group_of[~own] - first_last]
        self.row_order = _nb_counting_argsort(slot, n_slots)
        self.row_slot = slot[self.row_order]

    def rows(self, first: int, stop: int) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        """The partition's rows in slots ``first`` to ``stop``, in slot order: their ids,
        groups and slots."""
        a, b = np.searchsorted(self.row_slot, [first, stop])
        take = self.row_order[a:b]
        return self.ids.take(pa.array(take)), self.group_of[take], self.row_slot[a:b]

    def id_buckets(self, parts: int) -> list[pa.Array]:
        """The partition's ids sent to ``parts`` workers, each by its hash."""
        offsets, data, _ = _buffers(self.ids)
        bucket = nb_id_hashes(offsets, data) % np.uint64(parts)
        order = _nb_counting_argsort(bucket.astype(np.int64), parts)
        ends = np.searchsorted(bucket[order], np.arange(parts + 1, dtype=np.uint64))
        return [self.ids.take(pa.array(order[ends[j] : ends[j + 1]])) for j in range(parts)]

    def check_ids(self, *buckets: pa.Array) -> list[str]:
        """Up to five ids that repeat among the ``buckets`` (every worker's ids of one hash)."""
        ids = pa.chunked_array(buckets, type=buckets[0].type)
        mask = repeated_mask(ids)
        return ids.filter(pa.array(mask)).unique().to_pylist()[:5] if mask.any() else []

    def peak(self) -> int:
        """This process's peak resident memory in bytes (``ru_maxrss``)."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
