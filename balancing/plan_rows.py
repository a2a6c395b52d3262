"""A plan's rows, made from its groups when they are needed: one row per sample, in (step, rank)
order, each repeating its group's values. ``build_plan`` keeps the groups' columns and each row's
group; the whole table is made only when asked for (:meth:`PlanRows.table`), and
``write_plan`` writes it a slice of rows at a time (:meth:`PlanRows.write`), so the command never
holds every per-sample column at once: at 10M rows those eleven columns were 0.6 GB of the
command's peak.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from balancing.isf import FLAG_NAMES

__all__ = ["ROWS_PER_SLICE", "PlanRows"]

ROWS_PER_SLICE = 1 << 20  # rows made and written at a time (parquet's default row group)
# dictionaries for the few-valued columns only: the per-group ones repeat in runs, which plain
# encoding and compression take faster (at 10M rows 1.4 s, was 1.8 s; ~4 % larger)
DICTIONARY_COLUMNS = ["group_flag", "node", "local_rank", "rank"]


class PlanRows:
    """``sample_ids``: every row's sample (arrow), ``group_of_row``: its group, rows in plan order
    (a group's rows together); ``per_group``: each column's value for every group; ``schema``:
    the plan's (group ids and the group-flag names added by :meth:`slice`)."""

    __slots__ = ("group_of_row", "per_group", "sample_ids", "schema")

    def __init__(
        self,
        sample_ids: pa.Array | pa.ChunkedArray,
        group_of_row: np.ndarray,
        per_group: dict[str, np.ndarray],
        schema: pa.Schema,
    ) -> None:
        if len(sample_ids) != group_of_row.size:
            raise ValueError(f"{len(sample_ids)} sample ids for {group_of_row.size} rows")
        self.sample_ids = sample_ids
        self.group_of_row = group_of_row
        self.per_group = per_group
        self.schema = schema

    @property
    def num_rows(self) -> int:
        return int(self.group_of_row.size)

    def slice(self, start: int, stop: int) -> pa.Table:
        """Rows ``start`` to ``stop`` of the plan, in the plan's schema."""
        g = self.group_of_row[start:stop]
        cols = {"group_id": g, **{k: x[g] for k, x in self.per_group.items()}}
        cols["group_flag"] = pa.DictionaryArray.from_arrays(
            pa.array(cols["group_flag"], pa.int8()), pa.array(FLAG_NAMES)
        ).cast(pa.string())
        ids = self.sample_ids.slice(start, stop - start)
        return pa.table({"sample_id": ids, **cols}, schema=self.schema)

    def table(self) -> pa.Table:
        """The whole plan in one table (every per-sample column at once)."""
        return self.slice(0, self.num_rows)

    def column_max(self, name: str) -> int | float | None:
        """A per-group column's largest value over the groups that hold rows (None: no rows)."""
        if not self.num_rows:
            return None
        held = np.zeros(next(iter(self.per_group.values())).size, dtype=bool)
        held[self.group_of_row] = True
        return self.per_group[name][held].max().item()

    def write(self, path: str | Path, rows_per_slice: int = ROWS_PER_SLICE) -> None:
        """``plan.parquet`` at ``path``, one row group a slice: the same rows and values as
        ``pq.write_table(self.table(), path)`` with the same encodings."""
        if rows_per_slice < 1:
            raise ValueError(f"rows_per_slice must be at least 1, not {rows_per_slice}")
        with pq.ParquetWriter(path, self.schema, use_dictionary=DICTIONARY_COLUMNS) as writer:
            for start in range(0, max(self.num_rows, 1), rows_per_slice):
                writer.write_table(self.slice(start, min(start + rows_per_slice, self.num_rows)))
