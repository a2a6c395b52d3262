"""Every configuration dataclass refuses, at construction, a value of the wrong kind for a field.

The reference is each field's own declared type: a field declared ``int`` takes whole numbers
(not ``2.5``, not NaN, which passes every ``<`` bound, not ``True``, which reads as 1), a
``bool`` field True or False (not ``"no"``, which is truthy), a ``float`` field a finite
number. A Python caller's slip used to pass ``__post_init__`` and surface later, far from the
cause (``TrainConfig(steps=2.5)`` after spawning ranks, ``RebalanceConfig(max_error_rate=nan)``
never failing a night, ``ISFParams(window=0)`` inside a kernel) or never.
"""

from __future__ import annotations

import dataclasses
import math
import signal

import pytest

from balancing.isf import ISFParams
from balancing.plan import BalanceConfig
from dataprep.import_lengths import ImportLengthsConfig
from dataprep.policies.registry import POLICIES
from dataprep.prep import PrepConfig
from dataprep.template_limits import RenderLimits
from equishard.common.ray_engine import RayOptions
from shards.nightly.rebalance import RebalanceConfig
from shards.write.writer import WriteConfig
from trainer_adapter.redistribute import RedistributePolicy
from trainer_adapter.topology import Topology
from trainer_adapter.train.config import TrainConfig
from trainer_adapter.train.model import VLMConfig

NAN = math.nan
# per declared type: values of the wrong kind for it
WRONG = {
    "int": [2.5, NAN, True, "4", None],
    "int | None": [2.5, NAN, True, "4"],
    "float": [NAN, math.inf, -math.inf, True, "0.1", None],
    "float | None": [NAN, math.inf, True, "0.1"],
    "bool": [2, "no", None, 1.0],
}


@pytest.fixture
def configs(tmp_path):
    """(class, the keyword arguments of a valid instance) for every configuration."""
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("")
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")  # only its presence is checked at construction
    plan = tmp_path / "plan"
    plan.mkdir()
    for name in ("plan.parquet", "report.json"):
        (plan / name).write_bytes(b"")
    cost = tmp_path / "cost.parquet"
    cost.write_bytes(b"")
    return [
        (ISFParams, dict(q_v=100, q_t=100, qf_v=90, qf_t=90)),
        (BalanceConfig, dict(dp=2)),
        (RenderLimits, {}),
        (ImportLengthsConfig, dict(inputs=[str(jsonl)], output=str(tmp_path / "o.parquet"))),
        (
            PrepConfig,
            dict(inputs=[str(jsonl)], output=str(tmp_path / "o.parquet"), tokenizer=str(tokenizer)),
        ),
        (RayOptions, {}),
        (WriteConfig, dict(plan_dir=str(plan), cost_table=str(cost), out=str(tmp_path / "w"))),
        (RebalanceConfig, dict(current=str(tmp_path / "w"), new=(str(jsonl),))),
        (RedistributePolicy, {}),
        (VLMConfig, dict(vocab_size=100)),
        (Topology, {}),
        (TrainConfig, dict(shards="x", dp=1)),
    ]


def _typed_fields(cls):
    return [f for f in dataclasses.fields(cls) if f.init and f.type in WRONG]


def test_every_config_refuses_values_of_the_wrong_kind(configs):
    checked = 0
    for cls, base in configs:
        cls(**base)  # the base is valid
        for f in _typed_fields(cls):
            for bad in WRONG[f.type]:
                if f.name in base and bad is None:
                    continue
                with pytest.raises(ValueError, match=f.name.replace("_", "[-_]")) as info:
                    cls(**{**base, f.name: bad})
                assert repr(bad) in str(info.value) or str(bad) in str(info.value)
                checked += 1
    assert checked > 300  # every config contributed (a dropped one would shrink this)


def test_every_config_answers_extreme_numbers_at_once(configs):
    """Rule 1 for a user's numbers: every number field of every configuration, given -1, 0,
    2**31, 2**63 (or a float's extremes), is taken or refused with a ``ValueError`` within
    a few seconds, never another error nor a hang. Planted bug this caught:
    ``TrainConfig(pp=2**31)`` computed (2r + 1) ** (pp - 1) candidate partitions as an exact
    integer of billions of digits before comparing it with its limit (``equishard train
    --pp 2147483648`` never started nor failed)."""

    def too_slow(*_):
        raise TimeoutError("more than 5 s")

    previous = signal.signal(signal.SIGALRM, too_slow)
    tried = 0
    try:
        for cls, base in configs:
            for f in dataclasses.fields(cls):
                if not f.init or f.type not in WRONG or "bool" in f.type:
                    continue
                values = [-1, 0, 2**31, 2**63] + (
                    [-1.0, 1e-300, 1e300] if "float" in f.type else []
                )
                for value in values:
                    signal.alarm(5)
                    try:
                        cls(**{**base, f.name: value})
                    except ValueError:
                        pass
                    finally:
                        signal.alarm(0)
                    tried += 1
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert tried > 200


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_vision_policy_refuses_values_of_the_wrong_kind(name):
    """Built as the spec parser builds them (the family's defaults and fixed arguments)."""
    family = POLICIES[name]
    base = {**family.defaults, **family.fixed}
    policy = family.cls(**base)
    for f in dataclasses.fields(policy):
        if f.type not in WRONG or f.name in family.fixed:
            continue
        for bad in WRONG[f.type]:
            with pytest.raises(ValueError, match=f.name):
                family.cls(**{**base, f.name: bad})
        if f.type == "int":  # a byte count given for a pixel count
            with pytest.raises(ValueError, match=f.name):
                family.cls(**{**base, f.name: 1 << 40})


