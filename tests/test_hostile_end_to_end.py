"""A battery of bad records, damaged images and damaged tars through every stage, as a user runs
them (the CLI, each command under a timeout): at every stage in = out + rejected against an
independent count of the inputs, no traceback, nothing partial ever yielded, nothing hangs."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dataprep import make_demo
from shards import Collator, GroupDataset, RankInfo, open_generation
from tests.conftest import image_bytes, write_image

pytestmark = pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [sys.executable, "-m", "equishard", *args], capture_output=True, text=True, timeout=timeout
    )
    assert "Traceback" not in r.stderr, r.stderr
    return r


def _conv(q="What is it?", a="A thing."):
    return [{"from": "human", "value": q}, {"from": "gpt", "value": a}]


def _hostile_jsonl(root: Path) -> int:
    """Bad records beside the demo's good ones; returns how many records the file holds."""
    raw = root / "raw"
    img = raw / "images"
    from PIL import Image

    buf = io.BytesIO()  # a JPEG carrying an EXIF thumbnail, cut in half: an EOI (the
    Image.effect_noise((120, 90), 60).convert("RGB").save(  # thumbnail's) stays in its tail
        buf, format="JPEG", exif=b"Exif\x00\x00" + image_bytes(40, 30)
    )
    (img / "cut.jpg").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    (img / "empty.jpg").write_bytes(b"")
    (img / "garbage.jpg").write_bytes(b"not an image at all" * 10)
    buf = io.BytesIO()
    Image.new("RGB", (20, 20)).save(buf, format="TIFF")
    (img / "tiff.jpg").write_bytes(buf.getvalue())
    os.mkfifo(img / "fifo.jpg")
    (img / "dir.jpg").mkdir()
    write_image(root / "outside.jpg", 50, 50)
    bad = [
        "{broken json",
        '{"id": "deep", "conversations": ' + "[" * 30000 + "]" * 30000 + "}",
        json.dumps({"id": "surrogate", "conversations": _conv(a="x \ud800 y")}),
        json.dumps({"id": "nonstring", "conversations": [{"from": "human", "value": 5}]}),
        json.dumps({"id": "empty", "conversations": []}),
        json.dumps({"id": "role", "conversations": [{"from": "alien", "value": "hi"}]}),
        json.dumps({"id": "mismatch", "image": "images/000001.jpg",
                    "conversations": _conv("<image><image> two?")}),
        json.dumps({"id": "missing", "image": "images/nope.jpg", "conversations": _conv()}),
        json.dumps({"id": "cut", "image": "images/cut.jpg", "conversations": _conv()}),
        json.dumps({"id": "emptyimg", "image": "images/empty.jpg", "conversations": _conv()}),
        json.dumps({"id": "garbage", "image": "images/garbage.jpg", "conversations": _conv()}),
        json.dumps({"id": "tiff", "image": "images/tiff.jpg", "conversations": _conv()}),
        json.dumps({"id": "fifo", "image": "images/fifo.jpg", "conversations": _conv()}),
        json.dumps({"id": "dir", "image": "images/dir.jpg", "conversations": _conv()}),
        json.dumps({"id": "dotdot", "image": "../outside.jpg", "conversations": _conv()}),
        json.dumps({"id": "abs", "image": str(root / "outside.jpg"), "conversations": _conv()}),
        json.dumps({"id": 3.5, "conversations": _conv()}),
        "[1, 2, 3]",
    ]  # fmt: skip
    lines = (raw / "demo.jsonl").read_text().splitlines()
    first_id = json.loads(lines[0])["id"]
    bad.append(json.dumps({"id": first_id, "conversations": _conv()}))  # a duplicate id
    for k, b in enumerate(bad):
        lines.insert(3 + 2 * k, b)
    (raw / "hostile.jsonl").write_text("\n".join(lines) + "\n")
    return len(lines)


def _hostile_tar(root: Path) -> Path:
    path = root / "raw" / "hostile.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:

        def add(name, data, **kw):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for k, v in kw.items():
                setattr(info, k, v)
            tf.addfile(info, io.BytesIO(data))

        for i in range(10):
            add(f"t{i:02d}.json", json.dumps({"conversations": _conv(f"tar {i}?")}).encode())
            add(f"t{i:02d}.jpg", image_bytes(80 + i, 60))
        add("../evil.json", b"{}")
        add("bad\udcffname.json", b"{}")
        add("short.json", b'{"conversations": [')
    data = bytearray(path.read_bytes())
    with tarfile.open(path) as tf:
        victim = next(m for m in tf.getmembers() if m.name == "t04.jpg")
    data[victim.offset + 148] ^= 0x01  # a flipped bit in one header checksum
    path.write_bytes(bytes(data))
    return path


