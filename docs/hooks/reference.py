"""MkDocs hook: replace ``<!-- cli-reference -->`` with every subcommand's ``--help``, taken from
the argparse definitions of ``equishard.cli``, and ``<!-- api-reference -->`` with a mkdocstrings
block per name of each package's ``__all__``, when the site is built (so neither can go stale)."""

from __future__ import annotations

import argparse

MARKER = "<!-- cli-reference -->"


def _help(parser: argparse.ArgumentParser) -> str:
    return parser.format_help().replace("```", "'''")


def render() -> str:
    import os

    from equishard.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the same width everywhere
    parser = build_parser()
    out = ["## equishard", "", "```text", _help(parser).rstrip(), "```", ""]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        out += [f"## equishard {name}", "", "```text", _help(p).rstrip(), "```", ""]
    return "\n".join(out)


API_MARKER = "<!-- api-reference -->"
PACKAGES = ("dataprep", "balancing", "shards", "trainer_adapter")


def render_api() -> str:
    """One mkdocstrings block per name in each package's ``__all__``."""
    import importlib

    out = []
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        summary = (pkg.__doc__ or "").strip().split("\n\n")[0]
        out += [f"## {name}", "", summary, ""]
        for member in pkg.__all__:
            obj = getattr(pkg, member)  # lazy exports resolve to the module that defines them
            where = getattr(obj, "__module__", None)
            qual = getattr(obj, "__qualname__", None)
            ours = where and where.split(".")[0] in (*PACKAGES, "equishard")
            path = f"{where}.{qual}" if ours and qual else None
            out += [
                f"::: {path or f'{name}.{member}'}",
                "    options:",
                "      show_root_heading: true",
                "      show_root_full_path: false",
                "      heading_level: 3",
                "",
            ]
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """The CLI page's and the API page's generated parts, where their markers are."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, render())
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, render_api())
    return markdown
