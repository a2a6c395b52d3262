"""write refuses raw inputs that changed after prep measured them (the cost table's fingerprint),
saying to re-run prep, and publishes nothing."""

from __future__ import annotations

import json
import shutil

import pytest

from shards.write.writer import WriteConfig, WriteError, write_generation
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


def _as_before_displayed_sizes(monkeypatch):
    """prep (and write's probe) as an equishard from before images were counted as displayed:
    no EXIF orientation read, no ``image_sizes`` in the cost table's metadata."""
    monkeypatch.setattr("dataprep.image_header.displayed_orientation", lambda *a: 1)
    monkeypatch.setattr("dataprep.prep.IMAGE_SIZES", None)


def test_cost_table_from_before_displayed_sizes_is_checked_image_by_image(
    gen_inputs, tmp_path, monkeypatch
):
    """A cost table an older equishard measured (images as stored): write probes every image
    again instead of trusting the cache key, so a sample with a photo stored sideways stops
    with an error that says why; the same table without such photos writes."""
    from PIL import Image

    from tests.conftest import image_bytes

    demo, _cost, _plan = gen_inputs
    root = tmp_path / "in"
    shutil.copytree(demo, root / "demo")
    for p in (root / "demo" / "images").iterdir():  # every photo upright to start with
        with Image.open(p) as im:
            size, turned = im.size, im.getexif().get(0x0112, 1) != 1
        if turned:
            p.write_bytes(image_bytes(*size, "JPEG"))
    rec = _first_with_image(root / "demo")
    users = [
        r["id"]
        for r in map(json.loads, (root / "demo" / "demo.jsonl").read_text().splitlines())
        if rec["image"] in json.dumps(r)
    ]

    def write_as_before(out):
        for old in ("cost.parquet", "plan-0"):
            shutil.rmtree(root / old, ignore_errors=True)
            (root / old).unlink(missing_ok=True)
        with monkeypatch.context() as m:
            _as_before_displayed_sizes(m)
            _demo, cost, plan_dir = build_inputs(root)
        return _write(cost, plan_dir, out)

    (root / "demo" / rec["image"]).write_bytes(image_bytes(640, 200, "JPEG", orientation=6))
    with pytest.raises(WriteError) as e:
        write_as_before(tmp_path / "out")
    assert any(repr(u) in str(e.value) for u in users), str(e.value)
    assert "counted its images as stored" in str(e.value)
    assert not list((tmp_path / "out").glob("gen-*"))
    # without a turned photo the older table still writes (its counts are right)
    (root / "demo" / rec["image"]).write_bytes(image_bytes(640, 200, "JPEG"))
    assert write_as_before(tmp_path / "out2").generation


def _swap_on_first_open(monkeypatch, target: str) -> list:
    """The first time ``target`` is opened as an image, its path holds another picture (mtime
    1 ns) for that open only; the original file, its mtime kept, is back right after. Returns
    the list that records the swap."""
    import os

    import dataprep.image_header as ih
    from tests.conftest import image_bytes

    real = ih._open_regular
    swapped = []

    def swapped_on_open(path, root=None):
        if str(path) != target or swapped:
            return real(path, root)
        swapped.append(path)
        os.replace(target, target + ".orig")
        with open(target, "wb") as f:
            f.write(image_bytes(1999, 1001))
        os.utime(target, ns=(1, 1))
        try:
            return real(path, root)
        finally:
            os.replace(target + ".orig", target)

    monkeypatch.setattr(ih, "_open_regular", swapped_on_open)
    return swapped


def test_image_replaced_while_the_writer_opens_it_is_refused(inputs, tmp_path, monkeypatch):
    """For the moment the writer opens it, the image's path holds another picture; right after,
    the original is back (every other sample sees it unchanged). The cache key must describe the
    bytes read, so its status comes from the opened file after the read; a key from a status
    taken before the open still matches prep's, and the other picture would go into the shard
    under the original's costs."""

    demo, cost, plan_dir = inputs
    target = str(demo / _first_with_image(demo)["image"])
    swapped = _swap_on_first_open(monkeypatch, target)
    with pytest.raises(WriteError, match="changed since prep"):
        _write(cost, plan_dir, tmp_path / "out")
    assert swapped and not list((tmp_path / "out").glob("gen-*"))


