"""Every option a subcommand accepts reaches its configuration: none dropped (silently left at
the configuration's default), swapped with another or replaced by a constant.

The reference is the subcommand's own ``argparse`` parser: every option is given a value other
than its default (another choice, another number, a text naming the option), the
configuration class is replaced by a recorder of its keyword arguments, and each option must
arrive as the field of its own name with its parsed value, or as the field and value listed in
``BECOMES`` (a negated flag, a parsed size). An option that reaches no field must be listed in
``NOT_A_FIELD`` with what it does instead, so a new option that is parsed but never used fails
here until it is wired or listed. ``balance`` has its own end-to-end test
(``test_cli_balance_settings.py``)."""

from __future__ import annotations

import importlib
import os

import pytest

from equishard.cli import build_parser, main

# subcommand -> (module, configuration class) the CLI builds
CONFIGS = {
    "prep": ("dataprep.prep", "PrepConfig"),
    "import-lengths": ("dataprep.import_lengths", "ImportLengthsConfig"),
    "write": ("shards.write.writer", "WriteConfig"),
    "rebalance": ("shards.nightly.rebalance", "RebalanceConfig"),
    "train": ("trainer_adapter.train.config", "TrainConfig"),
}

# option -> (the field it becomes, its value from the parsed options)
BECOMES = {
    "prep": {
        "no_progress": ("progress", lambda ns: not ns.no_progress and not ns.json),
        "json": ("progress", lambda ns: not ns.no_progress and not ns.json),
        "inputs": ("inputs", lambda ns: tuple(ns.inputs)),
    },
    "import-lengths": {"inputs": ("inputs", lambda ns: tuple(ns.inputs))},
    "write": {"shard_size": ("shard_size", lambda ns: _parse_size(ns.shard_size))},
    "rebalance": {
        "json": ("progress", lambda ns: not ns.json),
        "new": ("new", lambda ns: tuple(ns.new)),
        "step_log": ("step_log", lambda ns: tuple(ns.step_log)),
    },
    "train": {  # --whole-samples and --no-redistribute turn their fields off
        "split_samples": ("split_samples", lambda ns: not ns.split_samples),
        "redistribute": ("redistribute", lambda ns: not ns.redistribute),
    },
}

# options that are no field of the configuration, and what they do instead
NOT_A_FIELD = {
    "import-lengths": {"json": "the summary's format"},
    "write": {
        "json": "the summary's format (and no progress bar)",
        "store_timeout": "$EQUISHARD_STORE_TIMEOUT",
        "store_retries": "$EQUISHARD_STORE_RETRIES",
    },
    "rebalance": {
        "store_timeout": "$EQUISHARD_STORE_TIMEOUT",
        "store_retries": "$EQUISHARD_STORE_RETRIES",
    },
    "train": {
        "nproc": "torchrun's process count (must be dp x pp)",
        "store_timeout": "$EQUISHARD_STORE_TIMEOUT",
        "store_retries": "$EQUISHARD_STORE_RETRIES",
    },
}


def _parse_size(text: str) -> int:
    from shards.write.writer import parse_size

    return parse_size(text)


class Recorded(BaseException):
    """Raised by the recorder in place of building the configuration (a BaseException: no
    ``except ValueError`` in the command swallows it)."""

    def __init__(self, kwargs: dict) -> None:
        self.kwargs = kwargs


def _recorder(cls):
    """``cls`` whose construction records its keyword arguments instead (a subclass: a command
    that reads the options its fields declare still finds them)."""

    class Recorder(cls):
        def __init__(self, *args, **kwargs):
            assert not args, "configurations are keyword-only"
            raise Recorded(kwargs)

    return Recorder


def _subparser(command: str):
    return build_parser()._subparsers._group_actions[0].choices[command]


# values the command itself checks before it builds its configuration
PATHS = {"output": "cost.parquet", "out": "gen-out", "staging": "staging"}


def _value(action, tmp_path) -> list[str]:
    """Command-line words giving ``action`` a value other than its default."""
    if action.nargs == 0:  # a flag
        return []
    if action.dest in PATHS:
        return [str(tmp_path / PATHS[action.dest])]
    if action.choices:
        return [next(c for c in action.choices if c != action.default)]
    if action.type is int:
        return [str((action.default or 0) + 3)]
    if action.type is float:
        return [repr(action.default / 2 if action.default else 0.25)]
    if action.dest == "shard_size":
        return ["3MB"]
    if action.nargs in ("+", "*"):
        return [f"{action.dest}-a", f"{action.dest}-b"]
    return [f"{action.dest}-value"]


def _argv(command: str, tmp_path) -> list[str]:
    positional, options = [], []
    for action in _subparser(command)._actions:
        if action.dest == "help" or (action.dest == "json" and command == "prep"):
            continue  # prep's --json: its no_progress then shows (both turn progress off)
        words = _value(action, tmp_path)
        if action.option_strings:
            options += [action.option_strings[0], *words]
        else:
            positional += words
    if command == "train":  # --nproc must be --dp x --pp
        at = options.index("--nproc")
        dp, pp = (int(options[options.index(o) + 1]) for o in ("--dp", "--pp"))
        options[at + 1] = str(dp * pp)
    return [command, *positional, *options]


@pytest.mark.parametrize("command", list(CONFIGS))
def test_every_option_reaches_the_configuration(command, tmp_path, monkeypatch):
    from shards.store.store_limits import RETRIES_ENV, TIMEOUT_ENV

    module, cls = CONFIGS[command]
    mod = importlib.import_module(module)
    monkeypatch.setattr(mod, cls, _recorder(getattr(mod, cls)))
    # train opens the generation first (a wrong --shards is one line, not a torchrun failure)
    monkeypatch.setattr("shards.store.manifest.open_generation", lambda *a, **k: None)
    for env in (TIMEOUT_ENV, RETRIES_ENV):
        monkeypatch.delenv(env, raising=False)
    argv = _argv(command, tmp_path)
    ns = build_parser().parse_args(argv)
    with pytest.raises(Recorded) as rec:
        main(argv)
    got = rec.value.kwargs
    becomes, elsewhere = BECOMES.get(command, {}), NOT_A_FIELD.get(command, {})
    for action in _subparser(command)._actions:
        dest = action.dest
        if dest == "help" or dest in elsewhere:
            continue
        field, value = becomes.get(dest, (dest, lambda ns, d=dest: getattr(ns, d)))
        assert field in got, f"{command}: --{dest} reaches no field of {cls}"
        assert got[field] == value(ns), f"{command}: --{dest} -> {field}"
        if action.nargs != 0:  # an option's value: the one given, not the default
            assert got[field] != action.default, f"{command}: --{dest} left at its default"
    if "store_timeout" in elsewhere:
        assert float(os.environ[TIMEOUT_ENV]) == ns.store_timeout
        assert int(os.environ[RETRIES_ENV]) == ns.store_retries
