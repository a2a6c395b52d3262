"""``equishard demo``: write the embedded demo dataset."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]

# the line the top-level --help shows
HELP = "write a deterministic LLaVA-format demo dataset with real images"


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    from equishard.cli._common import add_json_arg

    p = sub.add_parser(
        name,
        help=HELP,
        description=(
            "Write a deterministic LLaVA-format dataset to OUT_DIR: demo.jsonl (conversations with\n"
            "<image> placeholders), images/ (real JPEG and PNG files, ~200 to ~4000 px, odd aspect\n"
            "ratios) and tokenizer.json (a small BPE tokenizer for it). About 10%% text-only, 75%%\n"
            "single-image and 15%% multi-image samples. The same --seed gives the same bytes."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="directory to write (created if missing)")
    p.add_argument("--samples", type=int, default=1000, help="number of samples (default: 1000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument(
        "--images",
        type=int,
        default=None,
        help="distinct image files that samples draw from (default: one per reference, at most 600)",
    )
    p.add_argument(
        "--mix",
        choices=("default", "single-image"),
        default="default",
        help="'default' mix, or 'single-image': every sample one image and ~300 text tokens",
    )
    p.add_argument(
        "--media",
        action="store_true",
        help="also write a few video clips and recordings to OUT_DIR/media/ that about 6%% and "
        "6%% of the samples reference instead of images (prep them with --video-rule and "
        "--audio-rule)",
    )
    p.add_argument(
        "--days",
        type=int,
        default=None,
        help="also split it into day-1.jsonl, day-2.jsonl, ... for the nightly job: each later "
        "day adds new records, updates 5 earlier ones and lists 3 to delete in day-K.delete",
    )
    add_json_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from dataprep.demo import make_demo, split_days
    from equishard.cli._common import check_output_dir, fail, print_json

    if args.days is not None and args.days < 2:
        return fail(f"--days must be >= 2 (day 1 and at least one later day), got {args.days}")
    try:
        check_output_dir(args.out_dir)
        s = make_demo(
            args.out_dir,
            samples=args.samples,
            seed=args.seed,
            images=args.images,
            mix=args.mix,
            progress=not args.json,
            media=args.media,
        )
        days = split_days(args.out_dir, days=args.days, seed=args.seed) if args.days else []
    except ValueError as exc:
        return fail(str(exc))
    if args.json:
        fields = {"path": str(s.out_dir), "images": s.images, "days": [str(d) for d in days]}
        if args.media:
            fields.update(videos=s.videos, audios=s.audios)
        print_json("demo", ok=True, n_in=s.samples, n_out=s.samples, rejected=0, **fields)
        return 0
    if days:
        print("demo: nightly arrivals " + ", ".join(str(d) for d in days))
    media = f", {s.videos} with a video, {s.audios} with a recording" if args.media else ""
    print(
        f"demo: {s.samples} samples ({s.text_only} text-only, {s.single_image} single-image, "
        f"{s.multi_image} multi-image{media}) over {s.images} image files\n"
        f"      {s.out_dir}/demo.jsonl, {s.out_dir}/images/, {s.out_dir}/tokenizer.json"
        + (f", {s.out_dir}/media/" if args.media else "")
    )
    return 0
