"""A plan over partitions (``balance --partitions P``, ``--engine ray``).

Anchors: the one-process step assignment (``assign_steps``) run over the same ISF groups gives
every sample the same step, node and rank as the driver's assembly from group statistics; the
one-process plan's caps and (on larger tables) its dist ratios; a plain slice of the table for
the rows a worker reads. Bugs each test catches: a worker reading a neighbour's rows or one row
too few at a row-group edge; a group's rows split or out of table order when merged from
partitions; the last step's samples lost or doubled across partitions; caps drawn from other
rows than the one-process plan's; an id repeated across two partitions not seen (each worker
sees only its own); a table the engine cannot plan correctly (audio, refined steps) planned
anyway.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancing.isf import isf_group
from balancing.loads import sample_loads
from balancing.partitioned import build_partitioned_plan
from balancing.parts import BalanceEngine, LocalParts, partition_bounds
from balancing.plan import BalanceConfig, build_plan, isf_params
from balancing.steps import assign_steps
from bench._internvl import resampled
from bench._mixed import mixed_cost_table
from equishard.contracts.cost_table import read_cost_rows, read_cost_table


def _write(tmp_path, table, rows_per_group=None, name="cost.parquet"):
    path = tmp_path / name
    pq.write_table(table, path, row_group_size=rows_per_group)
    return str(path)


def _plan(path, cfg, parts):
    bounds = partition_bounds(pq.read_metadata(path).num_rows, parts)
    with LocalParts(path, bounds, cfg.cost_model) as workers:
        result = build_partitioned_plan(path, cfg, workers, bounds)
        return result, result.rows.table()


def _tiles_table(tiles, llm, text) -> pa.Table:
    """A cost table of 1,024-token tiles per sample (``tiles``), LLM and text tokens given."""
    n = len(tiles)
    return pa.table(
        {
            "sample_id": [f"s{i}" for i in range(n)],
            "source": ["t"] * n,
            "num_images": pa.array(np.minimum(tiles, 1), pa.int32()),
            "vit_tokens": np.asarray(tiles) * 1024,
            "vit_seq_lens": pa.array([[1024] * int(k) for k in tiles], pa.list_(pa.int32())),
            "llm_tokens": np.asarray(llm),
            "text_tokens": np.asarray(text),
        }
    )


OFF = {"refine_steps": "off"}


@pytest.mark.parametrize(("n", "parts"), [(1, 1), (7, 1), (7, 6), (7, 7), (10, 3)])
def test_partition_bounds_cover_every_row_once_as_evenly_as_can_be(n, parts):
    bounds = partition_bounds(n, parts)
    assert bounds[0][0] == 0 and bounds[-1][1] == n and len(bounds) == parts
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


@pytest.mark.parametrize(("n", "parts"), [(7, 8), (7, 0), (0, 2)])
def test_partition_bounds_refuse_more_partitions_than_rows(n, parts):
    with pytest.raises(ValueError, match="partitions"):
        partition_bounds(n, parts)


def test_the_engine_options_are_checked_at_and_past_their_limits():
    from balancing.parts import MAX_PARTITIONS

    assert BalanceEngine(partitions=1).partitioned and BalanceEngine(engine="ray").partitioned
    assert not BalanceEngine().partitioned
    BalanceEngine(partitions=MAX_PARTITIONS)
    for bad in (0, MAX_PARTITIONS + 1, 2.5, True):
        with pytest.raises(ValueError, match="--partitions"):
            BalanceEngine(partitions=bad)
    with pytest.raises(ValueError, match="--ray-address is for --engine ray"):
        BalanceEngine(partitions=2, ray_address="auto")
    with pytest.raises(ValueError, match="--engine"):
        BalanceEngine(engine="spark")


@pytest.mark.parametrize("group_rows", [10, 64, 1000])
def test_a_worker_reads_exactly_its_rows(tmp_path, group_rows):
    """Rows start..stop equal the table's slice, starting and stopping at, one before and one
    after a row-group edge (and a batch edge: batch_rows 7)."""
    table = read_cost_table(_write(tmp_path, resampled(300, seed=2), group_rows), validate=False)
    path = str(tmp_path / "cost.parquet")
    edges = [0, 1, group_rows - 1, group_rows, group_rows + 1, 299, 300]
    for start in edges:
        for stop in edges:
            if not start <= stop <= 300:
                continue
            got = read_cost_rows(path, start, stop, batch_rows=7)
            want = table.select(got.column_names).slice(start, stop - start)
            assert got.num_rows == stop - start and got.equals(want), (start, stop)
    for start, stop in ((-1, 3), (5, 4), (0, 301)):
        with pytest.raises(ValueError, match=r"cost\.parquet: rows"):
            read_cost_rows(path, start, stop)


def _reference(table, cfg, bounds, params):
    """Each sample's (step, node, local rank), the one-process way: ISF within each partition
    as the workers run it, then ``assign_steps`` over the whole table's samples."""
    sl = sample_loads(table, cfg.cost_model)
    v = sl.tokens("vit_tokens")
    t = np.maximum(sl.tokens("llm_tokens"), 1)
    group_of, offset = [], 0
    for i, (a, b) in enumerate(bounds):
        g = isf_group(v[a:b], t[a:b], params, np.random.default_rng([cfg.seed, i]))
        group_of.append(g.group_of + offset)
        offset += g.n_groups
    group_of = np.concatenate(group_of)
    nodes, per = cfg.topology
    a = assign_steps(
        group_of,
        offset,
        sl.loads,
        nodes=nodes,
        gpus_per_node=per,
        rng=np.random.default_rng(cfg.seed),
    )
    g = a.group_of
    return a.step[g], a.node[g], a.local_rank[g]


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 400),
    parts=st.integers(1, 5),
    nodes=st.integers(1, 3),
    per=st.integers(1, 3),
    seed=st.integers(0, 100),
)
def test_the_driver_assigns_every_sample_as_the_one_process_step_assignment(
    tmp_path_factory, n, parts, nodes, per, seed
):
    tmp = tmp_path_factory.mktemp("p")
    _check_against_reference(tmp, resampled(n, seed=seed), min(parts, n), nodes, per, seed)


