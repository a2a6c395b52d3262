"""The hostile end-to-end run on an object-store root and a nightly rebalance (issue #37), the
commands as users run them (each under a timeout, credentials and endpoint from the
environment, against the local S3 server): hostile length files, a hostile template, tampered
manifest fields, a poisoned cache, a damaged leftover before a resumed publish, a hostile key
beside a generation, and two nights at once. At every stage: nothing is written outside its
root, nothing corrupt is delivered as valid, in = written + rejected, nothing hangs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from equishard.contracts.cost_table import errors_path
from shards.read.dataset import GroupDataset, RankInfo
from shards.store.manifest import load_manifest, open_generation
from shards.store.object_store import publish_generation, read_remote_current
from tests.shards.conftest import s3_env, s3fs_of

pytest.importorskip("s3fs")


def _cli(env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "equishard", *args], capture_output=True,
                       text=True, env=env, timeout=timeout)  # fmt: skip
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r


def _tree(path: Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.rglob("*")}


def _outside(before: set[str], after: set[str], *roots: str) -> set[str]:
    """New paths that lie under none of ``roots`` (relative to the test's directory)."""
    return {p for p in after - before if not any(p == r or p.startswith(r + "/") for r in roots)}


def _ids(ds) -> list[str]:
    return sorted(s.meta["sample_id"] for b in ds for s in b["samples"])


def test_hostile_store_and_nights_through_every_stage(s3, root, tmp_path):
    env = {**s3_env(s3), "EQUISHARD_TEMPLATE_SECONDS": "1", "EQUISHARD_STORE_TIMEOUT": "10"}
    fs = s3fs_of(s3)
    url = "s3://bkt/hostile-e2e"
    raw = root.parent / "raw"
    seen = _tree(tmp_path)

    # 1. hostile length files: every entry is written or its file-naming errors row
    lengths = tmp_path / "in" / "lengths.jsonl"
    lengths.parent.mkdir()
    entries = [json.dumps({"vit_num": 2, "token_num": 600, "image_flags": 2})] * 4
    entries += ['{"vit_num": 4294967301, "token_num": 9, "image_flags": 1}', "{cut", '"x"']
    lengths.write_text("\n".join(entries) + "\n")
    out = tmp_path / "imp" / "cost.parquet"
    r = _cli(env, "import-lengths", str(lengths), "-o", str(out))
    assert r.returncode == 0, r.stderr
    errs = pq.read_table(errors_path(out)).to_pylist()
    assert pq.read_table(out).num_rows == 4 and len(errs) == 3
    assert all(str(lengths) in e["detail"] for e in errs)

    # 2. a hostile template: the looping sample is its row, the others are measured
    tpl = tmp_path / "in" / "t.jinja"
    tpl.write_text(
        "{% for m in messages %}{% if 'LOOP' in (m.content[0].text or '') %}"
        "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}"
        "{% endif %}{{ m.role }}: {% for c in m.content %}{% if c.type == 'image' %}"
        "<|image_pad|>{% else %}{{ c.text }}{% endif %}{% endfor %}\n{% endfor %}"
    )
    day = [json.loads(x) for x in (raw / "day-2.jsonl").read_text().splitlines()][:6]
    day[2]["conversations"][0]["value"] = "LOOP " + day[2]["conversations"][0]["value"]
    data = tmp_path / "in" / "d.jsonl"
    data.write_text("\n".join(json.dumps(x) for x in day) + "\n")
    cost = tmp_path / "tpl" / "cost.parquet"
    r = _cli(env, "prep", str(data), "--tokenizer", str(raw / "tokenizer.json"), "--template",
             f"{tpl}#images=qwen2vl", "--vision-policy", "qwen2vl", "--image-root", str(raw),
             "--max-error-rate", "0.5",
             "--json", "-o", str(cost), timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert (s["n_in"], s["n_written"], s["n_rejected"]) == (6, 5, 1)
    assert s["reasons"] == {"template_limit": 1}

    # 3. the root on the store, its upload resumed over a damaged leftover of the right size
    gen = (root / "CURRENT").read_text().strip()
    shard = load_manifest(root / gen).streams[0].shards[0]
    good = (root / gen / shard.file).read_bytes()
    fs.pipe_file(f"{url[5:]}/{gen}/{shard.file}", bytes(b ^ 0x20 for b in good))
    publish_generation(root / gen, url, storage_options=s3["opts"])
    r = _cli(env, "verify", url)
    assert r.returncode == 0, r.stdout + r.stderr

    # 4. a poisoned cache and a flipped range part: what is delivered is the store's bytes
    cache = tmp_path / "cache"
    info = RankInfo(rank=0, world_size=2)
    opts = dict(storage_options=s3["opts"], cache_dir=cache, shuffle=False)
    want = _ids(GroupDataset(url, info, verify=True, **opts))
    for p in cache.rglob("*"):
        if p.is_file():
            data_ = bytearray(p.read_bytes())
            data_[len(data_) // 3] ^= 0xFF
            p.write_bytes(bytes(data_))
    assert _ids(GroupDataset(url, info, verify=True, **opts)) == want
    assert _ids(GroupDataset(url, info, **opts)) == want

    # 5. tampered manifest fields in a copy of the generation: refused at open, by the CLI too
    bad_url = "s3://bkt/hostile-e2e-tampered"
    publish_generation(root / gen, bad_url, storage_options=s3["opts"])
    key = f"{bad_url[5:]}/{gen}/manifest.json"
    m = json.loads(fs.cat_file(key))
    m["streams"][0]["shards"][0]["sha256"] = "../../../../escaped"
    m["parent"] = "../../etc"
    fs.pipe_file(key, json.dumps(m).encode())
    r = _cli(env, "verify", bad_url)
    assert r.returncode != 0 and "sha256" in r.stdout + r.stderr
    with pytest.raises(ValueError, match="not a sha256 digest"):
        open_generation(bad_url, storage_options=s3["opts"], cache_dir=cache)

    # 6. a key beside the generation that would leave the staging root, then two nights at once
    fs.pipe_file(f"{url[5:]}/{gen}/stray-object", b"not named by the manifest")
    procs = []
    for k, d in ((0, 2), (1, 3)):
        cmd = [sys.executable, "-m", "equishard", "rebalance", "--current", url, "--new",
               str(raw / f"day-{d}.jsonl"), "--delete", str(raw / f"day-{d}.delete"),
               "--staging", str(tmp_path / f"stage{k}"), "--json"]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))  # fmt: skip
    published = []
    for p in procs:
        o, e = p.communicate(timeout=300)
        assert "Traceback" not in e, e[-3000:]
        if p.returncode == 0:
            published.append(json.loads(o)["generation"])
        else:
            assert p.returncode == 1 and "another writer moved CURRENT" in e, e[-2000:]
    assert published
    chain, g = [], read_remote_current(url, storage_options=s3["opts"])
    while g:
        chain.append(g)
        g = open_generation(f"{url}/{g}", storage_options=s3["opts"]).parent
    assert set(published) <= set(chain) and gen in chain
    r = _cli(env, "verify", url)
    assert r.returncode == 0, r.stdout + r.stderr
    for k in (0, 1):
        for d in (tmp_path / f"stage{k}").glob("gen-*"):
            assert not (d / "stray-object").exists()

    # nothing was written outside the roots each stage was given
    stray = _outside(seen, _tree(tmp_path), "in", "imp", "tpl", "cache", "stage0", "stage1")
    assert not stray, sorted(stray)[:10]
