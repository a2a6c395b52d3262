"""``equishard import-lengths``: a cost table from per-sample lengths another tool measured."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]

# the line the top-level --help shows
HELP = "turn OmniBal/InternVL length files (vit_num, token_num, image_flags) into a cost table"


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    from dataprep.import_lengths import ImportLengthsConfig
    from equishard.cli._common import add_json_arg
    from equishard.common.options import add_options

    p = sub.add_parser(
        name,
        help=HELP,
        description=(
            "Convert per-sample lengths in the OmniBal / InternVL-Chat format -- a JSON list (or\n"
            'JSON lines) of {"vit_num": TILES, "token_num": LLM_TOKENS, "image_flags": REAL_TILES}\n'
            "-- into an equishard cost table, so the samples can be balanced at once:\n\n"
            "  equishard import-lengths ai2d_lengths.json -o build/cost.parquet\n"
            "  equishard balance build/cost.parquet --dp 8 -o build/plan\n\n"
            "One tile is --patches-per-tile encoder patches (one encoder sequence) and\n"
            "--tokens-per-tile LLM tokens. Sample ids are FILE_STEM:INDEX. Entries that cannot be\n"
            "samples go to COST_TABLE's .errors.parquet with the reason. Writing shards needs the\n"
            "raw data: run 'equishard prep' for that."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, ImportLengthsConfig)  # declared on the configuration's fields
    add_json_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from dataprep.import_lengths import ImportLengthsConfig, import_lengths
    from equishard.cli._common import check_output, print_json
    from equishard.common.options import config_kwargs

    cfg = ImportLengthsConfig(**config_kwargs(ImportLengthsConfig, args))
    check_output(args.output)
    r = import_lengths(cfg)
    if args.json:
        fields = {"output": r.output, "errors_output": r.errors_output, "reasons": r.reasons}
        print_json(
            "import-lengths", ok=True, n_in=r.n_in, n_out=r.n_written, rejected=r.n_rejected,
            **fields,
        )  # fmt: skip
        return 0
    print(
        f"import-lengths: {r.n_in} samples in = {r.n_written} written + {r.n_rejected} rejected"
        f" -> {r.output}"
    )
    if r.n_rejected:
        print(f"  rejected: {r.reasons}; each entry and reason in {r.errors_output}")
    return 0