def _gnu_keys(path: Path) -> set[str]:
    out = subprocess.run(
        ["tar", "--ignore-zeros", "-tf", str(path)], capture_output=True, check=False
    ).stdout
    return {name.split(b".", 1)[0] for name in out.split(b"\n") if name}


def test_hostile_inputs_through_every_stage(tmp_path):
    raw = tmp_path / "raw"
    make_demo(raw, samples=60, seed=11, images=10)
    n_jsonl = _hostile_jsonl(tmp_path)
    tar = _hostile_tar(tmp_path)
    deep_list = raw / "list.json"
    deep_list.write_text(
        "["
        + json.dumps({"id": "list-ok", "conversations": _conv()})
        + ", "
        + "[" * 30000
        + "]" * 30000
        + "]"
    )
    cost = tmp_path / "cost.parquet"

    # prep: every record is a row or an errors row; counted against independent listings
    r = _cli(
        "prep", str(raw / "hostile.jsonl"), str(tar), str(deep_list),
        "--tokenizer", str(raw / "tokenizer.json"), "--image-root", str(raw),
        "--workers", "2", "--max-error-rate", "1", "--json", "-o", str(cost), timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    rows = pq.read_table(cost).to_pylist()
    errors = pq.read_table(tmp_path / "cost.errors.parquet").to_pylist()
    assert res["n_in"] == res["n_written"] + res["n_rejected"]
    # the errors table also lists each damaged tar range: a row with no sample, not counted
    ranges = [e for e in errors if e["sample_id"] is None and "no valid tar header" in e["detail"]]
    assert len(ranges) == res["damaged_ranges"] >= 1
    assert (res["n_written"], res["n_rejected"]) == (len(rows), len(errors) - len(ranges))
    tar_keys = _gnu_keys(tar)
    tar_rows = [x for x in rows if ".tar#" in x["location"]]
    tar_errs = [e for e in errors if ".tar#" in e["location"]]
    gaps = [e for e in tar_errs if "hold no valid tar header" in e["detail"]]
    assert len(tar_rows) + len(tar_errs) == len(tar_keys) + len(gaps)
    jsonl_n = sum(1 for x in rows + errors if "hostile.jsonl#" in x["location"])
    assert jsonl_n == n_jsonl
    assert sum(1 for x in rows + errors if "list.json#" in x["location"]) == 2
    by_id = {e["sample_id"]: e["reason"] for e in errors if e["sample_id"]}
    for sid, reason in {
        "cut": "truncated_image", "fifo": "not_a_file", "dir": "not_a_file",
        "dotdot": "unsafe_path", "abs": "unsafe_path", "surrogate": "invalid_text",
        "missing": "missing_image", "emptyimg": "empty_image", "tiff": "unsupported_format",
    }.items():  # fmt: skip
        assert by_id.get(sid) == reason, (sid, by_id.get(sid))
    reasons = {e["reason"] for e in errors}
    assert {"too_deep", "malformed_json", "duplicate_id", "tar_framing", "unsafe_member"} <= reasons
    assert all(e["detail"] for e in errors)

    # balance: in = out
    plan = tmp_path / "plan"
    r = _cli("balance", str(cost), "--dp", "4", "--nodes", "2", "--target-batch", "3",
             "-o", str(plan), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads((plan / "report.json").read_text())
    assert report["counts"]["in"] == report["counts"]["out"] == len(rows)

    # write + verify: every planned sample in the shards, checked
    gen = tmp_path / "gen"
    r = _cli("write", str(plan), "--cost-table", str(cost), "--out", str(gen),
             "--workers", "2", "--shard-size", "256KB")  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = _cli("verify", str(gen))
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    m = open_generation(gen)
    assert m.totals["samples"] == len(rows)

    # load: every sample exactly once, each decoded whole (raise mode: nothing is skipped)
    collate = Collator(tokenizer=str(raw / "tokenizer.json"))
    got, steps = [], set()
    for rank in range(m.dp):
        batches = list(GroupDataset(gen, RankInfo(rank=rank, world_size=m.dp), transform=collate))
        steps.add(len(batches))
        for b in batches:
            assert b["skipped"] == []
            got += b["samples"]["sample_ids"]
    assert len(steps) == 1
    assert sorted(got) == sorted(x["sample_id"] for x in rows)