@pytest.mark.parametrize("seed", range(6))
def test_a_long_last_step_is_packed_as_the_one_process_plan_packs_it(tmp_path, seed):
    """D = 32 over ~45 groups: most groups dissolve, and their samples from every partition
    are LPT-packed by each phase's cost over its mean over the whole table."""
    rng = np.random.default_rng(seed)
    n = 180 + seed
    tiles = rng.integers(0, 7, n)  # vision and LLM loads independent: their weights matter
    table = _tiles_table(
        tiles,
        # a few samples of no LLM tokens and of one: ISF counts each as one token
        np.concatenate(([0] * 5, [1] * 5, rng.integers(50, 6000, n - 10))),
        np.concatenate(([0] * 10, rng.integers(30, 50, n - 10))),
    )
    _check_against_reference(tmp_path, table, 4, 4, 8, seed)


def _check_against_reference(tmp, table, parts, nodes, per, seed):
    n = table.num_rows
    path = _write(tmp, table, max(1, n // 3))
    cfg = BalanceConfig(dp=nodes * per, nodes=nodes, seed=seed, **OFF)
    result, plan = _plan(path, cfg, parts)
    table = read_cost_table(path, required_only=True, validate=False)
    params = isf_params(
        cfg,
        (),
        table.column("vit_tokens").to_numpy(),
        np.maximum(table.column("llm_tokens").to_numpy(), 1),
        None,
    )
    step, node, local = _reference(table, cfg, partition_bounds(n, parts), params)
    row = {s: i for i, s in enumerate(table.column("sample_id").to_pylist())}
    idx = np.array([row[s] for s in plan.column("sample_id").to_pylist()])
    # every sample once, in (step, rank) order, a slot's rows in table order
    assert sorted(idx.tolist()) == list(range(n))
    key = plan.column("step").to_numpy() * cfg.dp + plan.column("rank").to_numpy()
    assert (np.diff(key) >= 0).all()
    same = np.diff(key) == 0
    assert (np.diff(idx)[same] > 0).all()
    assert (plan.column("step").to_numpy() == step[idx]).all()
    assert (plan.column("node").to_numpy() == node[idx]).all()
    assert (plan.column("local_rank").to_numpy() == local[idx]).all()
    assert result.report["counts"]["in"] == result.report["counts"]["out"] == n
    # a group's columns are its samples' sums
    v = table.column("vit_tokens").to_numpy()[idx]
    gid = plan.column("group_id").to_numpy()
    for g in np.unique(gid)[:20]:
        rows = gid == g
        assert plan.column("group_vit_tokens").to_numpy()[rows][0] == v[rows].sum()
        assert plan.column("group_size").to_numpy()[rows][0] == rows.sum()


def test_caps_are_the_one_process_plans_and_the_plan_is_as_even(tmp_path):
    """Past the 20,000 rows the caps are chosen from, the same rows are drawn from their
    partitions: the same caps; the balanced dist ratios within 1e-3 of the one-process plan's
    at 60k rows over 4 partitions (the bench checks 1e-4 at 10M rows over 8)."""
    table = resampled(60_000, seed=5)
    path = _write(tmp_path, table, 7_000)
    cfg = BalanceConfig(dp=8, nodes=2, seed=3, **OFF)
    whole = build_plan(read_cost_table(path, required_only=True, validate=False), cfg).report
    result, _ = _plan(path, cfg, 4)
    parted = result.report
    for k in ("q_v", "q_t", "qf_v", "qf_t"):
        assert parted["parameters"]["isf"][k] == whole["parameters"]["isf"][k]
    for k in ("dist_ratio_vit", "dist_ratio_llm", "dist_ratio_llm_cost"):
        assert abs(parted["metrics"]["balanced"][k] - whole["metrics"]["balanced"][k]) < 1e-3
        assert abs(parted["metrics"]["random"][k] - whole["metrics"]["random"][k]) < 0.02
    assert parted["parameters"]["engine"] == {"partitions": 4}
    # groups ISF kept in each round, over all partitions: the plan's ISF groups and at most
    # D - 1 of them dissolved into the last step
    kept = sum(parted["parameters"]["isf"]["kept_per_round"])
    isf = parted["counts"]["groups_by_flag"]["isf"]
    assert isf <= kept < isf + cfg.dp


def test_the_same_partitioning_gives_the_same_bytes_in_any_slicing(tmp_path):
    path = _write(tmp_path, resampled(3000, seed=1), 500)
    cfg = BalanceConfig(dp=6, nodes=2, seed=9, **OFF)
    files = []
    for k, rows in enumerate((1, 2999, 3000, 3001, 1 << 20)):
        bounds = partition_bounds(3000, 3)
        with LocalParts(path, bounds, cfg.cost_model) as workers:
            result = build_partitioned_plan(path, cfg, workers, bounds)
            out = tmp_path / f"plan{k}.parquet"
            result.rows.write(out, rows_per_slice=rows)
        files.append(pq.read_table(out))
        assert result.rows.column_max("group_llm_tokens") == pc_max(files[-1])
    assert all(f.equals(files[0]) for f in files)
    _, other = _plan(path, cfg, 2)
    assert not other.equals(files[0])  # another partitioning, another grouping


def pc_max(plan: pa.Table) -> int:
    return max(plan.column("group_llm_tokens").to_pylist())


def test_a_table_with_an_audio_phase_or_steps_to_refine_is_refused(tmp_path):
    audio = _write(tmp_path, mixed_cost_table(300, seed=0), name="audio.parquet")
    with pytest.raises(
        ValueError,
        match=r"audio\.parquet: the table has an audio phase \(audio\); a plan over "
        r"partitions.*no --partitions",
    ):
        _plan(audio, BalanceConfig(dp=4, **OFF), 2)
    t = mixed_cost_table(300, seed=0, mix={"image": 0.7, "audio": 0.0, "video": 0.3})
    meta = json.loads(t.schema.metadata[b"equishard.cost_table"])
    meta["phases"] = ["vision", "video", "llm"]
    t = t.drop_columns(["num_audios", "audio_tokens", "audio_seq_lens"]).replace_schema_metadata(
        {b"equishard.cost_table": json.dumps(meta).encode()}
    )
    video = _write(tmp_path, t, name="video.parquet")
    for refine in ("auto", "on"):
        with pytest.raises(
            ValueError,
            match=r"video\.parquet: a plan over partitions \(--partitions, --engine ray\) does not refine",
        ):
            _plan(video, BalanceConfig(dp=4, refine_steps=refine), 2)
    _, plan = _plan(video, BalanceConfig(dp=4, **OFF), 2)
    assert plan.num_rows == 300
    plain = _write(tmp_path, resampled(100), name="plain.parquet")
    with pytest.raises(
        ValueError,
        match=r"plain\.parquet: a plan over partitions \(--partitions, --engine ray\) does not refine",
    ):
        _plan(plain, BalanceConfig(dp=4, refine_steps="on"), 2)


@pytest.mark.parametrize(("load_rows", "rows"), [(None, "60..89"), (8, "68..75")])
def test_a_bad_row_is_named_with_the_rows_read_with_it(tmp_path, monkeypatch, load_rows, rows):
    """Partition 3 of 90 rows holds rows 60..89; read 8 at a time, row 70 is in 68..75."""
    import balancing.plan_part as plan_part

    if load_rows:
        monkeypatch.setattr(plan_part, "LOAD_ROWS", load_rows)
    table = resampled(90, seed=0)
    llm = table.column("llm_tokens").to_numpy().copy()
    llm[70] = -5
    table = table.set_column(
        table.schema.get_field_index("llm_tokens"), "llm_tokens", pa.array(llm)
    )
    path = _write(tmp_path, table)
    with pytest.raises(ValueError, match=rf"cost\.parquet \(rows {rows}\).*llm_tokens"):
        _plan(path, BalanceConfig(dp=2, **OFF), 3)


def _cli(args):
    from equishard.cli import main

    return main(["balance", *args])


@pytest.mark.parametrize("where", ["one partition", "two partitions"])
def test_an_id_repeated_within_or_across_partitions_publishes_nothing(tmp_path, capsys, where):
    table = resampled(60, seed=0)
    ids = table.column("sample_id").to_pylist()
    ids[55] = ids[50] if where == "one partition" else ids[3]
    table = table.set_column(0, "sample_id", pa.array(ids))
    path = _write(tmp_path, table)
    out = tmp_path / "plan"
    code = _cli([path, "--dp", "2", "--partitions", "3", "--refine-steps", "off", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "sample_id appears more than once" in err and repr(ids[55]) in err
    assert not (out / "plan.parquet").exists() and not list(out.glob(".*tmp*"))


def test_the_command_over_partitions_writes_a_plan_write_takes(tmp_path, capsys):
    path = _write(tmp_path, resampled(500, seed=4), 100)
    out = tmp_path / "plan"
    args = [path, "--dp", "4", "--nodes", "2", "--partitions", "3", "--refine-steps", "off"]
    assert _cli([*args, "-o", str(tmp_path / "shown")]) == 0
    assert "made over 3 partitions of the table" in capsys.readouterr().out
    assert _cli([*args, "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counts"] == {**report["counts"], "in": 500, "out": 500, "rejected": 0}
    plan = pq.read_table(out / "plan.parquet")
    assert sorted(plan.column("sample_id").to_pylist()) == sorted(
        pq.read_table(path).column("sample_id").to_pylist()
    )
    assert json.loads((out / "report.json").read_text())["parameters"]["engine"] == {
        "partitions": 3
    }
    from shards.write.plan_input import read_plan

    read_plan(out, read_cost_table(path, validate=False), path)  # what write checks of a plan


@pytest.mark.parametrize("chunk", [1, 99, 100, 101, 250, None])
def test_a_worker_reads_its_rows_in_chunks_of_the_size_asked(tmp_path, chunk):
    """Chunks of ``chunk_rows`` (the last shorter) that put together are the rows, across
    row-group (64) and batch (7) edges; rows 17..217 of 300."""
    from equishard.contracts.cost_table import iter_cost_rows

    path = _write(tmp_path, resampled(300, seed=6), 64)
    table = read_cost_table(path, validate=False)
    got = list(iter_cost_rows(path, 17, 217, chunk_rows=chunk, batch_rows=7))
    sizes = [t.num_rows for t in got]
    want = [chunk] * (200 // chunk) + ([200 % chunk] if 200 % chunk else []) if chunk else [200]
    assert sizes == want
    joined = pa.concat_tables(got)
    assert joined.equals(table.select(joined.column_names).slice(17, 200))
    assert [t.num_rows for t in iter_cost_rows(path, 5, 5, chunk_rows=chunk)] == [0]
    with pytest.raises(ValueError, match="chunk_rows"):
        list(iter_cost_rows(path, 0, 10, chunk_rows=0))


def test_the_plan_is_the_same_whatever_a_worker_reads_at_a_time(tmp_path, monkeypatch):
    import balancing.plan_part as plan_part

    path = _write(tmp_path, resampled(2000, seed=8), 300)
    cfg = BalanceConfig(dp=4, seed=1, **OFF)
    _, once = _plan(path, cfg, 3)
    for rows in (1, 299, 400, 667):  # a worker holds 666 or 667 rows: 2 chunks at 400
        monkeypatch.setattr(plan_part, "LOAD_ROWS", rows)
        assert _plan(path, cfg, 3)[1].equals(once)


def test_a_file_shorter_than_its_footer_says_is_named(tmp_path, monkeypatch):
    """Row groups that yield fewer rows than the footer counts (a file cut or rewritten under
    the reader): the rows missing are named, nothing is planned from the rest."""
    from equishard.contracts import cost_table

    path = _write(tmp_path, resampled(100, seed=0), 40)
    real = pq.ParquetFile.iter_batches

    def short(self, *a, **kw):
        yield next(real(self, *a, **kw)).slice(0, 60)  # and nothing after it

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", short)
    with pytest.raises(ValueError, match=r"cost\.parquet: rows 60\.\.99 could not be read"):
        list(cost_table.iter_cost_rows(path, 0, 100))


def test_one_partitions_random_baseline_is_the_whole_plans(tmp_path):
    """Over one partition the worker's seed is the whole plan's (numpy's seed sequence of
    [seed + 1, 0] is that of seed + 1): the same batches, so the same baseline, each figure
    summed from per-step sums rather than from the [steps, D] table."""
    path = _write(tmp_path, resampled(5000, seed=2), 700)
    for dp, batch in ((8, 4.0), (6, 3.0), (64, 40.0)):  # 64 x 40 > 5000: one short step
        cfg = BalanceConfig(dp=dp, target_batch=batch, seed=4, **OFF)
        whole = build_plan(read_cost_table(path, required_only=True, validate=False), cfg)
        parted, _ = _plan(path, cfg, 1)
        a, b = whole.report["metrics"]["random"], parted.report["metrics"]["random"]
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], abs=2e-6), (dp, k)


def test_the_random_baseline_over_partitions_is_each_partitions_whole_steps(tmp_path):
    """Reference: each partition's seeded permutation cut into batches of B, its whole steps of
    D batches stacked over the partitions, measured as one [steps, D] table."""
    from balancing.plan_quality import PHASES, metrics_of, pad_ratios, random_batches

    n, parts, dp = 3000, 3, 8
    path = _write(tmp_path, resampled(n, seed=3), 400)
    cfg = BalanceConfig(dp=dp, seed=7, **OFF)
    parted, _ = _plan(path, cfg, parts)
    table = read_cost_table(path, required_only=True, validate=False)
    loads = sample_loads(table, cfg.cost_model).loads
    steps, every = [], []
    for i, (a, b) in enumerate(partition_bounds(n, parts)):
        rng = np.random.default_rng([cfg.seed + 1, i])
        stats, _ = random_batches({k: x[a:b] for k, x in loads.items()}, 4, rng)
        every.append(stats)
        whole = stats.shape[0] // dp * dp
        steps.append(stats[:whole])
    steps = np.concatenate(steps)
    table_of = {k: steps[:, 1 + j].reshape(-1, dp) for j, k in enumerate(PHASES)}
    want = metrics_of(table_of, pad_ratios(np.concatenate(every)))
    got = parted.report["metrics"]["random"]
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=2e-6), k


def test_oversize_and_leftover_samples_over_partitions_are_counted_as_isf_flags_them(tmp_path):
    """Samples past a cap get groups of their own in the partition that holds them: the
    report counts them and names the first 20 in table order (reference: ISF run per partition
    with the report's caps)."""
    rng = np.random.default_rng(0)
    n = 400
    llm = rng.integers(100, 900, n)
    big = rng.choice(n, 30, replace=False)
    llm[big] = 60_000  # far past any cap chosen from the rest
    table = _tiles_table(np.ones(n, np.int64), llm, np.full(n, 50))
    path = _write(tmp_path, table)
    cfg = BalanceConfig(dp=4, **OFF)
    result, _ = _plan(path, cfg, 3)
    c = result.report["counts"]
    isf = result.report["parameters"]["isf"]
    params = isf_params(
        BalanceConfig(dp=4, q_v=isf["q_v"], q_t=isf["q_t"], slack=0.05, **OFF), (), None, None, None
    )
    flagged, leftover = [], 0
    for i, (a, b) in enumerate(partition_bounds(n, 3)):
        g = isf_group(np.full(b - a, 1024), np.maximum(llm[a:b], 1), params,
                      np.random.default_rng([cfg.seed, i]))  # fmt: skip
        flagged += (a + np.flatnonzero(g.flags[g.group_of] == 2)).tolist()
        leftover += int((g.flags[g.group_of] == 1).sum())
    assert c["oversize_samples"] == len(flagged) == 30
    assert c["leftover_samples"] == leftover > 0  # ISF's flag 1: packed best-fit after its rounds
    assert c["oversize_sample_ids"] == [f"s{i}" for i in sorted(flagged)[:20]]


def test_ties_in_the_last_step_are_broken_by_the_rows_place_in_the_table(tmp_path):
    """Every sample alike: the last step's LPT meets only ties, broken by each sample's row in
    the whole table (a worker sending its rows' partition-local numbers would pack them
    otherwise); checked against the one-process step assignment."""
    n = 203
    table = _tiles_table(np.ones(n, np.int64), np.full(n, 700), np.full(n, 50))
    _check_against_reference(tmp_path, table, 3, 2, 16, 0)


@pytest.mark.parametrize("parts", [1, 3])
def test_each_id_goes_to_the_worker_its_hash_names(tmp_path, parts):
    from equishard.common.repeated_ids import id_hash_reference

    path = _write(tmp_path, resampled(500, seed=1))
    bounds = partition_bounds(500, parts)
    with LocalParts(path, bounds, BalanceConfig(dp=2).cost_model) as workers:
        workers.call("load", [()] * parts)
        for worker in workers.parts:
            buckets = worker.id_buckets(parts)
            assert len(buckets) == parts
            sent = [x for b in buckets for x in b.to_pylist()]
            assert sorted(sent) == sorted(worker.ids.to_pylist())  # each id once
            for j, b in enumerate(buckets):
                assert all(id_hash_reference(x.encode()) % parts == j for x in b.to_pylist())
        assert workers.repeated_ids() == [[]] * parts
        peak = workers.parts[0].peak()
        hwm = int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) * 1024
        assert peak == hwm  # bytes: the kernel's high-water mark of this process


@pytest.mark.parametrize("parts", [1, 2])
def test_at_most_five_repeated_ids_are_named_per_worker(tmp_path, capsys, parts):
    table = resampled(80, seed=0)
    ids = table.column("sample_id").to_pylist()
    for k in range(7):
        ids[40 + k] = ids[k]  # seven ids repeated
    table = table.set_column(0, "sample_id", pa.array(ids))
    path = _write(tmp_path, table)
    bounds = partition_bounds(80, parts)
    with LocalParts(path, bounds, BalanceConfig(dp=2).cost_model) as workers:
        workers.call("load", [()] * parts)
        found = workers.repeated_ids()
    assert all(len(f) == min(5, len(f)) for f in found) and sum(map(len, found)) >= 5
    named = {x for f in found for x in f}
    assert named <= set(ids[:7])
    if parts == 1:
        assert len(found[0]) == 5
