"""Damaged WebDataset tars never lose samples silently: every key GNU tar lists is in the cost
table or the errors table, each damaged byte range is an errors row with its offset, and
reading resumes after it (GNU tar, run with ``--ignore-zeros``, is the independent listing)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import image_bytes
from tests.dataprep.helpers import add_member, run

pytestmark = pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")

N = 8


def _tar(path: Path, n: int = N) -> list[tarfile.TarInfo]:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(n):
            conv = {
                "conversations": [
                    {"from": "human", "value": f"q{i}"},
                    {"from": "gpt", "value": "a"},
                ]
            }
            add_member(tf, f"s{i:03d}.json", json.dumps(conv).encode())
            add_member(tf, f"s{i:03d}.jpg", image_bytes(64 + i, 48))
    with tarfile.open(path) as tf:
        return tf.getmembers()


def _gnu_keys(path: Path) -> set[str]:
    """Sample keys of the members GNU tar can list (it skips damaged headers and goes on)."""
    out = subprocess.run(
        ["tar", "--ignore-zeros", "-tf", str(path)], capture_output=True, text=True, check=False
    ).stdout
    return {name.split(".", 1)[0] for name in out.split()}


def _counted(res, rows, errors) -> None:
    """Issue #37 item 13: every rejected sample's row names it in ``sample_id`` (its key), a
    damaged range's row has none and is not counted as a sample: in = written + rejected."""
    samples = [e for e in errors if e["sample_id"] is not None]
    ranges = [e for e in errors if e["sample_id"] is None]
    assert all(e["sample_id"] for e in samples)
    assert all("hold no valid tar header" in e["detail"] for e in ranges)
    assert len(ranges) == res.damaged_ranges
    assert res.n_in == len(rows) + len(samples) == res.n_written + res.n_rejected
    for e in samples:
        if e["reason"] == "tar_framing":
            assert f"'{e['sample_id']}'" in e["detail"]


def _flip_checksum(data: bytearray, header_offset: int) -> None:
    data[header_offset + 148] ^= 0x01  # one bit of the header checksum field


def test_flipped_header_checksum_resynchronizes(tmp_path, tokenizer_path):
    members = _tar(tmp_path / "ok.tar")
    data = bytearray((tmp_path / "ok.tar").read_bytes())
    victim = next(m for m in members if m.name == "s003.jpg")
    _flip_checksum(data, victim.offset)
    (tmp_path / "bad.tar").write_bytes(bytes(data))
    res, rows, errors = run(tmp_path, [tmp_path / "bad.tar"], tokenizer_path)
    listed = _gnu_keys(tmp_path / "bad.tar")
    assert listed == {f"s{i:03d}" for i in range(N)}  # GNU tar still sees every key
    got = {r["sample_id"] for r in rows}
    framing = [e for e in errors if e["reason"] == "tar_framing"]
    # the damaged range is its own row, naming the tar and the byte offset
    gap = [e for e in framing if "hold no valid tar header" in e["detail"]]
    assert (
        len(gap) == 1 and str(victim.offset) in gap[0]["detail"] and "bad.tar" in gap[0]["detail"]
    )
    # s003 lost its image header: rejected, never measured as a text-only sample; the next
    # sample borders the damage and is rejected too; all later samples are read
    assert "s003" not in got
    assert {f"s{i:03d}" for i in (5, 6, 7)} <= got
    rejected = {
        e["detail"].split("sample '")[1].split("'")[0] for e in framing if "borders" in e["detail"]
    }
    assert listed == got | rejected
    assert "s004" in rejected  # after the damage: its first header may have been the lost one
    _counted(res, rows, errors)


