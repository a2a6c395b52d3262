"""Integrity and safety: checksums, truncation, corrupt metadata, missing shards, hostile tars."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from pathlib import Path

import pytest

from equishard.cli import main
from shards.read.dataset import GroupDataset, RankInfo, open_generation
from shards.read.reader import ShardError, read_group
from shards.read.verify import verify_generation
from shards.store.manifest import ManifestError


def _gen_dir(root: Path) -> Path:
    return root / (root / "CURRENT").read_text().strip()


def _first_shard(root: Path):
    m = open_generation(root)
    st = m.streams[0]
    return m, st, st.shards[0], m.path / st.shards[0].file


def _read_all(root: Path, **kw) -> tuple[list[str], list[str]]:
    m = open_generation(root)
    ids, skipped = [], []
    for r in range(m.dp):
        for b in GroupDataset(root, RankInfo(rank=r, world_size=m.dp), **kw):
            ids += [s.meta["sample_id"] for s in b["samples"]]
            skipped += b["skipped"]
    return ids, skipped


def test_flipped_byte_is_caught_by_verify_and_loader(gen_copy, capsys):
    m, st, sh, path = _first_shard(gen_copy)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    r = verify_generation(gen_copy, deep=False)
    assert not r.ok and sh.file in r.problems[0] and "sha256" in r.problems[0]
    assert main(["verify", str(gen_copy)]) == 1
    assert "FAILED" in capsys.readouterr().out
    ds = GroupDataset(gen_copy, RankInfo(rank=st.rank, world_size=m.dp), verify=True, shuffle=False)
    with pytest.raises(ShardError, match=sh.file.split("/")[-1]):
        list(ds)


def _member_bounds(path: Path) -> list[int]:
    cuts = []
    with tarfile.open(path) as tf:
        for mem in tf:
            cuts += [mem.offset, mem.offset_data, mem.offset_data + mem.size // 2]
    return sorted(set(cuts))


def test_truncation_sweep_never_yields_partial_samples(gen_copy):
    m, _st, sh, path = _first_shard(gen_copy)
    full = path.read_bytes()
    expected = set(_read_all(gen_copy)[0])
    cuts = _member_bounds(path)
    for cut in cuts[1 :: max(1, len(cuts) // 12)]:
        path.write_bytes(full[:cut])
        with pytest.raises(
            (ShardError, ManifestError)
        ) as exc:  # size no longer matches the manifest
            open_generation(gen_copy)
            _read_all(gen_copy)
        assert sh.file.split("/")[-1] in str(exc.value)
        # readers that bypass the size check (a shard truncated after open) still never see a part
        samples, errors = [], []
        for g in sh.groups:
            got, errs = read_group(m.path, sh, g, keep_going=True)
            samples += got
            errors += errs
            for s in got:
                assert (
                    set(s.meta["images"]) and len(s.images) == len(s.meta["images"])
                ) or not s.meta["images"]
        assert len(samples) + len(errors) >= sh.samples and len(samples) < sh.samples
        assert {s.meta["sample_id"] for s in samples} <= expected
    # a cut in the end-of-archive padding loses no sample, but the shard still fails its checks
    path.write_bytes(full[:-1])
    got = [s for g in sh.groups for s in read_group(m.path, sh, g)[0]]
    assert len(got) == sh.samples
    assert not verify_generation(gen_copy).ok
    path.write_bytes(full)
    assert verify_generation(gen_copy).ok


def test_skip_policy_counts_skips_and_stops_after_consecutive_failures(gen_copy):
    m, st, sh, path = _first_shard(gen_copy)
    data = bytearray(path.read_bytes())
    g = sh.groups[0]
    data[g.offset : g.offset + 512] = b"\0" * 512  # wipe the first member header of a group
    path.write_bytes(bytes(data))
    ids, skipped = _read_all(gen_copy, on_error="skip", shuffle=False)
    assert len(skipped) >= g.samples and len(ids) == m.totals["samples"] - len(skipped)
    with pytest.raises(ShardError):
        _read_all(gen_copy, on_error="raise", shuffle=False)
    for grp in sh.groups:  # now every group of the shard is broken: the cap stops the run
        data[grp.offset : grp.offset + 512] = b"\0" * 512
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="consecutive"):
        list(
            GroupDataset(
                gen_copy,
                RankInfo(rank=st.rank, world_size=m.dp),
                on_error="skip",
                max_consecutive_errors=0,
                shuffle=False,
            )
        )


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda t: "", "empty manifest"),
        (lambda t: t[: len(t) // 2], "invalid JSON"),
        (
            lambda t: json.dumps(
                {**json.loads(t), "totals": {**json.loads(t)["totals"], "samples": 1}}
            ),
            "totals.samples",
        ),
        (lambda t: json.dumps({**json.loads(t), "format_version": 99}), "format version"),
        (
            lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "layout"}),
            "missing field 'layout'",
        ),
    ],
)
def test_corrupt_manifest_fails_at_open(gen_copy, edit, match):
    p = _gen_dir(gen_copy) / "manifest.json"
    p.write_text(edit(p.read_text()))
    with pytest.raises(ManifestError, match=match):
        open_generation(gen_copy)
    assert main(["verify", str(gen_copy)]) == 1


def test_sample_count_disagreeing_with_the_shard(gen_copy):
    p = _gen_dir(gen_copy) / "manifest.json"
    raw = json.loads(p.read_text())
    sh = raw["streams"][0]["shards"][0]
    sh["groups"][0][1] += 1  # the manifest claims one sample more in this group
    sh["samples"] += 1
    raw["totals"]["samples"] += 1
    raw["report"]["counts"]["out"] += 1  # consistent everywhere but in the tar itself
    p.write_text(json.dumps(raw))
    m = open_generation(gen_copy)
    with pytest.raises(ShardError, match="the manifest says"):
        read_group(m.path, m.streams[0].shards[0], m.streams[0].shards[0].groups[0])


def test_missing_shard_fails_fast_and_deterministically(gen_copy):
    _, _, _sh, path = _first_shard(gen_copy)
    path.unlink()
    for _ in range(2):
        t0 = time.perf_counter()
        with pytest.raises(ManifestError, match="missing"):
            open_generation(gen_copy)
        assert time.perf_counter() - t0 < 5


def _tar(members: list[tuple]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data, kind in members:
            ti = tarfile.TarInfo(name)
            if kind == "sym":
                ti.type, ti.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _install(root: Path, data: bytes, n_samples: int) -> None:
    """Replace the first group of the first shard by ``data`` (a tar), with a manifest that
    matches it everywhere (the shard's other groups are kept, moved to after it)."""
    gen = _gen_dir(root)
    p = gen / "manifest.json"
    raw = json.loads(p.read_text())
    sh = raw["streams"][0]["shards"][0]
    old = (gen / sh["file"]).read_bytes()
    (step, first, _off, _len), *rest = sh["groups"]
    body = data[: len(data) - 1024]  # without its end-of-archive blocks
    tail_start = rest[0][2] if rest else len(old)
    new = body + old[tail_start:]
    (gen / sh["file"]).write_bytes(new)
    shift = len(body) - tail_start
    sh.update(
        bytes=len(new),
        sha256=hashlib.sha256(new).hexdigest(),
        samples=sh["samples"] - first + n_samples,
        groups=[[step, n_samples, 0, len(body)]] + [[a, b, o + shift, n] for a, b, o, n in rest],
    )
    raw["totals"]["samples"] += n_samples - first
    raw["totals"]["bytes"] += len(new) - len(old)
    raw["report"]["counts"]["out"] += n_samples - first
    p.write_text(json.dumps(raw))


def _doc(sample_id: str, images: list[str], **fields) -> bytes:
    """A sample document as the writer writes it (shards/format/sample_doc.py), with ``fields`` changed."""
    n = len(images)
    cost = {"num_images": n, "vit_tokens": 256 * n, "vit_seq_lens": [256] * n, "llm_tokens": 9,
            "text_tokens": 3, "modality": "image" if n else "text", "image_widths": [448] * n,
            "image_heights": [448] * n}  # fmt: skip
    doc = {"sample_id": sample_id, "source": "t", "images": images, "turns": [["user", "hi"]],
           "cost": cost, "step": 0, "group_id": 0, "rank": 0}  # fmt: skip
    return json.dumps({**doc, **fields}).encode()


_J = _doc("x", [])


@pytest.mark.parametrize(
    ("members", "match"),
    [
        ([("../evil.json", _J, "f")], "leaves the archive"),
        ([("/abs.json", _J, "f")], "leaves the archive"),
        ([("link.json", b"", "sym")], "link"),
        ([("a.json", _J, "f"), ("a.json", _J, "f")], "duplicate"),
        ([("a.json", _J, "f"), ("a.pyd", b"\x80\x04K\x01.", "f")], "unaccepted"),
        (
            [("a.json", _doc("a", ["0.jpg"]), "f")],
            "incomplete",
        ),
        # image members the json does not list: a sample holds exactly what it names
        ([("a.json", _J, "f"), ("a.0.jpg", b"\xff\xd8", "f")], "incomplete"),
        (
            [
                ("a.json", _doc("a", ["0.jpg"]), "f"),
                ("a.0.jpg", b"\xff\xd8", "f"),
                ("a.1.jpg", b"\xff\xd8", "f"),
            ],
            "incomplete",
        ),
    ],
)
def test_hostile_or_malformed_members_are_rejected(gen_copy, members, match):
    _install(gen_copy, _tar(members), 1)
    m = open_generation(gen_copy)
    with pytest.raises(ShardError, match=match):
        read_group(m.path, m.streams[0].shards[0], m.streams[0].shards[0].groups[0])
    assert not verify_generation(gen_copy).ok


def test_verify_fast_checks_checksums_only_and_the_default_reads_every_group(gen_copy, capsys):
    """``--fast``'s meaning is computed (``deep=not args.fast``): a generation whose shards
    all match their sha256 but whose manifest cuts a group's byte range short passes
    ``verify --fast`` and fails ``verify``, each by its exit code and summary."""
    import json

    gen = gen_copy / (gen_copy / "CURRENT").read_text().strip()
    raw = json.loads((gen / "manifest.json").read_text())
    g = raw["streams"][0]["shards"][0]["groups"]
    g[0][3] -= 1024  # the group's range ends inside its last member: a cut sample there
    (gen / "manifest.json").write_text(json.dumps(raw))
    assert main(["verify", str(gen_copy), "--fast", "--json"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert fast["status"] == "ok"
    assert main(["verify", str(gen_copy), "--json"]) == 1
    deep = json.loads(capsys.readouterr().out)
    assert deep["status"] != "ok" and deep["problems"]
