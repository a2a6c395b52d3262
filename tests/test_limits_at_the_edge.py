"""Every documented limit at, one below and one above it (a held-out set of realistic bugs
found 8 of its 20 misses here: the tests checked well inside and well outside each limit, so a
``<`` written for ``<=``, or a limit off by one, passed). The value at the limit is taken, the
one below too, the one above refused with a ValueError naming the setting."""

from __future__ import annotations

import os
import uuid

import fsspec
import pytest

from dataprep.demo import MAX_DEMO_SAMPLES, make_demo
from shards.store.storage import GenerationFiles
from shards.store.store_limits import (
    MAX_RETRIES,
    MAX_TIMEOUT,
    RETRIES_ENV,
    TIMEOUT_ENV,
    store_limits,
)
from shards.write.write_config import MAX_SHARD_SIZE, WriteConfig

SIDES = ("below", "at", "above")


def _edge(limit, side, step=1):
    return {"below": limit - step, "at": limit, "above": limit + step}[side]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(
    ("env", "limit", "step", "upper"),
    [
        (TIMEOUT_ENV, MAX_TIMEOUT, 0.001, True),
        (RETRIES_ENV, MAX_RETRIES, 1, True),
        (RETRIES_ENV, 1, 1, False),  # the lower limit: one try
    ],
    ids=["timeout-3600s", "retries-100", "retries-1"],
)
def test_store_limits_from_the_environment(monkeypatch, env, limit, step, upper, side):
    value = _edge(limit, side, step)
    monkeypatch.setenv(env, repr(value) if isinstance(value, float) else str(value))
    refused = side == ("above" if upper else "below")
    if refused:
        with pytest.raises(ValueError, match=env):
            store_limits()
    else:
        timeout, retries = store_limits()
        assert (timeout if env == TIMEOUT_ENV else retries) == value


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(
    ("flag", "limit", "step"),
    [("--store-timeout", MAX_TIMEOUT, 0.5), ("--store-retries", MAX_RETRIES, 1)],
)
def test_store_flags(monkeypatch, capsys, tmp_path, flag, limit, step, side):
    """The CLI's own check of the flags (it names the flag, not the variable)."""
    from equishard.cli import main

    for var in (TIMEOUT_ENV, RETRIES_ENV):
        monkeypatch.delenv(var, raising=False)
    value = _edge(limit, side, step)
    code = main(["verify", str(tmp_path / "none"), flag, str(value)])
    err = capsys.readouterr().err
    if side == "above":
        assert code == 2 and flag in err, err
    else:  # taken: the command goes on to its own refusal of the missing root
        assert flag not in err and "none" in err, err
        assert os.environ[TIMEOUT_ENV if "timeout" in flag else RETRIES_ENV] == repr(value)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(("limit", "upper"), [(1024, False), (MAX_SHARD_SIZE, True)])
def test_shard_size(tmp_path, limit, upper, side):
    value = _edge(limit, side)
    cfg = {"plan_dir": str(tmp_path / "plan"), "cost_table": str(tmp_path / "c.parquet")}
    refused = side == ("above" if upper else "below")
    with pytest.raises(ValueError) as e:  # taken: refused next for the missing plan
        WriteConfig(**cfg, out=str(tmp_path / "out"), shard_size=value)
    assert ("--shard-size" in str(e.value)) == refused, str(e.value)


@pytest.mark.parametrize("side", SIDES)
def test_demo_samples(tmp_path, side):
    """At the limit the count is taken (the run then fails at its first write: the output is
    below a file, so no 10M-sample demo is made)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    value = _edge(MAX_DEMO_SAMPLES, side)
    if side == "above":
        with pytest.raises(ValueError, match="samples"):
            make_demo(blocker / "out", samples=value)
    else:
        with pytest.raises(OSError):
            make_demo(blocker / "out", samples=value)


@pytest.mark.parametrize("side", SIDES)
def test_a_listing_at_its_limit_is_taken_one_more_refused(side):
    """A generation of 0 files may be listed with 1,000 objects (4 per file plus 1,000)."""
    from shards.store.store_limits import listing_limit

    limit = listing_limit(0)
    fs = fsspec.filesystem("memory")
    root = f"/edge-{uuid.uuid4().hex}"
    n = _edge(limit, side)
    for i in range(n):
        fs.pipe(f"{root}/gen/f{i:05d}", b"x")
    files = GenerationFiles(f"memory://{root.lstrip('/')}/gen")
    try:
        if side == "above":
            with pytest.raises(OSError, match=f"more than {limit} objects"):
                files.sizes(0)
        else:
            assert len(files.sizes(0)) == n
    finally:
        fs.rm(root, recursive=True)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", ["pp", "virtual_stages"])
def test_pipeline_stages(name, side):
    """At 1024 stages the count is taken (the run is then refused for another reason: its
    partition search or a missing generation), past it refused naming the field."""
    from trainer_adapter.train.config import MAX_STAGES, TrainConfig

    value = _edge(MAX_STAGES, side)
    try:
        TrainConfig(shards="/nonexistent", dp=1, **{name: value, "partition_radius": 0})
        err = ""
    except ValueError as exc:
        err = str(exc)
    assert (f"{name} must be" in err) == (side == "above"), err
