"""Video frames the vision tower runs are balanced as the vision phase's load.

The bugs named: a video's patches left out of the vision encoder's load (a rank given three
10-minute clips looks idle to the planner), a row's sequences joined to another row's (the
list concatenation off by one row), a table whose videos run on an encoder of their own
folded into vision anyway, or balanced with its video phase silently dropped.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from balancing.plan import BalanceConfig, build_plan
from equishard.contracts.cost_table import METADATA_KEY
from equishard.contracts.shared_tower import concat_lists, fold_shared_towers

lists = st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=5), min_size=1, max_size=30)


@given(lists, st.data())
def test_concat_lists_joins_each_row_as_python_does(a, data):
    b = data.draw(
        st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=5), min_size=len(a), max_size=len(a))
    )
    cut = data.draw(st.integers(0, len(a) - 1))
    arr_a = pa.chunked_array(
        [pa.array(a[:cut], pa.list_(pa.int32())), pa.array(a[cut:], pa.list_(pa.int32()))]
    )
    start = data.draw(st.integers(0, len(a) - 1))
    arr_b = pa.array([[0]] * start + b, pa.list_(pa.int32())).slice(start)  # sliced: offset
    got = concat_lists(arr_a, arr_b).to_pylist()
    assert got == [x + y for x, y in zip(a, b, strict=True)]


def _table(tower: str | None, with_video: bool = True) -> pa.Table:
    rng = np.random.default_rng(0)
    n = 64
    vit = [
        [int(x)] * int(k)
        for x, k in zip(rng.integers(100, 1000, n), rng.integers(0, 3, n), strict=True)
    ]
    vid = [
        [int(x)] * int(k)
        for x, k in zip(rng.integers(500, 2000, n), rng.integers(0, 20, n), strict=True)
    ]
    cols = {
        "sample_id": [f"s{i}" for i in range(n)],
        "source": ["x"] * n,
        "num_images": pa.array([len(v) for v in vit], pa.int32()),
        "vit_tokens": pa.array([sum(v) for v in vit], pa.int64()),
        "vit_seq_lens": pa.array(vit, pa.list_(pa.int32())),
        "llm_tokens": pa.array(
            [sum(v) // 4 + sum(w) // 4 + 50 for v, w in zip(vit, vid, strict=True)], pa.int64()
        ),
        "text_tokens": pa.array([50] * n, pa.int64()),
    }
    meta = {"phases": ["vision", "llm"]}
    if with_video:
        cols |= {
            "num_videos": pa.array([1 if v else 0 for v in vid], pa.int32()),
            "video_tokens": pa.array([sum(v) for v in vid], pa.int64()),
            "video_seq_lens": pa.array(vid, pa.list_(pa.int32())),
        }
        meta["phases"] = ["vision", "video", "llm"]
        if tower is not None:
            meta["video_rule"] = {"kind": "QwenVideoRule", "tower": tower}
    t = pa.table(cols)
    return t.replace_schema_metadata({METADATA_KEY: json.dumps(meta)})


def test_a_qwen_video_table_is_balanced_with_its_frames_in_the_vision_load():
    table = _table("vision")
    folded = fold_shared_towers(table)
    assert "video_tokens" not in folded.column_names
    want_v = [
        a + b
        for a, b in zip(
            table["vit_tokens"].to_pylist(), table["video_tokens"].to_pylist(), strict=True
        )
    ]
    assert folded["vit_tokens"].to_pylist() == want_v
    assert folded["vit_seq_lens"].to_pylist() == [
        a + b
        for a, b in zip(
            table["vit_seq_lens"].to_pylist(), table["video_seq_lens"].to_pylist(), strict=True
        )
    ]
    result = build_plan(table, BalanceConfig(dp=4, target_batch=4, seed=0))
    plan = result.plan.to_pydict()
    by_group: dict[int, int] = {}
    for g, v in zip(plan["group_id"], plan["group_vit_tokens"], strict=True):
        by_group[g] = v
    assert sum(by_group.values()) == sum(want_v)  # every video patch is in a group's load


@pytest.mark.parametrize("tower", [None, "video"])
def test_a_video_phase_no_tower_is_known_to_run_is_refused(tower):
    with pytest.raises(ValueError, match="video encoder phase"):
        build_plan(_table(tower), BalanceConfig(dp=4, target_batch=4, seed=0))


def test_a_table_without_videos_is_unchanged():
    table = _table(None, with_video=False)
    assert fold_shared_towers(table) is table
