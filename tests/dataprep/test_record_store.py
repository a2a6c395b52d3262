"""The writer's look-up of raw samples by location (``input#index``).

Reference: the JSONL file's own lines (``json.loads``), read in any order. Planted bugs this
catches: a record read from the wrong offset, the input reopened for every record (the writer
spent 15 % of its time in ``open``), handles left open after ``close``."""

from __future__ import annotations

import builtins
import io
import json
import random
import tarfile

from dataprep import make_demo
from dataprep.record_store import RecordStore


def test_records_by_location_in_any_order_with_one_open_input(tmp_path, monkeypatch):
    make_demo(tmp_path / "demo", samples=30, seed=1)
    path = str(tmp_path / "demo" / "demo.jsonl")
    lines = [x for x in (tmp_path / "demo" / "demo.jsonl").read_bytes().split(b"\n") if x.strip()]
    opened = []
    real_open = builtins.open

    def counting_open(file, *a, **kw):
        if str(file) == path:
            opened.append(file)
        return real_open(file, *a, **kw)

    monkeypatch.setattr(builtins, "open", counting_open)
    order = list(range(len(lines)))
    random.Random(0).shuffle(order)
    with RecordStore() as store:
        for i in order + order[:5]:
            got = store.get(f"{path}#{i}")
            want = json.loads(lines[i])
            assert got.raw == lines[i] and got.sample_id == want["id"], i
            images = want.get("image") or []
            assert len(got.images) == len([images] if isinstance(images, str) else images)
        assert len(opened) <= 2  # the index once, the records through one kept handle
        handles = list(store._handles.values())
    assert handles and all(f.closed for f in handles)
    assert not store._handles


def test_records_of_many_units_by_location_in_any_order(tmp_path):
    """A JSON array, a Parquet file and a WebDataset tar of 23 records read in units of 4 (six
    units, two kept at a time): every location gives its own record, in any order and again after its unit
    was evicted. Reference: the records as written. Planted bugs this catches: the search for
    a record's unit skipping one (a record in a later unit refused as 'the input changed'),
    a kept unit looked up the wrong way round (the demo's inputs are JSONL, one unit, which
    this path never serves)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [
        {
            "id": f"s{i:03d}",
            "conversations": [
                {"from": "human", "value": f"question {i}"},
                {"from": "gpt", "value": f"answer {i}"},
            ],
        }
        for i in range(23)
    ]
    (tmp_path / "data.json").write_text(json.dumps(records))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "data.parquet", row_group_size=5)
    with tarfile.open(tmp_path / "data.tar", "w") as tf:
        for r in records:
            body = json.dumps(r).encode()
            info = tarfile.TarInfo(f"{r['id']}.json")
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    order = list(range(len(records)))
    random.Random(1).shuffle(order)
    for name in ("data.json", "data.parquet", "data.tar"):
        path = str(tmp_path / name)
        with RecordStore(chunk=4, cached_units=2) as store:
            for i in order + order[::-1]:
                got = store.get(f"{path}#{i}")
                assert got.sample_id == f"s{i:03d}", (name, i)
                assert [t[1] for t in got.turns] == [f"question {i}", f"answer {i}"], (name, i)
