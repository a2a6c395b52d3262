"""``equishard import-lengths``: a cost table from per-sample lengths another tool measured."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    from equishard.cli._common import add_json_arg

    p = sub.add_parser(
        name,
        help="turn OmniBal/InternVL length files (vit_num, token_num, image_flags) into a cost table",
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
    p.add_argument("inputs", nargs="+", metavar="LENGTHS", help="length files (.json / .jsonl)")
    p.add_argument(
        "-o", "--output", required=True, metavar="COST_TABLE", help="cost table to write"
    )
    p.add_argument(
        "--patches-per-tile",
        type=int,
        default=1024,
        help="encoder patches per tile (default 1024: InternVL's 448 px tiles at patch 14)",
    )
    p.add_argument(
        "--tokens-per-tile",
        type=int,
        default=256,
        help="LLM tokens per real tile (default 256: 1024 patches after 0.5 pixel shuffle)",
    )
    add_json_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from dataprep.import_lengths import ImportLengthsConfig, import_lengths
    from equishard.cli._common import check_output, print_json

    cfg = ImportLengthsConfig(
        inputs=tuple(args.inputs),
        output=args.output,
        patches_per_tile=args.patches_per_tile,
        tokens_per_tile=args.tokens_per_tile,
    )
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
