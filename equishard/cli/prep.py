"""``equishard prep``: measure every sample into a cost table."""

from __future__ import annotations

import argparse
import json

from dataprep.families.registry import POLICIES
from equishard.cli._common import add_engine_args

__all__ = ["add_parser", "print_summary", "run"]

_DESCRIPTION = """\
Measure every sample of a vision-language dataset: the vision encoder's patches per image (from
the image header only, never decoding pixels) and the LLM sequence length (a real tokenizer over
the rendered conversation, each <image> counted as its policy's tokens). Writes the cost table
(Parquet, one row per sample) and, next to it, an errors table (COST.errors.parquet) with one row
per rejected sample and its reason. Samples in = written + rejected, always.

inputs:
  .json     a LLaVA-style list of records        .jsonl   one record per line (streamed)
  .parquet  image column + text/messages column  .tar     WebDataset (KEY.json + KEY.jpg ...)
  DIR       a Hugging Face dataset saved with save_to_disk
  Records use LLaVA 'conversations' (from/value) or chat 'messages' (role/content); images in
  'image' (a path or a list of paths, resolved against --image-root) or embedded bytes.

vision policies (--vision-policy):
{policies}

examples:
  equishard prep data/llava.json --image-root data/images --tokenizer tok/tokenizer.json \\
      --vision-policy internvl --workers 8 -o build/cost.parquet
  # split across 4 machines, then combine:
  equishard prep data/*.jsonl --tokenizer tok.json --shard-index 2 --num-shards 4 -o part2.parquet
  equishard merge part*.parquet -o build/cost.parquet
"""