def test_image_swapped_while_prep_measures_it_is_refused_by_write(
    gen_inputs, tmp_path, monkeypatch
):
    """Prep's sibling of the case above: for the moment prep opens an image to measure it, its
    path holds another picture, then the original is back. The costs are the other picture's;
    the cache key, taken from a stat before the probe, describes the original. Prep must not
    store that key (the file it measured is not the one the key names), so write checks the
    fingerprint and refuses, instead of writing the original under the other's costs."""

    demo, _cost, _plan = gen_inputs
    root = tmp_path / "in"
    shutil.copytree(demo, root / "demo")
    target = str(root / "demo" / _first_with_image(root / "demo")["image"])
    swapped = _swap_on_first_open(monkeypatch, target)
    _demo, cost, plan_dir = build_inputs(root)  # prep (in this process) and balance
    monkeypatch.undo()
    assert swapped
    with pytest.raises(WriteError, match="changed since prep"):
        _write(cost, plan_dir, tmp_path / "out")


def test_an_input_replaced_by_a_fifo_after_prep_is_refused_not_read(inputs, tmp_path):
    """write reads the raw inputs again: one replaced by a FIFO since prep blocked the write
    forever (the JSONL index opened it); now it is refused naming it, in a subprocess with a
    deadline so that a regression fails instead of hanging the suite."""
    import os
    import subprocess
    import sys

    demo, cost, plan_dir = inputs
    (demo / "demo.jsonl").unlink()
    os.mkfifo(demo / "demo.jsonl")
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "equishard", "write", str(plan_dir), "--cost-table", str(cost),
         "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "demo.jsonl: not a regular file" in r.stderr and "re-run prep" in r.stderr
    assert not list(out.glob("gen-*"))


@pytest.mark.parametrize("swap", ["file", "directory"])
def test_a_link_swapped_into_the_image_root_after_prep_is_refused(inputs, tmp_path, swap):
    """An image (or its folder) replaced after prep by a link to a copy outside the image root:
    the bytes are the ones prep measured, so only the root says no. write checks the file it
    opened (not the path it checked before), so the outside file is never published."""
    demo, cost, plan_dir = inputs
    rec = _first_with_image(demo)
    img = demo / rec["image"]
    outside = tmp_path / "outside"
    if swap == "file":
        outside.mkdir()
        shutil.copy2(img, outside / img.name)
        img.unlink()
        img.symlink_to(outside / img.name)
    else:
        shutil.copytree(img.parent, outside)
        shutil.rmtree(img.parent)
        img.parent.symlink_to(outside, target_is_directory=True)
    with pytest.raises(WriteError, match="outside the image root") as e:
        _write(cost, plan_dir, tmp_path / "out")
    assert "\n" not in str(e.value)
    assert not list((tmp_path / "out").glob("gen-*"))  # nothing published


def test_a_link_swapped_in_between_the_path_check_and_the_open_is_refused(
    inputs, tmp_path, monkeypatch
):
    """The race the path check alone loses: the image's path passes the check (a plain file
    inside the root), and a link to the same bytes outside the root takes its place just
    before the writer opens it. The file opened is checked, so it is refused (the write
    published the outside file before)."""
    import os

    import dataprep.image_header as ih

    demo, cost, plan_dir = inputs
    target = demo / _first_with_image(demo)["image"]
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy2(target, outside / target.name)
    real = ih._open_regular

    swapped = []

    def swap_then_open(path, root=None):
        if str(path) != str(target) or swapped:
            return real(path) if root is None else real(path, root)
        swapped.append(path)  # for this open only: every later check sees the plain file
        os.replace(target, str(target) + ".orig")
        target.symlink_to(outside / target.name)
        try:
            return real(path) if root is None else real(path, root)
        finally:
            os.replace(str(target) + ".orig", target)

    monkeypatch.setattr(ih, "_open_regular", swap_then_open)
    with pytest.raises(WriteError, match="outside the image root"):
        _write(cost, plan_dir, tmp_path / "out")
    assert swapped and not list((tmp_path / "out").glob("gen-*"))
