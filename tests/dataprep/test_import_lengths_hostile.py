"""``import-lengths`` on numbers from someone else's JSON (issue #37 item 6): every entry outside
a plausible range, and every line that is not JSON, is that entry's errors row naming the file;
the rest import; nothing wraps, goes negative or aborts the whole import."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dataprep.import_lengths import MAX_TILES, ImportLengthsConfig, import_lengths
from equishard.contracts.cost_table import errors_path, read_cost_table

GOOD = {"vit_num": 2, "token_num": 600, "image_flags": 2}

HOSTILE = {
    "vit_num past int32 (wrapped offsets)": {
        "vit_num": 2**31 + 5,
        "token_num": 600,
        "image_flags": 1,
    },
    "vit_num past int64": {"vit_num": 2**70, "token_num": 600, "image_flags": 1},
    "token_num past int64": {"vit_num": 1, "token_num": 2**80, "image_flags": 1},
    "token_num huge": {"vit_num": 1, "token_num": 10**15, "image_flags": 1},
    "vit_num just above the bound": {"vit_num": MAX_TILES + 1, "token_num": 600, "image_flags": 0},
    "float": {"vit_num": 1.5, "token_num": 600, "image_flags": 1},
    "nan-like string": {"vit_num": "NaN", "token_num": 600, "image_flags": 1},
    "negative": {"vit_num": -1, "token_num": 600, "image_flags": 0},
    # JSON true is Python's 1: a flag where a count belongs, never a count
    "boolean": {"vit_num": True, "token_num": 600, "image_flags": 1},
}


def _check_table(out, n_good: int) -> None:
    t = read_cost_table(out)
    assert t.num_rows == n_good
    for col in ("vit_tokens", "llm_tokens", "text_tokens"):
        assert pc.min(t[col]).as_py() >= 0, col
    # every row agrees with itself: vit_tokens is the sum of its sequences
    seq = t["vit_seq_lens"].to_pylist()
    assert [sum(s) for s in seq] == t["vit_tokens"].to_pylist()


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_one_implausible_entry_is_its_own_errors_row(tmp_path, case):
    src = tmp_path / "lengths.json"
    src.write_text(json.dumps([GOOD, HOSTILE[case], GOOD]))
    res = import_lengths(
        ImportLengthsConfig(inputs=(str(src),), output=str(tmp_path / "c.parquet"))
    )
    assert (res.n_in, res.n_written, res.n_rejected) == (3, 2, 1)
    _check_table(tmp_path / "c.parquet", 2)
    errs = pq.read_table(errors_path(tmp_path / "c.parquet")).to_pylist()
    assert [e["sample_id"] for e in errs] == ["lengths:1"]
    assert str(src) in errs[0]["detail"] and errs[0]["reason"] == "invalid_lengths"


def test_bad_lines_of_a_jsonl_file_are_their_own_rows(tmp_path):
    """One line that is not JSON (truncated, binary, not UTF-8) is that line's row, as prep does
    (bug: the whole import failed on it)."""
    src = tmp_path / "lengths.jsonl"
    lines = [json.dumps(GOOD), '{"vit_num": 1, "token', json.dumps(GOOD)]
    src.write_bytes(
        ("\n".join(lines) + "\n").encode() + b"\xff\xfe{bad\n" + json.dumps(GOOD).encode()
    )
    res = import_lengths(
        ImportLengthsConfig(inputs=(str(src),), output=str(tmp_path / "c.parquet"))
    )
    assert (res.n_in, res.n_written, res.n_rejected) == (5, 3, 2)
    errs = pq.read_table(errors_path(tmp_path / "c.parquet")).to_pylist()
    assert [e["line"] for e in errs] == [2, 4]
    assert all(str(src) in e["detail"] and "not JSON" in e["detail"] for e in errs)
    _check_table(tmp_path / "c.parquet", 3)


def test_a_file_that_is_not_lengths_at_all_names_the_file(tmp_path):
    src = tmp_path / "junk.json"
    src.write_bytes(b"\x00\x01 not json at all \xff")
    with pytest.raises(ValueError, match=r"junk\.json"):
        import_lengths(ImportLengthsConfig(inputs=(str(src),), output=str(tmp_path / "c.parquet")))


def test_many_tiles_in_total_stay_exact(tmp_path, monkeypatch):
    """More tiles in one file than one chunk's 32-bit list offsets hold (here the limit is made
    small: the real one needs 8 GiB of tiles): the table is built in chunks, every row exact
    (bug: the offsets wrapped silently and rows contradicted themselves)."""
    import dataprep.import_lengths as il

    monkeypatch.setattr(il, "_OFFSETS", 100)
    entries = [{"vit_num": k % 37, "token_num": 10 + k, "image_flags": 0} for k in range(300)]
    src = tmp_path / "big.json"
    src.write_text(json.dumps(entries))
    res = import_lengths(
        ImportLengthsConfig(inputs=(str(src),), output=str(tmp_path / "c.parquet"))
    )
    assert res.n_written == len(entries)
    t = read_cost_table(tmp_path / "c.parquet")
    assert [len(s) for s in t["vit_seq_lens"].to_pylist()] == [e["vit_num"] for e in entries]
    _check_table(tmp_path / "c.parquet", len(entries))


@pytest.mark.parametrize("window", [7, 300])  # 300: several values a window (one-call path)
@pytest.mark.parametrize("form", ["list", "list-pretty", "jsonl"])
def test_a_streamed_file_gives_what_json_loads_gives(tmp_path, monkeypatch, form, window):
    """Large files are parsed as they are read, a window and a batch at a time (10M entries in
    bounded memory). Made to stream with a window of 7 characters and batches of 5 entries, the
    tables equal the ones built from ``json.loads`` of the whole file (the reference), hostile
    entries, unicode and values longer than the window included."""
    import dataprep.import_lengths as il

    rng = __import__("random").Random(3)
    entries = [
        {"vit_num": rng.randrange(0, 9), "token_num": 3000 + k, "image_flags": 0, "note": "é✓"}
        for k in range(57)
    ]
    entries[4] = {"vit_num": -2, "token_num": 1, "image_flags": 0}
    entries[9] = "not an object"
    entries[20] = {"vit_num": 1, "token_num": 700, "image_flags": 1, "pad": "x" * 50}
    entries[31] = [1, 2, {"deep": [3, 4]}]
    # orjson makes this integer a float (json keeps it exact: its row names the exact value),
    # and refuses NaN (json takes it): either way the window is decoded again by json
    entries[40] = {"vit_num": 2**70 + 1, "token_num": 700, "image_flags": 0}
    entries[50] = {"vit_num": float("nan"), "token_num": 700, "image_flags": 0}
    if form == "jsonl":
        text = "\n".join(json.dumps(e) for e in entries) + "\n"
    else:
        text = json.dumps(entries, indent=2 if form == "list-pretty" else None)
    src = tmp_path / "big.json"
    src.write_text(text)
    cfg = lambda out: ImportLengthsConfig(inputs=(str(src),), output=str(tmp_path / out))  # noqa: E731
    ref = import_lengths(cfg("ref.parquet"))
    monkeypatch.setattr(il, "_STREAM_BYTES", 0)
    monkeypatch.setattr(il, "_WINDOW", window)
    monkeypatch.setattr(il, "_BATCH", 5)
    got = import_lengths(cfg("got.parquet"))
    assert (got.n_in, got.n_written, got.n_rejected) == (ref.n_in, ref.n_written, ref.n_rejected)
    assert (got.n_in, got.n_rejected) == (57, 5)
    for name in ("ref.parquet", "got.parquet"):
        _check_table(tmp_path / name, 52)
    assert pq.read_table(tmp_path / "got.parquet").equals(pq.read_table(tmp_path / "ref.parquet"))
    errs = [
        pq.read_table(errors_path(tmp_path / n)).to_pylist() for n in ("ref.parquet", "got.parquet")
    ]
    assert [e["detail"] for e in errs[1]] == [e["detail"] for e in errs[0]]
    assert any(str(2**70 + 1) in e["detail"] for e in errs[1])  # exact, not 1.1805916e+21


@pytest.mark.parametrize(
    "text", ['[{"vit_num": 1, "token_num": 9, "image_flags": 0} {"x": 1}]', "[1, 2", "[1] [2]"]
)
def test_a_broken_streamed_list_names_the_file_and_where(tmp_path, monkeypatch, text):
    import dataprep.import_lengths as il

    monkeypatch.setattr(il, "_STREAM_BYTES", 0)
    monkeypatch.setattr(il, "_WINDOW", 4)
    src = tmp_path / "broken.json"
    src.write_text(text)
    out = tmp_path / "c.parquet"
    with pytest.raises(ValueError, match=r"broken\.json: not a JSON list at character \d+"):
        import_lengths(ImportLengthsConfig(inputs=(str(src),), output=str(out)))
    assert not out.exists() and not list(tmp_path.glob(".*tmp*"))  # nothing half-written


@pytest.mark.parametrize(("key", "limit"), [("vit_num", "MAX_TILES"), ("token_num", "MAX_TOKENS")])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_plausibility_limits_at_below_and_above_name_the_exact_value(tmp_path, key, limit, offset):
    """An entry at a limit or one below is taken; one above is its row, its value printed
    exactly (65537 was printed as 6.55e+04, so the row did not say by how much)."""
    import dataprep.import_lengths as il

    value = getattr(il, limit) + offset
    entry = {"vit_num": 1, "token_num": 600, "image_flags": 0, key: value}
    src = tmp_path / "lengths.json"
    src.write_text(json.dumps([GOOD, entry]))
    res = import_lengths(
        ImportLengthsConfig(inputs=(str(src),), output=str(tmp_path / "c.parquet"))
    )
    errs = pq.read_table(errors_path(tmp_path / "c.parquet")).to_pylist()
    if offset <= 0:
        assert (res.n_written, res.n_rejected) == (2, 0), errs
    else:
        assert (res.n_written, res.n_rejected) == (1, 1)
        assert f"{key} {value} is above the plausible {value - 1}" in errs[0]["detail"]


def _random_entries(rng, n: int) -> list:
    """Entries around every limit: negative, zero, at and past the bounds, flags above tiles,
    tokens short of the image tokens (256 a tile), and plain good ones."""
    import dataprep.import_lengths as il

    picks = [-1, 0, 1, 2, 7, il.MAX_TILES - 1, il.MAX_TILES, il.MAX_TILES + 1]
    tokens = [-5, 0, 255, 256, 257, 3000, il.MAX_TOKENS, il.MAX_TOKENS + 1]
    out = []
    for _ in range(n):
        vit = rng.choice(picks)
        flags = rng.choice([-1, 0, 1, vit, vit + 1, max(vit - 1, 0)])
        out.append({"vit_num": vit, "token_num": rng.choice(tokens) * max(flags, 1),
                    "image_flags": flags})  # fmt: skip
    return out


@pytest.mark.parametrize("seed", range(4))
def test_columns_checked_at_once_equal_each_entry_checked_alone(tmp_path, monkeypatch, seed):
    """A batch of plain integer entries is checked as whole columns (``_plausible``), its bad
    rows then explained by ``_why_not``; the same file checked entry by entry (the batch path
    off) gives the same table and the same errors rows. Bugs caught: a limit one off in the
    column check (a row at a bound kept or refused unlike the entry check), a row the column
    check keeps that the entry check refuses, errors rows out of their entries' order."""
    import random

    import dataprep.import_lengths as il

    entries = _random_entries(random.Random(seed), 400)
    src = tmp_path / "l.json"
    src.write_text(json.dumps(entries))
    cfg = lambda out: ImportLengthsConfig(inputs=(str(src),), output=str(tmp_path / out))  # noqa: E731
    fast = import_lengths(cfg("fast.parquet"))
    monkeypatch.setattr(il, "_int_columns", lambda values: None)  # entry by entry
    slow = import_lengths(cfg("slow.parquet"))
    assert (fast.n_written, fast.n_rejected) == (slow.n_written, slow.n_rejected)
    assert 0 < fast.n_rejected < len(entries)
    for name in ("fast.parquet", "slow.parquet"):
        _check_table(tmp_path / name, fast.n_written)
    assert pq.read_table(tmp_path / "fast.parquet").equals(pq.read_table(tmp_path / "slow.parquet"))
    got, want = (pq.read_table(errors_path(tmp_path / n)).to_pylist()
                 for n in ("fast.parquet", "slow.parquet"))  # fmt: skip
    assert got == want
    # and each entry's fate is what _why_not alone says of it
    refused = {e["sample_id"] for e in got}
    assert refused == {f"l:{k}" for k, e in enumerate(entries) if il._why_not(e, cfg("x.parquet"))}