def _policies_help() -> str:
    """Every vision policy's lines, from the families' specs (dataprep.families)."""
    out = [
        "  fixed:S/P   resize to SxS, (S/P)^2 patches per image       (LLaVA-1.5: fixed:336/14 -> 576)"
    ]
    for name, spec in POLICIES.items():
        lines = spec.help.splitlines() or [""]
        if len(name) > 10:
            out += [f"  {name}", *(f"{'':14}{line}" for line in lines)]
        else:
            out += [f"  {name:<12}{lines[0]}", *(f"{'':14}{line}" for line in lines[1:])]
    return "\n".join(out)


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(
        name,
        help="measure samples into a cost table (Parquet)",
        description=_DESCRIPTION.format(policies=_policies_help()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "inputs", nargs="+", metavar="INPUT", help="dataset files or HF dataset directories"
    )
    p.add_argument(
        "-o", "--output", required=True, metavar="COST_TABLE", help="cost table to write (.parquet)"
    )
    p.add_argument(
        "--tokenizer",
        metavar="T",
        help="tokenizer.json of the model you train (required), or 'estimate:chars_per_token=F' "
        "to estimate text tokens from characters (recorded in the table's metadata)",
    )
    p.add_argument(
        "--vision-policy",
        default="internvl",
        metavar="P",
        help=f"fixed:S/P, {', '.join(POLICIES)} with options "
        "(internvl:max_tiles=6, "
        "qwen2vl:max_pixels=1003520,resize=qwen-vl-utils; resize=transformers is the "
        "default) (default: internvl)",
    )
    p.add_argument(
        "--template",
        default="chatml",
        metavar="NAME|FILE|DIR",
        help="chat template whose tokens are counted. Exact: the model's own Jinja template -- "
        "its directory, chat_template.jinja, chat_template.json or tokenizer_config.json "
        "(image markers expanded as the family's processor does, the family found from the "
        "template; PATH#images=FAMILY to choose, and for DeepSeek-VL and Janus, whose "
        "templates write the same marker: PATH#images=deepseek_vl|janus). Built-in "
        "fallbacks: chatml, vicuna, plain, or a JSON file with fields bos, system_prompt, "
        "prefix{system,user,assistant}, suffix, image_prefix, image_suffix (default: chatml)",
    )
    p.add_argument(
        "--image-root",
        metavar="DIR",
        help="directory that relative image paths start from (default: each input's directory)",
    )
    p.add_argument(
        "--image-column", metavar="COL", help="Parquet/HF image column (default: image or images)"
    )
    p.add_argument(
        "--text-column",
        metavar="COL",
        help="Parquet/HF text column (default: conversations, messages or text)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="W",
        help="worker processes (default: 1; with --engine local at most one per usable core, "
        "$EQUISHARD_CORES to say how many a container has)",
    )
    add_engine_args(p, "measure")
    p.add_argument(
        "--chunk-size",
        type=int,
        default=1024,
        metavar="N",
        help="records per work unit (default: 1024)",
    )
    p.add_argument(
        "--shard-index",
        type=int,
        default=0,
        metavar="K",
        help="this machine's part, 0-based (default: 0)",
    )
    p.add_argument(
        "--num-shards",
        type=int,
        default=1,
        metavar="N",
        help="number of parts the input is split into (default: 1)",
    )
    p.add_argument(
        "--check-images",
        choices=("header", "decode"),
        default="header",
        help="how each image is checked: 'header' reads its header and walks its structure to "
        "the end marker without decoding pixels (default); 'decode' fully decodes it with Pillow "
        "(exact, slower)",
    )
    p.add_argument(
        "--allow-outside-image-root",
        action="store_true",
        help="read image paths that resolve outside --image-root ('..', absolute paths, "
        "symlinks leading out); by default such a sample is rejected (reason unsafe_path)",
    )
    p.add_argument(
        "--cache",
        metavar="COST_TABLE",
        default=None,
        help="an earlier cost table: a sample whose id and cache key (record bytes, image file "
        "sizes and mtimes) match keeps its row, without its images being read or its text "
        "tokenized. Its tokenizer (by content), template and vision policy must be this "
        "prep's and its image check at least as strict, else it is refused",
    )
    p.add_argument(
        "--max-error-rate",
        type=float,
        default=0.01,
        metavar="F",
        help="abort when more than this fraction of samples is rejected (default: 0.01)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the summary as JSON instead of a table"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(run=run)


def print_summary(res) -> None:
    from dataprep.errors import REASONS
    from equishard.cli._common import format_table

    rate = res.n_in / res.seconds if res.seconds else 0.0
    print(
        f"\nprep: {res.n_in} samples in = {res.n_written} written + {res.n_rejected} rejected "
        f"({res.seconds:.1f} s, {rate:,.0f} samples/s)"
    )
    print(f"  cost table:     {res.output}\n  errors table:   {res.errors_output}")
    for key, label in (("template", "template"), ("vision_policy", "vision policy"),
                       ("tokenizer", "tokenizer")):  # fmt: skip
        if res.settings.get(key):
            print(f"  {label + ':':<15} {res.settings[key]}")
    for w in res.warnings:
        print(f"  warning:        {w}")
    if res.n_cached:
        print(
            f"  reused:         {res.n_cached} rows from the cache (unchanged samples, not re-read)"
        )
    if res.damaged_ranges:
        print(
            f"  damaged:        {res.damaged_ranges} byte range(s) of tars held no readable "
            "sample (rows of the errors table with no sample_id; not counted as samples)"
        )
    if res.modalities:
        print("  modality:       " + ", ".join(f"{k} {v}" for k, v in res.modalities.items()))
    if res.reasons:
        print("\nrejected by reason:")
        print(
            format_table(
                ["reason", "samples", "meaning"],
                [(k, v, REASONS.get(k, "")) for k, v in res.reasons.items()],
            )
        )
    if res.n_written:
        rows = []
        for name, p in res.percentiles.items():
            rows.append(
                [name]
                + [f"{p[k]:,.0f}" for k in ("min", "p50", "p90", "p99", "max")]
                + [f"{p['mean']:,.1f}"]
            )
        print("\nper-sample distribution:")
        print(format_table(["column", "min", "p50", "p90", "p99", "max", "mean"], rows))


def run(args: argparse.Namespace) -> int:
    from dataprep.errors import DataprepError
    from dataprep.prep import PrepConfig, run_prep
    from equishard.cli._common import check_output, fail

    try:
        check_output(args.output)
        cfg = PrepConfig(
            inputs=tuple(args.inputs),
            output=args.output,
            tokenizer=args.tokenizer,
            vision_policy=args.vision_policy,
            template=args.template,
            image_root=args.image_root,
            image_column=args.image_column,
            text_column=args.text_column,
            workers=args.workers,
            chunk_size=args.chunk_size,
            shard_index=args.shard_index,
            num_shards=args.num_shards,
            max_error_rate=args.max_error_rate,
            cache=args.cache,
            check_images=args.check_images,
            allow_outside_image_root=args.allow_outside_image_root,
            progress=not args.no_progress and not args.json,
            engine=args.engine,
            ray_address=args.ray_address,
            task_timeout=args.task_timeout or None,
        )
        res = run_prep(cfg)
    except (ValueError, DataprepError) as exc:
        return fail(str(exc))
    if args.json:
        counts = {"in": res.n_in, "out": res.n_written, "rejected": res.n_rejected}
        print(json.dumps({"command": "prep", "status": "ok", "counts": counts, **res.as_dict()}))
    else:
        print_summary(res)
    return 0
