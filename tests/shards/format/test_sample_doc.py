"""A sample's ``.json`` document is outside data for every reader that does not verify the shard
(the loader's default, peer readers, a night reusing a parent it did not write): each field a
consumer reads is checked where it enters (shards/format/sample_doc.py), and a document that is not the
writer's, or that says another place than the one it is read from, is that sample's error.

Anchors: every document a real write produced passes (read back with ``tarfile`` alone); each
hostile document below crashed the loader with AttributeError/TypeError before the check (also in
``on_error="skip"``, which must skip it); a sample moved to another step or position read as if
it belonged there."""

from __future__ import annotations

import json
import tarfile

import pytest

from shards.format.sample_doc import SampleDocError, check_place, parse_sample_doc, sample_key
from shards.read.dataset import GroupDataset, RankInfo, open_generation
from shards.read.reader import ShardError, read_group
from tests.shards.read.test_integrity import _doc, _install, _tar

_IMG = b"\xff\xd8\xff\xe0" + b"\x00" * 16  # read as bytes: the loader decodes nothing


def test_every_document_a_write_made_passes(generation):
    m = open_generation(generation)
    n = 0
    for st in m.streams:
        for sh in st.shards:
            with tarfile.open(m.path / sh.file) as tf:
                docs = [
                    (mem.name[: -len(".json")], tf.extractfile(mem).read())
                    for mem in tf
                    if mem.name.endswith(".json")
                ]
            first = 0
            for g in sh.groups:
                for pos, (key, raw) in enumerate(docs[first : first + g.samples]):
                    doc = parse_sample_doc(raw, key)
                    check_place(doc, key, g.step, pos, key)
                    n += 1
                first += g.samples
    assert n == m.totals["samples"] > 0


def _hostile(step: int) -> dict:
    good = json.loads(_doc("a", ["0.jpg"], step=step))
    deep = b"[" * 100_000 + b"]" * 100_000
    return {
        "a JSON list": b"[1, 2]",
        "null": b"null",
        "not UTF-8": b'{"sample_id": "\xff"}',
        "deeply nested": deep,
        "images a string": _edit(good, images="0.jpg"),
        "images unhashable": _edit(good, images=[["0.jpg"]]),
        "image name with a path": _edit(good, images=["../0.jpg"]),
        "sample_id missing": _edit(good, sample_id=None),
        "turns not pairs": _edit(good, turns=[["user"]]),
        "one turn's text not a string": _edit(good, turns=[["user", "hi"], ["assistant", 5]]),
        "source a number": _edit(good, source=5),
        "a role prep never writes": _edit(good, turns=[["tool", "hi"]]),
        "cost missing": _edit(good, cost=None),
        "cost a count as text": _edit(good, cost={**good["cost"], "llm_tokens": "9"}),
        "cost a bool": _edit(good, cost={**good["cost"], "vit_tokens": True}),
        "cost negative": _edit(good, cost={**good["cost"], "text_tokens": -1}),
        "cost a list where a count is": _edit(good, cost={**good["cost"], "num_images": [1]}),
        "cost lengths as text": _edit(good, cost={**good["cost"], "vit_seq_lens": ["256"]}),
        "step not a number": _edit(good, step="0"),
    }


def _edit(doc: dict, **fields) -> bytes:
    out = {**doc, **fields}
    return json.dumps({k: v for k, v in out.items() if v is not None}).encode()


@pytest.mark.parametrize("case", list(_hostile(0)))
def test_a_hostile_document_is_that_samples_error(gen_copy, case):
    m = open_generation(gen_copy)
    sh = m.streams[0].shards[0]
    step = sh.groups[0].step
    key = sample_key(step, 0, "a")
    _install(
        gen_copy, _tar([(f"{key}.json", _hostile(step)[case], "f"), (f"{key}.0.jpg", _IMG, "f")]), 1
    )
    m = open_generation(gen_copy)
    sh = m.streams[0].shards[0]
    with pytest.raises(
        ShardError, match=rf"sample '{key}'.*(not JSON|not a sample document|incomplete)"
    ):
        read_group(m.path, sh, sh.groups[0])
    got, errors = read_group(m.path, sh, sh.groups[0], keep_going=True)
    assert got == [] and len(errors) == 1 and key in errors[0]
    # the loader in skip mode skips it and delivers the rest of the rank's samples
    st = m.streams[0]
    batches = list(GroupDataset(gen_copy, RankInfo(rank=st.rank, world_size=m.dp), on_error="skip"))
    assert sum(len(b["skipped"]) for b in batches) == 1
    assert sum(len(b["samples"]) for b in batches) == st.samples - 1


def test_a_valid_document_read_at_its_place_passes(gen_copy):
    m = open_generation(gen_copy)
    step = m.streams[0].shards[0].groups[0].step
    key = sample_key(step, 0, "a")
    _install(
        gen_copy,
        _tar([(f"{key}.json", _doc("a", ["0.jpg"], step=step), "f"), (f"{key}.0.jpg", _IMG, "f")]),
        1,
    )
    m = open_generation(gen_copy)
    sh = m.streams[0].shards[0]
    (s,), _ = read_group(m.path, sh, sh.groups[0])
    assert s.meta["sample_id"] == "a" and s.images == [_IMG]


