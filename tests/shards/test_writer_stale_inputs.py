"""write refuses raw inputs that changed after prep measured them (the cost table's fingerprint),
saying to re-run prep, and publishes nothing."""

from __future__ import annotations

import json
import shutil

import pytest

from shards.writer import WriteConfig, WriteError, write_generation
from tests.shards.conftest import build_inputs


@pytest.fixture
def inputs(gen_inputs, tmp_path):
    """A private copy of the demo data, its cost table and plan (paths point at the copy)."""
    demo, _cost, _plan = gen_inputs
    root = tmp_path / "in"
    shutil.copytree(demo, root / "demo")
    return build_inputs(root)


def _write(cost, plan_dir, out):
    return write_generation(
        WriteConfig(plan_dir=str(plan_dir), cost_table=str(cost), out=str(out), shard_size=200_000)
    )


def _first_with_image(demo):
    for line in (demo / "demo.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if isinstance(rec.get("image"), str):
            return rec
    raise AssertionError("the demo set has a single-image sample")


def test_image_truncated_after_prep_is_refused(inputs, tmp_path):
    demo, cost, plan_dir = inputs
    rec = _first_with_image(demo)
    img = demo / rec["image"]
    data = img.read_bytes()
    img.write_bytes(data[: len(data) // 2])
    with pytest.raises(WriteError) as e:
        _write(cost, plan_dir, tmp_path / "out")
    msg = str(e.value)
    assert rec["image"].split("/")[-1] in msg or rec["id"] in msg
    assert "re-run prep" in msg
    assert not list((tmp_path / "out").glob("gen-*"))  # nothing published


def test_image_replaced_after_prep_is_refused(inputs, tmp_path):
    """A complete image of another size: it reads cleanly, but the costs are not its costs."""
    from tests.conftest import image_bytes

    demo, cost, plan_dir = inputs
    rec = _first_with_image(demo)
    (demo / rec["image"]).write_bytes(image_bytes(1999, 1001))
    with pytest.raises(WriteError) as e:
        _write(cost, plan_dir, tmp_path / "out")
    users = {
        r["id"]
        for r in map(json.loads, (demo / "demo.jsonl").read_text().splitlines())
        if rec["image"]
        in ([r["image"]] if isinstance(r.get("image"), str) else r.get("image") or [])
    }
    named = str(e.value).split("'")[1]
    assert named in users and "changed since prep" in str(e.value)


def test_conversation_edited_after_prep_is_refused(inputs, tmp_path):
    demo, cost, plan_dir = inputs
    lines = (demo / "demo.jsonl").read_text().splitlines()
    rec = json.loads(lines[3])
    rec["conversations"][-1]["value"] += " and much more text" * 400
    lines[3] = json.dumps(rec)
    (demo / "demo.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(WriteError) as e:
        _write(cost, plan_dir, tmp_path / "out")
    assert rec["id"] in str(e.value) and "re-run prep" in str(e.value)
    assert not list((tmp_path / "out").glob("gen-*"))


def test_unchanged_inputs_write(inputs, tmp_path):
    _demo, cost, plan_dir = inputs
    res = _write(cost, plan_dir, tmp_path / "out")
    assert res.samples > 0