def test_a_batch_with_one_value_of_another_type_is_checked_entry_by_entry():
    """``_int_columns`` gives whole int64 columns only where every value is an object whose
    three lengths are JSON integers: a bool (JSON true, Python's 1), a float, a missing key, a
    string, a non-object or an integer past int64 anywhere in the batch gives None."""
    from dataprep.import_lengths import _int_columns

    good = {"vit_num": 1, "token_num": 300, "image_flags": 1}
    vit, tok, flags = _int_columns([good, {**good, "vit_num": 2}])
    assert vit.dtype.name == "int64" and vit.tolist() == [1, 2] and tok.tolist() == [300, 300]
    assert flags.tolist() == [1, 1]
    for other in ({**good, "vit_num": True}, {**good, "token_num": 3.0}, {"vit_num": 1},
                  {**good, "image_flags": "1"}, [1, 2, 3], "x", 5, None,
                  {**good, "token_num": 2**63}):  # fmt: skip
        assert _int_columns([good, other]) is None, other
    assert _int_columns([{**good, "token_num": 2**63 - 1}]) is not None  # int64's largest


def test_integers_past_64_bits_keep_their_exact_value_in_a_streamed_window(tmp_path, monkeypatch):
    """A streamed window is decoded by orjson, which turns an integer past 64 bits into a
    float; such a window is decoded again by json, so the entry's row names the exact integer
    (the same row the whole-file path writes). Bug caught: the float's rounded value printed
    ("got 1.1805916207174113e+21"), or the entry refused as a float, not as too many tiles."""
    import dataprep.import_lengths as il

    big = 2**70 + 1
    entries = [
        {"vit_num": big if k % 3 == 0 else 1, "token_num": 700 + k, "image_flags": 0}
        for k in range(30)
    ]
    src = tmp_path / "big.json"
    src.write_text(json.dumps(entries))
    cfg = lambda out: ImportLengthsConfig(inputs=(str(src),), output=str(tmp_path / out))  # noqa: E731
    import_lengths(cfg("ref.parquet"))  # the whole file by json
    decoded = []
    real = il._window_values
    monkeypatch.setattr(
        il, "_window_values", lambda text: decoded.append(real(text)) or decoded[-1]
    )
    monkeypatch.setattr(il, "_STREAM_BYTES", 0)
    monkeypatch.setattr(il, "_WINDOW", 4096)
    got = import_lengths(cfg("got.parquet"))
    assert got.n_rejected == 10
    assert any(
        isinstance(v, il._Fast) and any(isinstance(e["vit_num"], float) for e in v) for v in decoded
    )  # fmt: skip  (orjson's float reached the check)
    want, have = (pq.read_table(errors_path(tmp_path / n)).to_pylist()
                  for n in ("ref.parquet", "got.parquet"))  # fmt: skip
    assert [e["detail"] for e in have] == [e["detail"] for e in want]
    assert all(f"vit_num {big} is above the plausible" in e["detail"] for e in have)