@pytest.mark.parametrize(
    ("where", "match"),
    [
        ("step", "belongs elsewhere"),
        ("position", "belongs elsewhere"),
        ("key", "belongs elsewhere"),
    ],
)
def test_a_sample_from_another_place_is_refused(gen_copy, where, match):
    """Well-formed samples, framed and counted right, but from another step (the document and
    the key say step+1), swapped within the group, or under another sample's key."""
    m = open_generation(gen_copy)
    step = m.streams[0].shards[0].groups[0].step
    if where == "step":
        members = [(f"{sample_key(step + 1, 0, 'a')}.json", _doc("a", [], step=step + 1), "f")]
    elif where == "position":
        members = [
            (f"{sample_key(step, 1, 'b')}.json", _doc("b", [], step=step), "f"),
            (f"{sample_key(step, 0, 'a')}.json", _doc("a", [], step=step), "f"),
        ]
    else:
        members = [(f"{sample_key(step, 0, 'a')}.json", _doc("b", [], step=step), "f")]
    _install(gen_copy, _tar(members), len(members))
    m = open_generation(gen_copy)
    sh = m.streams[0].shards[0]
    with pytest.raises(ShardError, match=match):
        read_group(m.path, sh, sh.groups[0])


def test_parse_names_the_field():
    with pytest.raises(SampleDocError, match=r"here: .*'images' is not a list"):
        parse_sample_doc(_edit(json.loads(_doc("a", [])), images={"0.jpg": 1}), "here")
    # a document a peer reader already decoded is checked the same way
    with pytest.raises(SampleDocError, match="'turns'"):
        parse_sample_doc({**json.loads(_doc("a", [])), "turns": "hi"}, "here")


def _replace_docs(gen, keep_valid: bool = False) -> list[str]:
    """Every sample document of the generation's first shard of each stream made a JSON list of
    the same length, and the manifest's sha256 made to match: a parent consistent with its
    manifest whose documents are not the writer's. Returns the shards changed."""
    import hashlib

    p = gen / "manifest.json"
    raw = json.loads(p.read_text())
    changed = []
    for st in raw["streams"]:
        sh = st["shards"][0]
        path = gen / sh["file"]
        data = bytearray(path.read_bytes())
        with tarfile.open(path) as tf:
            for mem in tf:
                if mem.name.endswith(".json"):
                    data[mem.offset_data : mem.offset_data + mem.size] = b"[]".ljust(mem.size)
        path.write_bytes(bytes(data))
        sh["sha256"] = hashlib.sha256(data).hexdigest()
        changed.append(sh["file"])
    p.write_text(json.dumps(raw))
    return changed


def test_a_night_refuses_parent_documents_that_are_not_the_writers(root):
    """A night takes the parent's kept groups and unchanged samples from its shards, which
    match the parent's manifest. Their documents are checked as the loader checks them (bug: a
    kept group was copied as it was, publishing a generation whose samples cannot be read; a
    moved group or an unchanged sample crashed the night with AttributeError/KeyError)."""
    from shards.errors import WriteError
    from shards.nightly.rebalance import run_rebalance
    from shards.store.publish import read_current
    from tests.shards.night_helpers import _night

    before = read_current(root)
    changed = _replace_docs(root / before)
    with pytest.raises(WriteError, match="not a sample document") as err:
        run_rebalance(_night(root, 2))
    assert any(f in str(err.value) for f in changed)
    assert read_current(root) == before


@pytest.mark.parametrize("damage", ["documents", "other samples"])
@pytest.mark.parametrize("moved", [False, True])
def test_a_kept_group_is_copied_only_when_it_holds_the_plans_readable_samples(
    gen_copy, damage, moved
):
    """copy_group alone, on a parent consistent with its manifest: a group that keeps its step
    was copied byte for byte, unchecked (bug: its broken documents, or samples the plan does not
    put there, were published in the new generation under a valid manifest)."""
    import io

    from shards.errors import WriteError
    from shards.write.parent import copy_group

    m = open_generation(gen_copy)
    st = m.streams[0]
    sh = st.shards[0]
    grp = next(g for g in sh.groups if g.samples >= 2)
    ids = [s.meta["sample_id"] for s in read_group(m.path, sh, grp)[0]]
    if damage == "documents":
        _replace_docs(m.path)
        sh = open_generation(gen_copy).streams[0].shards[0]
    else:
        ids = ids[::-1]  # the plan puts them there in another order: not this group
    src = {"gen_dir": str(m.path), "file": sh.file, "bytes": sh.bytes, "sha256": sh.sha256,
           "samples": sh.samples, "group": [grp.step, grp.samples, grp.offset, grp.length]}  # fmt: skip
    g = {"from": src, "step": grp.step + moved, "group_id": 0,
         "samples": [{"sample_id": i} for i in ids]}  # fmt: skip
    with (
        tarfile.open(fileobj=io.BytesIO(), mode="w") as tf,
        pytest.raises(WriteError, match=r"not a sample document|does not hold"),
    ):
        copy_group(tf, g, st.rank)