@pytest.mark.parametrize(
    ("make", "match"),
    [
        # the night's prep allows any share of rejects with a NaN or negative rate
        (lambda c: RebalanceConfig(**{**c, "max_error_rate": NAN}), "max-error-rate"),
        (lambda c: RebalanceConfig(**{**c, "max_error_rate": -0.5}), "max-error-rate"),
        (lambda c: RebalanceConfig(**{**c, "max_error_rate": 1.5}), "max-error-rate"),
    ],
)
def test_rebalance_error_rate_is_a_share(make, match, tmp_path):
    new = tmp_path / "new.jsonl"
    new.write_text("")
    with pytest.raises(ValueError, match=match):
        make(dict(current=str(tmp_path), new=(str(new),)))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(method="bogus"), "method"),  # found only inside every rank, after spawning
        (dict(placement="ring"), "placement"),
        (dict(model="7b"), "model"),
        (dict(virtual_stages=0), "virtual_stages"),
        (dict(partition_top_k=0), "partition_top_k"),
        (dict(partition_radius=-1), "partition_radius"),
        # (2r+1)^(pp-1) partitions are costed: 17^7 would never finish the set-up
        (dict(partition_radius=8, pp=8), "candidate partitions"),
        (dict(seed=-1), "seed"),
        (dict(workers=10**6), "workers"),
    ],
)
def test_train_config_refuses_settings_before_any_rank_starts(overrides, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(shards="x", dp=1, **overrides)


def test_train_config_takes_every_listed_choice():
    from balancing.post_balance import METHODS
    from trainer_adapter.train.model import MODEL_SIZES

    for method in (*METHODS, "locality"):
        TrainConfig(shards="x", dp=1, method=method)
    for model in MODEL_SIZES:
        TrainConfig(shards="x", dp=1, model=model)
    TrainConfig(shards="x", dp=1, pp=4, partition_radius=2)  # 5^3 candidates


@pytest.mark.parametrize(
    ("spec_overrides", "match"),
    [
        # a negative ratio squares to the same token count as its positive: silently accepted
        (("internvl", dict(downsample_ratio=-0.5)), "downsample_ratio"),
        (("aya-vision", dict(downsample_ratio=0.0)), "downsample_ratio"),
        # tile 0 is a multiple of every patch size: a division by zero at the first image
        (("granite-docling", dict(tile_size=0)), "tile_size"),
        (("ovis2", dict(tile_size=0)), "tile_size"),
    ],
)
def test_policy_ranges(spec_overrides, match):
    name, overrides = spec_overrides
    family = POLICIES[name]
    with pytest.raises(ValueError, match=match):
        family.cls(**{**family.defaults, **overrides, **family.fixed})


def test_pixtral_name_is_one_it_can_write_back():
    with pytest.raises(ValueError, match="pixtral or mistral3"):
        POLICIES["pixtral"].cls(name="qwen2vl")


def test_topology_ranks_are_whole():
    with pytest.raises(ValueError, match="llm_ranks"):
        Topology(llm_ranks=(0, 1.5))
    with pytest.raises(ValueError, match="vision_ranks"):
        Topology(vision_ranks=(True,))
    with pytest.raises(ValueError, match="label_ranks"):
        Topology(label_ranks="01")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(seed=1.5), "seed"),  # the shuffle of every epoch keyed by it
        (dict(seed=-1), "seed"),
        (dict(shuffle="no"), "shuffle"),  # truthy: shuffled although the user said no
        (dict(verify=None), "verify"),
        (dict(max_consecutive_errors=NAN), "max_consecutive_errors"),  # never exceeded
    ],
)
def test_the_loader_refuses_its_settings_before_reading(kwargs, match, tmp_path):
    from shards import GroupDataset, RankInfo

    with pytest.raises(ValueError, match=match):
        GroupDataset(tmp_path / "nothing", RankInfo(rank=0, world_size=1), **kwargs)
    with pytest.raises(ValueError, match="RankInfo"):
        GroupDataset(tmp_path / "nothing", {"rank": 0, "world_size": 1})


