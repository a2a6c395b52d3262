"""A manifest whose structure would make the loader deliver fewer samples is refused at open and
by verify (checksums alone cannot see it: the manifest is what they are checked against); paths
stay inside the generation; skip mode never delivers a group holding more samples than written;
and an undecodable sample is skipped whole while the step still happens."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest

from equishard.cli import main
from shards import Collator
from shards.read.dataset import GroupDataset, RankInfo, open_generation
from shards.read.verify import verify_generation
from shards.store.manifest import ManifestError
from tests.shards.read.test_integrity import _install, _read_all, _tar


def _gen_dir(root: Path) -> Path:
    return root / (root / "CURRENT").read_text().strip()


def _edit(root: Path, fn) -> None:
    p = _gen_dir(root) / "manifest.json"
    raw = json.loads(p.read_text())
    fn(raw)
    p.write_text(json.dumps(raw))


def _lower_steps(raw):
    raw["layout"]["steps"] -= 1
    raw["report"]["counts"]["steps"] -= 1


def _shard_with_groups(raw) -> dict:
    return next(sh for st in raw["streams"] for sh in st["shards"] if len(sh["groups"]) >= 2)


def _same_step_twice(raw):
    groups = _shard_with_groups(raw)["groups"]
    groups[1][0] = groups[0][0]


def _drop_group(raw):
    """Remove one group and adjust every count, so only the structure gives it away."""
    sh = _shard_with_groups(raw)
    _step, n, _off, _len = sh["groups"].pop(1)
    sh["samples"] -= n
    raw["totals"]["samples"] -= n
    raw["totals"]["groups"] -= 1
    raw["report"]["counts"]["out"] -= n
    raw["report"]["counts"]["groups"] -= 1


def _overlapping_groups(raw):
    """The second group starts inside the first (a reader would hand some bytes out twice)."""
    groups = _shard_with_groups(raw)["groups"]
    groups[1][2] = groups[0][2] + groups[0][3] - 512


def _group_past_its_shard(raw):
    sh = _shard_with_groups(raw)
    sh["groups"][-1][3] = sh["bytes"]  # its range runs past the shard's end


def _dotdot_path(raw):
    raw["streams"][0]["shards"][0]["file"] = "../outside.tar"


def _absolute_path(raw):
    raw["streams"][0]["shards"][0]["file"] = "/etc/passwd"


def _rank_twice(raw):
    raw["streams"][1]["rank"] = 0


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_lower_steps, "outside 0"),
        (_same_step_twice, "one group per step"),
        (_drop_group, "no group for step"),
        (_overlapping_groups, "overlapping the group before it"),
        (_group_past_its_shard, "outside the shard's"),
        (_dotdot_path, "leaves the generation"),
        (_absolute_path, "leaves the generation"),
        (_rank_twice, "once each"),
    ],
)
def test_structure_is_checked_at_open_and_by_verify(gen_copy, edit, match, capsys):
    before, _ = _read_all(gen_copy, shuffle=False)
    _edit(gen_copy, edit)
    with pytest.raises(ManifestError, match=match):
        open_generation(gen_copy)
    r = verify_generation(gen_copy)
    assert not r.ok and match.split()[0] in r.problems[0]
    assert main(["verify", str(gen_copy)]) == 1
    assert len(before) == len(set(before))  # the untampered generation delivered every sample


@pytest.mark.parametrize("name", ["../elsewhere", "/tmp", ".staging-x", "a/b"])
def test_current_must_name_a_generation_inside_the_root(gen_copy, name):
    (gen_copy / "CURRENT").write_text(name + "\n")
    with pytest.raises(ManifestError, match="not a generation inside"):
        open_generation(gen_copy)
    assert not verify_generation(gen_copy).ok


def test_symlinked_shard_leading_out_is_refused(gen_copy, tmp_path):
    gen = _gen_dir(gen_copy)
    raw = json.loads((gen / "manifest.json").read_text())
    f = gen / raw["streams"][0]["shards"][0]["file"]
    outside = tmp_path / "outside.tar"
    outside.write_bytes(f.read_bytes())
    f.unlink()
    f.symlink_to(outside)
    with pytest.raises(ManifestError, match="resolves outside"):
        open_generation(gen_copy)


def test_skip_mode_never_delivers_a_group_with_more_samples_than_written(gen_copy):
    j = lambda k: json.dumps({"sample_id": k, "images": [], "turns": [["user", "hi"]]}).encode()  # noqa: E731
    _install(gen_copy, _tar([(f"k{i}.json", j(f"extra-{i}"), "file") for i in range(3)]), 3)
    p = _gen_dir(gen_copy) / "manifest.json"
    raw = json.loads(p.read_text())
    raw["streams"][0]["shards"][0]["groups"][0][1] = 2  # the manifest says 2, the tar holds 3
    raw["streams"][0]["shards"][0]["samples"] -= 1
    raw["totals"]["samples"] -= 1
    raw["report"]["counts"]["out"] -= 1
    p.write_text(json.dumps(raw))
    ids, skipped = _read_all(gen_copy, on_error="skip", shuffle=False)
    assert not any(i.startswith("extra-") for i in ids)
    assert len(skipped) == 2 and "the manifest says 2" in skipped[0]


def _corrupt_one_image(root: Path) -> str:
    """Replace one image member by bytes with a valid JPEG header and garbage after it (the tar,
    its checksum and the manifest stay consistent): a loader-side decode failure."""
    import tarfile

    gen = _gen_dir(root)
    raw = json.loads((gen / "manifest.json").read_text())
    for st in raw["streams"]:
        for sh in st["shards"]:
            path = gen / sh["file"]
            data = bytearray(path.read_bytes())
            with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tf:
                for m in tf:
                    if m.name.endswith(".jpg") and m.size > 2000:
                        start = m.offset_data + 600
                        data[start : m.offset_data + m.size - 2] = b"\x00" * (m.size - 602)
                        path.write_bytes(bytes(data))
                        sh["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
                        (gen / "manifest.json").write_text(json.dumps(raw))
                        return m.name.split(".")[0]
    raise AssertionError("no JPEG member found")


def test_undecodable_image_is_skipped_whole_and_the_step_still_happens(gen_copy, gen_inputs):
    demo, _cost, _plan = gen_inputs
    key = _corrupt_one_image(gen_copy)
    m = open_generation(gen_copy)
    collate = Collator(tokenizer=str(demo / "tokenizer.json"))
    steps, skipped, got = {}, [], []
    for r in range(m.dp):
        ds = GroupDataset(
            gen_copy, RankInfo(rank=r, world_size=m.dp), on_error="skip", transform=collate
        )
        batches = list(ds)
        steps[r] = len(batches)
        for b in batches:
            skipped += b["skipped"]
            got += b["samples"]["sample_ids"]
    assert len(set(steps.values())) == 1  # every rank ran every step
    assert len(skipped) == 1 and key in skipped[0]
    assert len(got) == m.totals["samples"] - 1 and len(set(got)) == len(got)
    with pytest.raises(OSError):
        for r in range(m.dp):
            list(GroupDataset(gen_copy, RankInfo(rank=r, world_size=m.dp), transform=collate))
