"""Command-line options declared once, on the configuration's fields: the parser built from
them and the keyword arguments read back, anchored to argparse itself (what a hand-written
``add_argument`` of the same option parses)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from equishard.common.options import add_options, config_kwargs, option


@dataclass(frozen=True, kw_only=True)
class Toy:
    inputs: tuple[str, ...] = field(
        metadata=option("files", flag="", nargs="+", metavar="IN", parse=tuple)
    )
    output: str = field(metadata=option("out", short="-o", required=True, metavar="OUT"))
    workers: int = field(default=1, metadata=option("workers for {what}"))
    ratio: float = field(default=0.5, metadata=option("a ratio"))
    size: int = field(
        default=1024,
        metadata=option("bytes", type=str, default="1KB", parse=lambda t: int(t[:-2]) * 1024),
    )
    fast: bool = field(default=False, metadata=option("a switch"))
    mode: str = field(default="a", metadata=option("a or b", choices=("a", "b")))
    check: bool = field(
        default=True, metadata=option("skip the check", flag="--no-check", negate=True)
    )
    hidden: dict | None = None  # set by code: no option


def _parser(**fmt) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toy")
    add_options(p, Toy, **fmt)
    return p


ARGV = ["a", "b", "-o", "x", "--workers", "3", "--ratio", "0.25", "--size", "2KB", "--fast"]
ARGV += ["--no-check"]


def test_options_parse_as_hand_written_arguments_would():
    ns = _parser(what="writing").parse_args(ARGV)
    hand = argparse.ArgumentParser()
    hand.add_argument("inputs", nargs="+")
    hand.add_argument("-o", "--output", required=True)
    hand.add_argument("--workers", type=int, default=1)
    hand.add_argument("--ratio", type=float, default=0.5)
    hand.add_argument("--size", default="1KB")
    hand.add_argument("--fast", action="store_true")
    hand.add_argument("--mode", choices=("a", "b"), default="a")
    hand.add_argument("--no-check", dest="check", action="store_true")
    ref = hand.parse_args(ARGV)
    assert vars(ns) == vars(ref)
    kw = config_kwargs(Toy, ns)
    assert kw == {
        "inputs": ("a", "b"),
        "output": "x",
        "workers": 3,
        "ratio": 0.25,
        "size": 2048,
        "fast": True,
        "mode": "a",
        "check": False,
    }
    assert Toy(**kw).size == 2048


def test_defaults_help_and_refusals_come_from_the_fields():
    p = _parser(what="writing")
    ns = p.parse_args(["a", "-o", "x"])
    assert config_kwargs(Toy, ns) == {
        "inputs": ("a",),
        "output": "x",
        "workers": 1,
        "ratio": 0.5,
        "size": 1024,
        "fast": False,
        "mode": "a",
        "check": True,
    }
    text = p.format_help()
    assert "workers for writing" in text and "--hidden" not in text
    for argv in (
        ["a"],
        ["-o", "x"],
        ["a", "-o", "x", "--mode", "c"],
        ["a", "-o", "x", "--workers", "1.5"],
    ):
        with pytest.raises(SystemExit):
            p.parse_args(argv)


@pytest.mark.parametrize(
    "command", ["write", "import-lengths", "prep", "rebalance", "balance", "train"]
)
def test_a_commands_options_are_its_configurations_fields(command):
    """No command declares an option of its configuration by hand: every option but the
    command's own (``--json``, ``--no-progress``, the store limits, balance's input and output,
    train's ``--nproc``) is a field's declaration."""
    from balancing.cost_model import CostModelOptions
    from balancing.parts import BalanceEngine
    from balancing.plan import BalanceConfig
    from balancing.row_memory import RowMemory
    from dataprep.import_lengths import ImportLengthsConfig
    from dataprep.prep_config import PrepConfig
    from equishard.cli import build_parser
    from equishard.common.options import declared
    from shards.nightly.rebalance import RebalanceConfig
    from shards.write.write_config import WriteConfig
    from trainer_adapter.train.config import TrainConfig

    classes = {
        "write": [WriteConfig],
        "import-lengths": [ImportLengthsConfig],
        "prep": [PrepConfig],
        "rebalance": [RebalanceConfig],
        "balance": [BalanceConfig, CostModelOptions, RowMemory, BalanceEngine],
        "train": [TrainConfig],
    }[command]
    sub = build_parser(command)._subparsers._group_actions[0].choices[command]
    own = {"help", "json", "no_progress", "store_timeout", "store_retries"}
    own |= {"balance": {"cost_table", "output"}, "train": {"nproc"}}.get(command, set())
    dests = {a.dest for a in sub._actions} - own
    assert dests == {f.name for cls in classes for f, _ in declared(cls)}


def test_main_builds_only_the_command_that_runs(monkeypatch):
    """``equishard verify`` does not build (nor import the configuration of) ``train``, whose
    module loads torch; ``--help`` still lists every subcommand with its line."""
    import equishard.cli as cli

    built = []
    real = cli.build_parser

    def spy(only=None):
        built.append(only)
        return real(only)

    monkeypatch.setattr(cli, "build_parser", spy)
    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert built == ["verify", ""]
    sub = real("")._subparsers._group_actions[0]
    assert list(sub.choices) == list(cli.SUBCOMMANDS)
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert helps["train"].startswith("train a VLM") and all(helps.values())