def test_collation_switches_are_switches():
    from shards.read.collate import Collator
    from trainer_adapter.hf.balance import balance_model
    from trainer_adapter.hf.inputs import HFPacker

    with pytest.raises(ValueError, match="check_costs"):
        Collator(tokenizer="x", check_costs="no")  # truthy: checks on although told off
    for bad in (dict(check_costs="no"), dict(packing_kwargs=1), dict(images_kwargs=[])):
        with pytest.raises(ValueError, match=next(iter(bad))):
            HFPacker(family="llava", processor=None, template="x", **bad)
    with pytest.raises(ValueError, match="llm"):
        balance_model(None, llm="no")


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        # written as stage / name: outside the generation
        (dict(extra_files={"../escape.txt": "SRC"}), "plain file name"),
        (dict(extra_files={"sub/x.txt": "SRC"}), "plain file name"),
        (dict(extra_files={"manifest.json": "SRC"}), "plain file name"),  # the writer's own
        (dict(extra_files={"cost.parquet": "SRC"}), "plain file name"),
        (dict(extra_files={"x.txt": "MISSING"}), "not a regular file"),
        (dict(manifest_extra={"streams": []}), "writer's own keys"),  # would replace the shards
        (dict(manifest_extra={"nightly": {"at": math.nan}}), "plain JSON"),
        (dict(manifest_extra=["nightly"]), "must be a dict"),
    ],
)
def test_write_extras_never_leave_the_generation_or_replace_its_keys(
    configs, tmp_path, extra, match
):
    cls, base = next((c, b) for c, b in configs if c is WriteConfig)
    src = tmp_path / "src.txt"
    src.write_text("x")
    if "extra_files" in extra:
        extra = {
            "extra_files": {
                k: str(src) if v == "SRC" else v for k, v in extra["extra_files"].items()
            }
        }
    with pytest.raises(ValueError, match=match):
        cls(**base, **extra)
    cls(**base, extra_files={"night.errors.parquet": str(src)}, manifest_extra={"nightly": {}})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(images=-1), "images"),  # read as one image file, silently
        (dict(images=0), "images"),
        (dict(samples=2.5), "samples"),
        (dict(samples=10**12), r"samples \(the demo set's size"),  # was numpy's MemoryError
        (dict(seed=-1), "seed"),
    ],
)
def test_the_demo_refuses_its_numbers_before_writing(kwargs, match, tmp_path):
    from dataprep import make_demo

    with pytest.raises(ValueError, match=match):
        make_demo(tmp_path / "demo", **kwargs)
    assert not (tmp_path / "demo").exists()


def test_train_refuses_a_log_or_profile_path_it_could_not_use(tmp_path):
    """Rank 0 appends each step to --log: a FIFO there blocked it at the first step, after every
    rank had started; refused at construction, as a profile path that is a file is."""
    import os

    os.mkfifo(tmp_path / "log.fifo")
    with pytest.raises(ValueError, match="not a regular file"):
        TrainConfig(shards="x", dp=1, log=str(tmp_path / "log.fifo"))
    (tmp_path / "prof").write_text("")
    with pytest.raises(ValueError, match="not a directory"):
        TrainConfig(shards="x", dp=1, profile=str(tmp_path / "prof"), steps=10)
    TrainConfig(shards="x", dp=1, log=str(tmp_path / "new.jsonl"), profile=str(tmp_path / "p"))


def test_cost_models_are_what_a_report_can_record():
    """A cost model goes into the plan report and is read back by a night (``from_record``,
    which takes a string source and whole model dimensions): one built otherwise would make a
    report its own nights refuse."""
    from balancing.cost_model import CostModel

    with pytest.raises(ValueError, match="source"):
        CostModel(source=1)
    with pytest.raises(ValueError, match="whole numbers"):
        CostModel.from_dims(vit_hidden=2.5, vit_layers=24, llm_hidden=4096, llm_layers=32)
    with pytest.raises(ValueError, match="whole numbers"):
        CostModel.from_dims(vit_hidden=1024, vit_layers=True, llm_hidden=4096, llm_layers=32)
    m = CostModel.from_dims(vit_hidden=1024, vit_layers=24, llm_hidden=4096, llm_layers=32)
    assert CostModel.from_record(m.describe(), "test") == m


def test_a_task_timeout_is_any_positive_finite_number_of_seconds():
    """``--task-timeout``: a fraction of a second is a timeout like any other (a bound off by
    one refused it); zero, negative, NaN, infinite and a bool are refused naming the flag."""
    from equishard.common.values import check_task_timeout

    for ok in (None, 0.5, 1, 1800, 1e-3):
        check_task_timeout(ok)
    for bad in (0, -1, -0.5, NAN, float("inf"), True):
        with pytest.raises(ValueError, match="--task-timeout"):
            check_task_timeout(bad)
