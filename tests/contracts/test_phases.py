"""The encoder phases of the cost table: vision always, video and audio where their columns are.

The bugs these tests catch: a phase's columns half there (``audio_tokens`` without its sequence
lengths) read as no phase; a phase's row checked by none of the rules the vision phase has
(negative, missing, implausible, tokens not the sum of the lengths); metadata that says other
phases than the columns; and a table with an audio phase balanced by vision and LLM tokens
alone, its audio cost silently left out of the plan (``balance`` refuses it naming the file).
Old tables (no phase metadata, vision columns only) read as they always did.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from balancing.plan import BalanceConfig, build_plan
from equishard.cli import main
from equishard.contracts.cost_table import (
    MAX_SAMPLE_TOKENS,
    METADATA_KEY,
    read_cost_table,
    table_phases,
)
from equishard.contracts.phases import (
    AUDIO,
    ENCODER_PHASES,
    LLM,
    VIDEO,
    VISION,
    Phase,
    encoder_phases,
)


def _table(meta: dict | None = None, **columns) -> pa.Table:
    base = {
        "sample_id": ["cap", "clip", "talk"],
        "source": ["mix"] * 3,
        "num_images": pa.array([1, 0, 0], pa.int32()),
        "vit_tokens": pa.array([1024, 0, 0], pa.int64()),
        "vit_seq_lens": pa.array([[1024], [], []], pa.list_(pa.int32())),
        "llm_tokens": pa.array([300, 9000, 800], pa.int64()),
        "text_tokens": pa.array([40, 30, 50], pa.int64()),
    }
    table = pa.table({**base, **columns})
    if meta is not None:
        table = table.replace_schema_metadata({METADATA_KEY: json.dumps(meta)})
    return table


AUDIO_COLUMNS = {
    "num_audios": pa.array([0, 0, 1], pa.int64()),  # another integer width: cast where read
    "audio_tokens": pa.array([0, 0, 4500], pa.int64()),
    "audio_seq_lens": pa.array([[], [], [3000, 1500]], pa.list_(pa.int64())),
}
VIDEO_COLUMNS = {
    "num_videos": pa.array([0, 1, 0], pa.int32()),
    "video_tokens": pa.array([0, 35840, 0], pa.int64()),
    "video_seq_lens": pa.array([[], [8960] * 4, []], pa.list_(pa.int32())),
}


def _write(tmp_path, table) -> str:
    path = tmp_path / "cost.parquet"
    pq.write_table(table, path)
    return str(path)


def test_a_table_written_before_phases_reads_as_vision_and_llm(tmp_path):
    table = read_cost_table(_write(tmp_path, _table()))
    assert table_phases(table) == (VISION,)
    assert "audio_tokens" not in table.column_names


def test_video_and_audio_phases_are_read_in_their_types_and_kept_by_balance_reads(tmp_path):
    path = _write(tmp_path, _table(meta={"phases": ["vision", "audio", "video", "llm"]},
                                   **AUDIO_COLUMNS, **VIDEO_COLUMNS))  # fmt: skip
    table = read_cost_table(path)
    assert table_phases(table, path) == (VISION, VIDEO, AUDIO)
    assert table.schema.field("num_audios").type == pa.int32()
    assert table.schema.field("audio_seq_lens").type == pa.list_(pa.int32())
    assert table.column("audio_seq_lens").to_pylist()[2] == [3000, 1500]
    # what balance reads (the required columns alone) still holds every phase's columns
    required = read_cost_table(path, required_only=True)
    assert {c for p in (VIDEO, AUDIO) for c in p.columns} <= set(required.column_names)


@pytest.mark.parametrize("phase", [VIDEO, AUDIO], ids=lambda p: p.name)
@pytest.mark.parametrize("left_out", [0, 1, 2])
def test_a_phase_half_there_is_refused_naming_what_is_missing(tmp_path, phase, left_out):
    cols = {**AUDIO_COLUMNS, **VIDEO_COLUMNS}
    given = {c: v for c, v in cols.items() if c in phase.columns}
    missing = phase.columns[left_out]
    del given[missing]
    with pytest.raises(ValueError, match=rf"the {phase.name} phase has .* but not \['{missing}'\]"):
        read_cost_table(_write(tmp_path, _table(**given)))


@pytest.mark.parametrize(
    ("column", "value", "rule"),
    [
        ("audio_tokens", -1, "audio_tokens is missing or negative"),
        ("audio_tokens", None, "audio_tokens is missing or negative"),
        ("num_audios", -1, "num_audios is missing or negative"),
        ("audio_tokens", MAX_SAMPLE_TOKENS + 1, "audio_tokens is above the plausible"),
        ("audio_tokens", 4501, "audio_tokens is not the sum of audio_seq_lens"),
        ("audio_seq_lens", [3000, -1], "audio_seq_lens holds a negative length"),
        ("audio_seq_lens", [3000, None], "audio_seq_lens holds a missing value"),
        ("audio_seq_lens", None, "audio_seq_lens is missing"),
        ("video_tokens", 35839, "video_tokens is not the sum of video_seq_lens"),
    ],
)
def test_each_phase_row_is_checked_as_the_vision_phase_is(tmp_path, column, value, rule):
    cols = {k: v.to_pylist() for k, v in {**AUDIO_COLUMNS, **VIDEO_COLUMNS}.items()}
    row = 1 if column.startswith("video") else 2
    cols[column][row] = value
    types = {k: v.type for k, v in {**AUDIO_COLUMNS, **VIDEO_COLUMNS}.items()}
    table = _table(**{k: pa.array(v, types[k]) for k, v in cols.items()})
    sample = ["cap", "clip", "talk"][row]
    with pytest.raises(ValueError, match=rf"{rule}.*'{sample}'"):
        read_cost_table(_write(tmp_path, table))
    # at the limit: the plausible maximum itself is taken (int32 lengths summing to 2^32)
    if rule.endswith("plausible"):
        cols[column][row] = MAX_SAMPLE_TOKENS
        cols["audio_seq_lens"][row] = [(1 << 31) - 1, (1 << 31) - 1, 2]
        table = _table(**{k: pa.array(v, types[k]) for k, v in cols.items()})
        taken = read_cost_table(_write(tmp_path, table))
        assert taken.column(column)[row].as_py() == MAX_SAMPLE_TOKENS


@pytest.mark.parametrize(
    "recorded",
    [["vision", "llm"], ["vision", "audio", "audio", "llm"], ["audio"], "vision", [1]],
)
def test_metadata_that_names_other_phases_than_the_columns_is_refused(tmp_path, recorded):
    path = _write(tmp_path, _table(meta={"phases": recorded}, **AUDIO_COLUMNS))
    with pytest.raises(ValueError, match="phases"):
        read_cost_table(path)


def test_balance_refuses_a_phase_it_would_leave_out_of_the_plan(tmp_path, capsys):
    """A video phase whose table does not say the vision tower runs it (no recorded
    ``video_rule.tower``) has no encoder balancing knows: refused, naming the file."""
    path = _write(tmp_path, _table(**VIDEO_COLUMNS))
    assert main(["balance", path, "--dp", "1", "-o", str(tmp_path / "plan")]) == 2
    err = capsys.readouterr().err
    assert path in err and "video encoder phase" in err and "left" not in err.split(":")[0]
    assert not (tmp_path / "plan" / "plan.parquet").exists()
    with pytest.raises(ValueError, match="video encoder phase"):
        build_plan(read_cost_table(path), BalanceConfig(dp=1))
    # the same table without the video phase balances
    assert (
        main(["balance", _write(tmp_path, _table()), "--dp", "1", "-o", str(tmp_path / "p")]) == 0
    )


def test_balance_takes_the_audio_phase_into_the_plan(tmp_path):
    """A table with recordings is balanced in its audio phase too: the plan carries each
    group's audio tokens and cost, equal to its samples' sums."""
    path = _write(tmp_path, _table(**AUDIO_COLUMNS))
    assert main(["balance", path, "--dp", "1", "-o", str(tmp_path / "plan")]) == 0
    plan = pq.read_table(tmp_path / "plan" / "plan.parquet").to_pylist()
    audio = dict(zip(["cap", "clip", "talk"], [0, 0, 4500], strict=True))
    sums: dict[int, int] = {}
    for row in plan:
        sums[row["group_id"]] = sums.get(row["group_id"], 0) + audio[row["sample_id"]]
    assert [r["group_audio_tokens"] for r in plan] == [sums[r["group_id"]] for r in plan]
    assert all((r["group_audio_cost"] > 0) == (sums[r["group_id"]] > 0) for r in plan)


def test_the_phases_are_named_once_and_consistently():
    names = [p.name for p in (*ENCODER_PHASES, LLM)]
    assert len(set(names)) == len(names) and ENCODER_PHASES[0] is VISION
    columns = [c for p in ENCODER_PHASES for c in p.columns]
    assert len(set(columns)) == len(columns)
    assert encoder_phases(columns) == ENCODER_PHASES
    with pytest.raises(ValueError, match="attention"):
        Phase(name="x", modality="x", tokens="x", seq_lens=None, items=None, attention="dense")


def test_prep_records_the_phases_it_measured(tmp_path):
    from dataprep import PrepConfig, run_prep, table_metadata
    from tests.dataprep.helpers import llava, write_jsonl

    src = write_jsonl(tmp_path / "d.jsonl", [llava("a"), llava("b", question="Hi?")])
    out = tmp_path / "cost.parquet"
    run_prep(
        PrepConfig(inputs=(str(src),), output=str(out), tokenizer="estimate:chars_per_token=4")
    )
    assert table_metadata(out)["phases"] == ["vision", "llm"]
    assert table_phases(read_cost_table(out), out) == (VISION,)


def test_every_phase_names_its_report_key_and_label_in_one_place():
    """The report keys and labels every reader shows (plan_quality, ``balance``, ``inspect``,
    the HTML report) come from the phases themselves: a phase without them is refused, and
    each reader's list is the phases' own, in their order."""
    from balancing.plan_quality import REPORTED as QUALITY
    from equishard.cli.balance import PHASE_LABELS
    from equishard.contracts.phases import LLM, REPORTED, Phase
    from shards.read.report import PHASES as DRAWN

    with pytest.raises(ValueError, match="report key and its label"):
        Phase(name="x", modality="x", tokens="t", seq_lens=None, items=None, attention="causal")
    assert [p.name for p in REPORTED] == ["vision", "audio", "llm"] and REPORTED[-1] is LLM
    assert QUALITY == (
        ("vit", "vit_tokens", "vit_cost"),
        ("audio", "audio_tokens", "audio_cost"),
        ("llm", "llm_tokens", "llm_cost"),
    )
    assert PHASE_LABELS == {"vit": "vision", "audio": "audio", "llm": "LLM"}
    assert [(n, c) for n, c, _ in DRAWN] == [(p.name, p.tokens) for p in REPORTED]