def test_member_longer_than_its_header_says(tmp_path, tokenizer_path):
    """A member whose data runs past its declared size: what follows is not a header; the reader
    skips to the next valid one instead of ending the tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(N):
            conv = {
                "conversations": [
                    {"from": "human", "value": f"q{i}"},
                    {"from": "gpt", "value": "a"},
                ]
            }
            body = json.dumps(conv).encode()
            info = tarfile.TarInfo(f"s{i:03d}.json")
            if i == 2:  # header says 40 bytes, 1500 bytes of data follow
                body = body + b" " * (1500 - len(body))
                info.size = 40
                tf.fileobj.write(info.tobuf(tf.format, tf.encoding, tf.errors))
                tf.fileobj.write(body + b"\0" * (-len(body) % 512))
                tf.offset += 512 + len(body) + (-len(body) % 512)
                continue
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    (tmp_path / "long.tar").write_bytes(buf.getvalue())
    res, rows, errors = run(tmp_path, [tmp_path / "long.tar"], tokenizer_path)
    listed = _gnu_keys(tmp_path / "long.tar")
    got = {r["sample_id"] for r in rows}
    assert listed == {f"s{i:03d}" for i in range(N)}
    assert {f"s{i:03d}" for i in range(3, N)} <= got | {"s003"}  # later samples are still read
    assert {"s004", "s005", "s006", "s007"} <= got
    assert any(
        e["reason"] == "tar_framing" and "hold no valid tar header" in e["detail"] for e in errors
    )
    assert "s002" not in got  # its json was cut at 40 bytes
    _counted(res, rows, errors)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_every_listed_key_is_accounted_for(tmp_path, tokenizer_path, where):
    members = _tar(tmp_path / "ok.tar")
    data = bytearray((tmp_path / "ok.tar").read_bytes())
    victim = {"first": members[0], "middle": members[7], "last": members[-1]}[where]
    _flip_checksum(data, victim.offset)
    (tmp_path / "bad.tar").write_bytes(bytes(data))
    res, rows, errors = run(tmp_path, [tmp_path / "bad.tar"], tokenizer_path)
    listed = _gnu_keys(tmp_path / "bad.tar")
    named = {r["sample_id"] for r in rows}
    for e in errors:
        named |= {k for k in listed if f"'{k}'" in e["detail"] or f"{k}." in e["detail"]}
    assert listed <= named
    assert any(e["reason"] == "tar_framing" and str(victim.offset) in e["detail"] for e in errors)
    _counted(res, rows, errors)


def test_garbage_after_the_end_marker_says_the_rest_was_not_read(tmp_path, tokenizer_path):
    _tar(tmp_path / "ok.tar")
    data = (tmp_path / "ok.tar").read_bytes()
    size = len(data)
    (tmp_path / "tail.tar").write_bytes(data + b"\x7f" * 2048)
    _res, rows, errors = run(tmp_path, [tmp_path / "tail.tar"], tokenizer_path)
    assert len(rows) == N  # the archive ended cleanly (zero blocks) before the garbage
    (tail,) = errors
    assert "rest of the tar was not read" in tail["detail"] and str(size) in tail["detail"]


def test_garbage_right_after_the_last_member(tmp_path, tokenizer_path):
    members = _tar(tmp_path / "ok.tar")
    last = members[-1]
    end = last.offset_data + (last.size + 511) // 512 * 512
    data = (tmp_path / "ok.tar").read_bytes()[:end] + b"\x7f" * 3000
    (tmp_path / "tail.tar").write_bytes(data)
    res, rows, errors = run(tmp_path, [tmp_path / "tail.tar"], tokenizer_path)
    assert len(rows) == N - 1  # the last sample borders the damaged range
    assert {e["reason"] for e in errors} == {"tar_framing"} and len(errors) == 2
    assert any(str(end) in e["detail"] and "rest of the tar" in e["detail"] for e in errors)
    assert res.n_in == N and res.damaged_ranges == 1  # the range is reported, not a sample
    _counted(res, rows, errors)


def test_member_name_not_utf8_is_that_samples_row(tmp_path, tokenizer_path):
    _tar(tmp_path / "ok.tar", n=3)
    with tarfile.open(tmp_path / "ok.tar", "a", format=tarfile.USTAR_FORMAT) as tf:
        info = tarfile.TarInfo("bad\udcff.json")  # surrogateescape: the raw byte 0xff
        info.size = 2
        tf.addfile(info, io.BytesIO(b"{}"))
    _res, rows, errors = run(tmp_path, [tmp_path / "ok.tar"], tokenizer_path)
    assert len(rows) == 3
    (bad,) = errors
    assert (
        bad["reason"] == "unsafe_member" and "UTF-8" in bad["detail"] and "ok.tar" in bad["detail"]
    )


def test_a_tar_without_its_end_marker_rejects_its_last_sample(tmp_path, tokenizer_path):
    """A tar that stops right after a member's data, without the two zero blocks a complete
    tar ends with, may have lost the rest of its last sample (its image, its next members):
    that sample is rejected as truncated, every other sample is read."""
    members = _tar(tmp_path / "ok.tar")
    last = members[-1]
    end = last.offset_data + (last.size + 511) // 512 * 512
    (tmp_path / "cut.tar").write_bytes((tmp_path / "ok.tar").read_bytes()[:end])
    res, rows, errors = run(tmp_path, [tmp_path / "cut.tar"], tokenizer_path)
    assert {r["sample_id"] for r in rows} == {f"s{i:03d}" for i in range(N - 1)}
    assert [(e["sample_id"], e["reason"]) for e in errors] == [
        (f"s{N - 1:03d}", "truncated_archive")
    ]
    assert "no end-of-archive marker" in errors[0]["detail"]
    _counted(res, rows, errors)
