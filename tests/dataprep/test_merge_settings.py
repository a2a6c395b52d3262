"""``merge`` takes its parts' settings and counts from their metadata: read from files, checked
where they enter. Parts count alike when their tokenizer has the same bytes (a copy at another
path on another machine), their template and vision policy the same fields; a part with another
image check is never labelled with the first part's; malformed shard positions or counts are
errors naming the part (planted bugs: a header-checked part merged under a ``decode`` label,
the same tokenizer at another path refused, a KeyError or a wrong total from a damaged part)."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from dataprep import PrepConfig, make_demo, merge_cost_tables, run_prep
from dataprep.errors import DataprepError
from equishard.contracts.cost_table import METADATA_KEY, table_metadata


def _parts(tmp_path, per_part=lambda k: {}):
    demo = tmp_path / "demo"
    if not demo.exists():
        make_demo(demo, samples=24, seed=3, images=6)
    out = []
    for k in range(2):
        p = tmp_path / f"part{k}-{len(list(tmp_path.glob('part*')))}.parquet"
        kw = {"tokenizer": str(demo / "tokenizer.json"), **per_part(k)}
        run_prep(
            PrepConfig(
                inputs=(str(demo / "demo.jsonl"),),
                output=str(p),
                image_root=str(demo),
                shard_index=k,
                num_shards=2,
                **kw,
            )
        )
        out.append(str(p))
    return demo, out


def test_parts_with_another_image_check_are_not_merged(tmp_path):
    _, parts = _parts(tmp_path, lambda k: {"check_images": ("decode", "header")[k]})
    with pytest.raises(DataprepError, match="check_images differs"):
        merge_cost_tables(parts, str(tmp_path / "m.parquet"))


def test_parts_with_the_same_tokenizer_at_another_path_merge(tmp_path):
    demo = tmp_path / "demo"
    make_demo(demo, samples=24, seed=3, images=6)
    copy = tmp_path / "node-b" / "tokenizer.json"
    copy.parent.mkdir()
    shutil.copy(demo / "tokenizer.json", copy)
    _, same = _parts(tmp_path)
    _, moved = _parts(tmp_path, lambda k: {"tokenizer": str(copy)} if k else {})
    merge_cost_tables(same, str(tmp_path / "a.parquet"))
    merge_cost_tables(moved, str(tmp_path / "b.parquet"))
    assert pq.read_table(tmp_path / "b.parquet").equals(pq.read_table(tmp_path / "a.parquet"))
    _, other = _parts(tmp_path, lambda k: {"tokenizer": "estimate:chars_per_token=3"} if k else {})
    with pytest.raises(DataprepError, match="tokenizer, template or vision policy differs"):
        merge_cost_tables(other, str(tmp_path / "c.parquet"))


def _set_meta(path: str, edit) -> None:
    meta = table_metadata(path)
    edit(meta)
    table = pq.read_table(path).replace_schema_metadata({METADATA_KEY: json.dumps(meta)})
    pq.write_table(table, path)


HOSTILE = {
    "shard index a string": lambda m: m["shard"].update(index="1"),
    "shard index negative": lambda m: m["shard"].update(index=-1),
    "shard index past num_shards": lambda m: m["shard"].update(index=2),
    "shard missing": lambda m: m.pop("shard"),
    "count missing": lambda m: m["counts"].pop("written"),
    "count negative": lambda m: m["counts"].update(rejected=-5),
    "count a float": lambda m: m["counts"].update(cached=1.5),
    "counts a list": lambda m: m.update(counts=[1, 2, 3]),
}


@pytest.mark.parametrize("edit", HOSTILE, ids=list(HOSTILE))
def test_malformed_part_metadata_is_an_error_naming_the_part(tmp_path, edit):
    _, parts = _parts(tmp_path)
    _set_meta(parts[1], HOSTILE[edit])
    with pytest.raises(DataprepError, match=parts[1].replace(".", r"\.")):
        merge_cost_tables(parts, str(tmp_path / "m.parquet"))
    assert not (tmp_path / "m.parquet").exists()
