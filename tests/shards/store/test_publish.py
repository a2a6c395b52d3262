"""``shards.store.publish``: new files, atomic replacement, ``CURRENT`` and its history, the lock.

References: the file system itself (what is on disk after each call, read back with plain
``open``/``os.lstat``) and every documented limit at, below and above it (a ``CURRENT`` file of
4,096 bytes, a generation name of 255 characters, a history of 2,000 lines and of 16 MiB).

Bugs these catch (each survived the earlier selection under cosmic-ray): ``open_new`` writing
through a name already there; a temp name others can predict or that leaves the directory;
a failed write leaving its temp file; the history cut at the wrong line count or kept whole
past it; a history replaced by a FIFO not started anew; names with a separator, a NUL, a
leading dot or 256 characters accepted; a second lock granted while the first is held."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from shards.store import publish as P


def test_open_new_creates_and_refuses_any_name_already_there(tmp_path):
    target = tmp_path / "new.bin"
    old = os.umask(0o022)
    try:
        with P.open_new(target) as f:
            f.write(b"abc")
    finally:
        os.umask(old)
    assert target.read_bytes() == b"abc"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    with pytest.raises(FileExistsError):
        P.open_new(target)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(FileExistsError):
        P.open_new(tmp_path / "link")
    (tmp_path / "dangling").symlink_to(tmp_path / "absent")
    with pytest.raises(FileExistsError):
        P.open_new(tmp_path / "dangling")
    assert victim.read_bytes() == b"keep" and not (tmp_path / "absent").exists()


def test_temp_names_are_beside_hidden_matched_by_the_cleanup_and_unguessable(tmp_path):
    path = tmp_path / "sub" / "CURRENT"
    names = {P.temp_beside(path) for _ in range(50)}
    assert len(names) == 50
    for name in names:
        assert name.parent == path.parent
        assert re.fullmatch(rf"\.CURRENT\.tmp-{os.getpid()}-[0-9a-f]{{12}}", name.name)
        assert Path(name.name).match(".*.tmp-*")  # the pattern leftovers are cleaned by


def test_atomic_write_replaces_the_name_never_the_file_a_link_points_at(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    path = tmp_path / "CURRENT"
    path.symlink_to(victim)
    P.atomic_write_bytes(path, b"gen-2\n")
    assert not path.is_symlink() and path.read_bytes() == b"gen-2\n"
    assert victim.read_bytes() == b"keep"
    P.atomic_write_bytes(path, b"gen-3\n")
    assert path.read_bytes() == b"gen-3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CURRENT", "victim"]


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"old")
    with pytest.raises(TypeError):
        P.atomic_write_bytes(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_read_current_absent_empty_and_stripped(tmp_path):
    assert P.read_current(tmp_path) is None
    (tmp_path / "CURRENT").write_text("")
    assert P.read_current(tmp_path) is None
    (tmp_path / "CURRENT").write_text("  \n")
    assert P.read_current(tmp_path) is None
    (tmp_path / "CURRENT").write_text(" gen-7 \n")
    assert P.read_current(tmp_path) == "gen-7"


@pytest.mark.parametrize("size", [4095, 4096])
def test_a_current_file_up_to_4096_bytes_is_read(tmp_path, size):
    name = "g" * 255
    (tmp_path / "CURRENT").write_text(name + "\n" * (size - 255))
    assert P.read_current(tmp_path) == name


def test_a_current_file_past_4096_bytes_is_refused(tmp_path):
    (tmp_path / "CURRENT").write_text("gen-1" + "\n" * (4097 - 5))
    with pytest.raises(ValueError, match="4097 bytes"):
        P.read_current(tmp_path)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("gen-1", True),
        ("g" * 255, True),
        ("g" * 256, False),
        ("g" * 254, True),
        ("", False),
        (".staging-1", False),
        ("..", False),
        ("a/b", False),
        ("a\\b", False),
        ("a\x00b", False),
        ("x.y", True),
    ],
)
def test_generation_names(name, ok):
    assert P.valid_generation_name(name) is ok


@pytest.mark.parametrize("text", ["../etc", "a/b", ".hidden", "g" * 256])
def test_current_naming_anything_but_one_generation_is_refused(tmp_path, text):
    (tmp_path / "CURRENT").write_text(text + "\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(tmp_path))}/CURRENT names"):
        P.read_current(tmp_path)


def test_set_current_writes_the_name_and_notes_it(tmp_path):
    old = os.umask(0o022)
    try:
        P.set_current(tmp_path, "gen-1")
    finally:
        os.umask(old)
    for name in ("CURRENT", P.HISTORY):  # readable by every reader, written by the owner
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    P.set_current(tmp_path, "gen-2")
    assert (tmp_path / "CURRENT").read_bytes() == b"gen-2\n"
    assert P.read_history(tmp_path) == [("current", "gen-1"), ("current", "gen-2")]
    P.note_current(tmp_path, "gen-3", event="night")
    assert P.read_history(tmp_path)[-1] == ("night", "gen-3")


def _history(root: Path, n: int) -> None:
    lines = [json.dumps({"event": "current", "generation": f"gen-{i}"}) + "\n" for i in range(n)]
    (root / P.HISTORY).write_text("".join(lines))


@pytest.mark.parametrize("n", [1998, 1999])
def test_a_history_below_2000_lines_is_appended_to(tmp_path, n):
    _history(tmp_path, n)
    P.note_current(tmp_path, "gen-new")
    got = P.read_history(tmp_path)
    assert len(got) == n + 1 and got[0] == ("current", "gen-0")
    assert got[-1] == ("current", "gen-new")


@pytest.mark.parametrize("n", [2000, 2001])
def test_a_history_of_2000_lines_keeps_its_last_1000(tmp_path, n):
    _history(tmp_path, n)
    P.note_current(tmp_path, "gen-new")
    got = P.read_history(tmp_path)
    assert len(got) == 1001
    assert got[0] == ("current", f"gen-{n - 1000}") and got[-1] == ("current", "gen-new")


def test_damaged_history_lines_are_left_out(tmp_path):
    (tmp_path / P.HISTORY).write_text(
        "\n".join(
            [
                json.dumps({"event": "current", "generation": "gen-1"}),
                "{not json",
                json.dumps({"event": "current"}),
                json.dumps(["current", "gen-2"]),
                json.dumps({"event": 5, "generation": "gen-3"}),
                json.dumps({"event": "current", "generation": 5}),
                json.dumps({"event": "current", "generation": "../x"}),
                "[" * 5000 + "]" * 5000,
                json.dumps({"event": "night", "generation": "gen-4"}),
            ]
        )
    )
    assert P.read_history(tmp_path) == [("current", "gen-1"), ("night", "gen-4")]


@pytest.mark.parametrize("size", [(16 << 20) - 1, 16 << 20])
def test_a_history_up_to_16_mib_is_read_and_appended_to(tmp_path, size):
    first = json.dumps({"event": "current", "generation": "gen-1"}) + "\n"
    (tmp_path / P.HISTORY).write_text(first + " " * (size - len(first)))
    assert P.read_history(tmp_path) == [("current", "gen-1")]
    P.note_current(tmp_path, "gen-2")
    text = (tmp_path / P.HISTORY).read_text()
    assert text.startswith(first) and text.endswith('"gen-2"}\n') and len(text) > size


def test_a_history_past_16_mib_or_not_a_file_is_started_anew(tmp_path):
    first = json.dumps({"event": "current", "generation": "gen-1"}) + "\n"
    (tmp_path / P.HISTORY).write_text(first + " " * ((16 << 20) + 1 - len(first)))
    assert P.read_history(tmp_path) == []
    P.note_current(tmp_path, "gen-2")
    assert P.read_history(tmp_path) == [("current", "gen-2")]
    (tmp_path / P.HISTORY).unlink()
    os.mkfifo(tmp_path / P.HISTORY)
    assert P.read_history(tmp_path) == []
    P.note_current(tmp_path, "gen-3")
    assert P.read_history(tmp_path) == [("current", "gen-3")]
    assert stat.S_ISREG(os.lstat(tmp_path / P.HISTORY).st_mode)


def test_the_history_is_never_appended_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("")
    (tmp_path / P.HISTORY).symlink_to(victim)
    with pytest.raises(OSError):
        P.note_current(tmp_path, "gen-1")
    assert victim.read_text() == ""


def test_one_lock_at_a_time(tmp_path):
    path = tmp_path / ".lock"
    old = os.umask(0o022)
    try:
        first = P.try_lock(path)
    finally:
        os.umask(old)
    assert first is not None and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert P.try_lock(path) is None  # another open file description: refused, not waited for
    first.close()
    again = P.try_lock(path)
    assert again is not None
    again.close()


def test_the_lock_is_never_taken_through_a_link(tmp_path):
    (tmp_path / ".lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        P.try_lock(tmp_path / ".lock")
    assert not (tmp_path / "elsewhere").exists()


def test_a_line_appended_by_another_process_meanwhile_is_kept(tmp_path, monkeypatch):
    """Two processes note a move at once (a night starting while a write publishes): the
    history is opened for appending (O_APPEND), so a line another writer adds between this
    one's open and its write is kept, not overwritten."""
    _history(tmp_path, 3)
    real = os.fdopen
    other = json.dumps({"event": "night", "generation": "gen-other"}) + "\n"

    def racing(fd, *args, **kw):
        f = real(fd, *args, **kw)
        with open(tmp_path / P.HISTORY, "a") as g:  # the other process, after our open
            g.write(other)
        return f

    monkeypatch.setattr(P.os, "fdopen", racing)
    P.note_current(tmp_path, "gen-mine")
    got = P.read_history(tmp_path)
    assert got[-2:] == [("night", "gen-other"), ("current", "gen-mine")] and len(got) == 5
