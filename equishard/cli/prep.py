"""``equishard prep``: measure every sample into a cost table."""

from __future__ import annotations

import argparse
import json

from dataprep.families.registry import POLICIES
from dataprep.media_rules.registry import AUDIO_RULES, VIDEO_RULES
from dataprep.prep_config import PrepConfig
from equishard.common.options import add_options, config_kwargs

__all__ = ["add_parser", "print_summary", "run"]

# the line the top-level --help shows
HELP = "measure samples into a cost table (Parquet)"

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

video and audio rules (--video-rule, --audio-rule; read from each file's header, no frame or
sample decoded; without a rule, a sample carrying one is refused, never counted as text):
{media}

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


def _media_help() -> str:
    """Every video and audio rule's lines (dataprep.media_rules.registry), wrapped as the
    policies' are: a name past the column on a line of its own."""
    import textwrap

    out = []
    for name, entry in {**VIDEO_RULES, **AUDIO_RULES}.items():
        lines = textwrap.wrap(entry.help, 84, break_on_hyphens=False)
        if len(name) > 12:
            out += [f"  {name}", *(f"{'':16}{line}" for line in lines)]
        else:
            out += [f"  {name:<14}{lines[0]}", *(f"{'':16}{line}" for line in lines[1:])]
    return "\n".join(out)


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(
        name,
        help=HELP,
        description=_DESCRIPTION.format(policies=_policies_help(), media=_media_help()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # declared on PrepConfig's fields
    add_options(
        p,
        PrepConfig,
        what="measure",
        policies=", ".join(POLICIES),
        video_rules=", ".join(VIDEO_RULES),
        audio_rules=", ".join(AUDIO_RULES),
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
                       ("video_rule", "video rule"), ("audio_rule", "audio rule"),
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
            **config_kwargs(PrepConfig, args), progress=not args.no_progress and not args.json
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
