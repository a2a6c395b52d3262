"""Command-line options declared once, on the configuration they fill.

A configuration dataclass names its command-line options in its fields' metadata
(``field(default=..., metadata=option("help text", ...))``); the command line builds its
``argparse`` arguments from them (:func:`add_options`) and the configuration's keyword
arguments from the parsed options (:func:`config_kwargs`). The option's name, type, default
and help then live in one place: the field. A field without ``option`` metadata is no option
(set by code, e.g. a night's extra manifest keys).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Option", "add_option", "add_options", "config_kwargs", "declared", "option"]

_UNSET = object()


@dataclass(frozen=True, kw_only=True)
class Option:
    """How a field appears on the command line.

    ``flag``: its spelling (default ``--field-name``; ``""``: positional); ``short``: a short
    spelling too (``-o``); ``aliases``: older spellings still taken (``--q-t``); ``type``: what
    argparse parses (default: from the field's type: ``int``, ``float``, else text; a ``bool``
    field is a switch); ``default``: the command line's default where it differs from the
    field's (a text to ``parse``, like ``"1GB"``); ``parse``: the parsed option -> the field's
    value (a size, 0 for None); ``negate``: the switch turns a ``bool`` field that is on by
    default off (``--no-redistribute``); ``nargs``, ``choices``, ``metavar``, ``required``: as
    argparse takes them."""

    help: str
    flag: str | None = None
    short: str | None = None
    aliases: tuple[str, ...] = ()
    type: Callable | None = None
    default: object = _UNSET
    parse: Callable | None = None
    nargs: str | None = None
    choices: tuple | None = None
    metavar: str | None = None
    required: bool = False
    negate: bool = False


class _Keep(dict):
    """``format_map``'s mapping that leaves a ``{place}`` it has no value for as written."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def option(help: str, **kw) -> dict:
    """A field's metadata declaring its command-line option (see :class:`Option`)."""
    return {"option": Option(help=help, **kw)}


def declared(cls) -> list[tuple[dataclasses.Field, Option]]:
    """The fields of ``cls`` that declare an option, with it."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(cls) if "option" in f.metadata]


def add_option(
    parser: argparse.ArgumentParser, name: str, kind: str, opt: Option, default=None, **fmt: str
) -> None:
    """One option: the field ``name`` of type ``kind`` (its annotation: ``int``, ``float``,
    ``bool``, ``str | None``, ...) with the field's ``default``; ``fmt`` fills the help text's
    ``{name}`` places."""
    if opt.default is not _UNSET:
        default = opt.default
    kw: dict = {"help": opt.help.format_map(_Keep(fmt)) if fmt else opt.help}
    if opt.flag == "":  # positional: its name is its dest
        names = [name]
    else:
        names = [
            n for n in (opt.short, opt.flag or "--" + name.replace("_", "-"), *opt.aliases) if n
        ]
        kw["dest"] = name
    if kind == "bool" and opt.type is None:  # a switch (``negate``: it turns the field off)
        parser.add_argument(*names, action="store_true", **kw)
        return
    base = kind.split("|")[0].strip()
    kw["type"] = opt.type or {"int": int, "float": float}.get(base, str)
    if opt.required:
        kw["required"] = True
    else:
        kw["default"] = default
    for key in ("nargs", "choices", "metavar"):
        if getattr(opt, key) is not None:
            kw[key] = getattr(opt, key)
    parser.add_argument(*names, **kw)


def add_options(
    parser: argparse.ArgumentParser, cls, *, skip: tuple[str, ...] = (), **fmt: str
) -> None:
    """An argument for every field of ``cls`` that declares an option (but those in ``skip``);
    ``fmt`` fills ``{name}`` places in the help texts (an option shared by several commands
    saying what it runs for each)."""
    for f, opt in declared(cls):
        if f.name not in skip:
            default = None if f.default is dataclasses.MISSING else f.default
            add_option(parser, f.name, str(f.type), opt, default, **fmt)


def config_kwargs(cls, args: argparse.Namespace, *, skip: tuple[str, ...] = ()) -> dict:
    """The keyword arguments of ``cls`` that its options give, from the parsed ``args``."""
    out = {}
    for f, opt in declared(cls):
        if f.name in skip:
            continue
        value = getattr(args, f.name)
        if opt.negate:
            value = not value
        out[f.name] = opt.parse(value) if opt.parse is not None else value
    return out
