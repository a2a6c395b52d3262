"""Write the docs' front-page picture (the report's per-step, per-rank load plot) from a
generation: ``python tools/docs_picture.py build/demo/shards docs/assets/report-loads.png``
(after ``make shards``)."""

from __future__ import annotations

import base64
import io
import sys
from pathlib import Path


def main(generation: str, out: str) -> None:
    import pyarrow.parquet as pq

    from equishard.contracts.cost_table import read_cost_table
    from shards.read.report import _figures
    from shards.store.manifest import open_generation

    m = open_generation(generation)
    files = m.storage
    cost = read_cost_table(io.BytesIO(files.read_bytes("cost.parquet")))
    plan = pq.read_table(io.BytesIO(files.read_bytes("plan.parquet")))
    title, _, uri = next(f for f in _figures(m, plan, cost) if f[0] == "Per-step, per-rank load")
    Path(out).write_bytes(base64.b64decode(uri.split(",", 1)[1]))
    print(f"{out}: {title}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
