"""The embedded demo set: a deterministic LLaVA-format dataset with real image files.

``make_demo(out_dir, samples=N, seed=S)`` writes ``demo.jsonl`` (LLaVA records: ``id``, ``image``
as a string or list, ``conversations`` with ``from``/``value`` and ``<image>`` placeholders),
``images/`` (JPEG and PNG files from ~200 to ~4000 px per side, with odd aspect ratios; some JPEGs
carry an EXIF orientation, as phone photos do, and are counted as displayed), and the
demo's ``tokenizer.json``. The mix: ~10% text-only, ~75% one image, ~15% 2–6 images; 1–8 turns;
answers from a few words to ~2k tokens. The same seed gives the same bytes.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import Image

from dataprep.demo_media import MEDIA_DIR, write_audios, write_videos
from equishard.common.values import check_count

__all__ = ["DEMO_WORDS", "DemoSummary", "demo_text_corpus", "make_demo", "split_days"]

DEMO_WORDS = tuple(
    (
        "the a an of and to in is on with for at by from this that these those it its as are was were "
        "be has have there here which where when while what who how why can could should would may "
        "might image picture photo chart graph table diagram figure map screen page document plot "
        "axis bar line legend label title value values number numbers percent total average year "
        "years month left right top bottom middle center corner side background foreground front "
        "behind above below near next between inside outside red blue green yellow orange purple "
        "black white gray brown pink dark light bright large small tall short wide narrow long round "
        "square old new man woman person people child children dog cat bird horse car bus train truck "
        "bicycle boat plane street road building house window door tree trees grass flower sky cloud "
        "water river lake sea beach mountain hill field park city room kitchen table chair sofa bed "
        "lamp plate cup bottle food pizza sandwich fruit apple banana cake shows show showing shown "
        "contains depicts appears seems looks stands sits holds carries walks runs rides plays eats "
        "wearing shirt hat jacket dress shoes sign text word words letter letters highest lowest "
        "increase decrease trend compared rate share growth data series point points first second "
        "third last one two three four five six seven eight nine ten hundred thousand million answer "
        "question because therefore however also only more most less least many few several each "
        "every all some other another same different similar about around approximately exactly "
        "clearly visible likely possible overall detail details describe explain identify count read "
        "find scene view area region part parts color colors shape shapes size pattern style surface "
        "object objects item items group groups step steps reason result results based given using"
    ).split()
)

_QUESTIONS = (
    "What is shown in the image?",
    "Describe the image in detail.",
    "What color is the {w} in the {w2}?",
    "How many {w} are visible?",
    "What does the chart say about the {w}?",
    "Which {w} has the highest value?",
    "Read the text on the {w}.",
    "What is the relationship between the {w} and the {w2}?",
    "Explain the trend shown in the figure.",
    "Is there a {w} near the {w2}?",
)


@dataclass(frozen=True, slots=True)
class DemoSummary:
    samples: int
    images: int
    text_only: int
    single_image: int
    multi_image: int
    out_dir: str
    videos: int = 0  # samples with a clip (``media=True``)
    audios: int = 0  # samples with a recording


def _sentence(rng: np.random.Generator, n_words: int) -> str:
    idx = rng.integers(0, len(DEMO_WORDS), n_words)
    words = [DEMO_WORDS[i] for i in idx]
    words[0] = words[0].capitalize()
    if n_words > 6 and rng.random() < 0.3:
        words.insert(int(rng.integers(1, n_words)), str(int(rng.integers(0, 2030))))
    return " ".join(words) + ("." if rng.random() < 0.85 else ",")


def _answer(rng: np.random.Generator) -> str:
    # Answer lengths in words: short, medium and long answers up to ~1.5k words (~2k tokens).
    kind = rng.random()
    if kind < 0.40:
        n = int(rng.integers(2, 30))
    elif kind < 0.88:
        n = int(np.exp(rng.uniform(np.log(30), np.log(300))))
    else:
        n = int(np.exp(rng.uniform(np.log(300), np.log(1500))))
    sentences, left = [], n
    while left > 0:
        k = min(left, int(rng.integers(4, 22)))
        sentences.append(_sentence(rng, k))
        left -= k
    return " ".join(sentences)


def _question(rng: np.random.Generator) -> str:
    q = _QUESTIONS[int(rng.integers(0, len(_QUESTIONS)))]
    w, w2 = (DEMO_WORDS[int(i)] for i in rng.integers(60, len(DEMO_WORDS), 2))
    q = q.format(w=w, w2=w2)
    if rng.random() < 0.3:
        q = _sentence(rng, int(rng.integers(5, 25))) + " " + q
    return q


def _image_size(rng: np.random.Generator, png: bool) -> tuple[int, int]:
    long_side = float(np.exp(rng.uniform(np.log(200), np.log(1600 if png else 4000))))
    if rng.random() < 0.7:
        ratio = float(rng.choice([1.0, 4 / 3, 3 / 2, 16 / 9, 3 / 4, 2 / 3, 9 / 16]))
    else:
        ratio = float(np.exp(rng.uniform(np.log(1 / 6), np.log(6))))  # odd aspect ratios
    if ratio >= 1:
        w, h = long_side, long_side / ratio
    else:
        w, h = long_side * ratio, long_side
    return max(48, round(w)), max(48, round(h))


def _write_image(
    rng: np.random.Generator, path: Path, size: tuple[int, int], png: bool, orientation: int = 1
) -> None:
    # A smooth random color field: cheap to make and encode, yet a real, decodable picture.
    seed = rng.integers(
        0, 256, (int(rng.integers(2, 9)), int(rng.integers(2, 9)), 3), dtype=np.uint8
    )
    img = Image.fromarray(seed, "RGB").resize(size, Image.Resampling.BILINEAR)
    if png:
        img.save(path, format="PNG", compress_level=1)
    elif orientation == 1:
        img.save(path, format="JPEG", quality=85)
    else:  # a camera photo: stored as shot, shown turned (dataprep.image_orientation)
        exif = Image.Exif()
        exif[0x0112] = orientation
        img.save(path, format="JPEG", quality=85, exif=exif)


def demo_text_corpus(seed: int, n: int) -> list[str]:
    """Text in the demo's style (used to train the shipped demo tokenizer)."""
    rng = np.random.default_rng(seed)
    return [_question(rng) + "\n" + _answer(rng) for _ in range(n)]


MARKER = ".equishard-demo"  # in a directory the demo wrote: running it there again is safe
_DEMO_IMAGE = re.compile(r"^\d{6}\.(jpg|png)$")
_DEMO_FILES = re.compile(r"^(demo\.jsonl|tokenizer\.json|images|media|day-\d+\.(jsonl|delete))$")


def _check_ours(out: Path) -> None:
    """The demo replaces ``demo.jsonl``, ``images/`` and ``tokenizer.json`` in ``out``: only in a
    new or empty directory, or one a demo wrote (its marker, or, from before the marker, nothing
    but the demo's own files); never in a user's dataset (its images/ would be deleted)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"{out}: not a directory; give a new or empty directory for the demo")
    entries = {p.name for p in out.iterdir()}
    if not entries or MARKER in entries:
        return
    images = out / "images"
    ours = (
        (out / "demo.jsonl").is_file()
        and all(_DEMO_FILES.match(e) for e in entries)
        and (not images.is_dir() or all(_DEMO_IMAGE.match(p.name) for p in images.iterdir()))
    )
    if not ours:
        raise ValueError(
            f"{out} holds files the demo did not write ({', '.join(sorted(entries)[:5])}): the "
            "demo replaces demo.jsonl, images/ and tokenizer.json there; give a new or empty "
            "directory"
        )


MAX_DEMO_SAMPLES = 10_000_000


def make_demo(
    out_dir: str | Path,
    *,
    samples: int = 1000,
    seed: int = 0,
    images: int | None = None,
    mix: str = "default",
    progress: bool = False,
    media: bool = False,
) -> DemoSummary:
    """Write the demo dataset to ``out_dir`` (created; existing demo files are replaced).

    ``images`` is the number of distinct image files (default: one per image reference up to 600);
    samples draw from them, as samples of real datasets share COCO-style images. ``mix`` is
    ``default`` (text-only/single/multi mix) or ``single-image`` (every sample one image and a
    ~300-token conversation, the prep benchmark's profile). ``media``: about 6 % of the samples
    reference a video clip (LLaVA-Video style: ``"video"``, ``<video>``) and 6 % a recording
    (``"audio"``, ``<audio>``) instead of images, over a few real files in ``media/``
    (:mod:`dataprep.demo_media`); the other samples are as without it.
    """
    # a typo's count would fail after minutes with numpy's MemoryError (10**12: 7 TiB)
    check_count("samples (the demo set's size; prep your own data for more)", samples, 1,
                MAX_DEMO_SAMPLES)  # fmt: skip
    check_count("seed", seed)
    check_count("images (distinct image files; None: one per reference up to 600)", images, 1,
                none=True)  # fmt: skip
    if mix not in ("default", "single-image"):
        raise ValueError(f"mix must be 'default' or 'single-image', got {mix!r}")
    out = Path(out_dir)
    _check_ours(out)
    img_dir = out / "images"
    for old in (img_dir, out / MEDIA_DIR):
        if old.exists():
            shutil.rmtree(old)
    img_dir.mkdir(parents=True)
    (out / MARKER).write_text(
        "written by equishard demo: it replaces demo.jsonl, images/, tokenizer.json\n"
    )
    rng = np.random.default_rng(seed)

    # Image counts per sample, then the pool of distinct image files.
    if mix == "single-image":
        counts = np.ones(samples, dtype=np.int64)
    else:
        kind = rng.random(samples)
        counts = np.where(kind < 0.10, 0, np.where(kind < 0.85, 1, rng.integers(2, 7, samples)))
    # media samples (their own random stream): a clip or a recording in place of the images
    media_kind = np.zeros(samples, dtype=np.int64)  # 0 none, 1 video, 2 audio
    clips: list[str] = []
    recordings: list[str] = []
    if media:
        mrng = np.random.default_rng([seed, 2])
        draw = mrng.random(samples)
        media_kind = np.where(draw < 0.06, 1, np.where(draw < 0.12, 2, 0))
        counts = np.where(media_kind > 0, 0, counts)
        n_files = max(1, min(12, samples // 50))
        clips = write_videos(out, mrng, n_files) if (media_kind == 1).any() else []
        recordings = write_audios(out, mrng, n_files) if (media_kind == 2).any() else []
    n_refs = int(counts.sum())
    n_images = images if images is not None else max(1, min(n_refs, 600))
    n_images = max(1, min(n_images, max(n_refs, 1)))
    names: list[str] = []
    # some JPEGs carry an EXIF orientation, as phone photos do (their own stream: the rest of
    # the demo is as without them)
    turns = np.random.default_rng([seed, 1]).choice(
        [1, 3, 6, 8], n_images, p=[0.85, 0.03, 0.09, 0.03]
    )
    from tqdm import tqdm

    for i in tqdm(
        range(n_images), desc="demo images", unit="img", disable=None if progress else True
    ):
        png = rng.random() < 0.3
        name = f"images/{i:06d}.{'png' if png else 'jpg'}"
        _write_image(rng, out / name, _image_size(rng, png), png, int(turns[i]))
        names.append(name)

    lines = []
    for s in range(samples):
        k = int(counts[s])
        refs = [names[int(j)] for j in rng.integers(0, n_images, k)] if k else []
        if mix == "single-image":
            n_turns = 1
        else:
            n_turns = int(min(8, 1 + rng.geometric(0.45) - 1 + (rng.random() < 0.5)))
            n_turns = max(1, n_turns)
        convs = []
        for t in range(n_turns):
            q = _question(rng)
            if t == 0 and k:
                q = "<image>\n" * k + q
            if t == 0 and media_kind[s]:
                q = ("<video>\n" if media_kind[s] == 1 else "<audio>\n") + q
            a = _sentence(rng, 270) if mix == "single-image" else _answer(rng)
            convs += [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
        rec: dict = {"id": f"demo-{s:07d}"}
        if k == 1:
            rec["image"] = refs[0]
        elif k > 1:
            rec["image"] = refs
        if media_kind[s] == 1:
            rec["video"] = clips[s % len(clips)]
        elif media_kind[s] == 2:
            rec["audio"] = recordings[s % len(recordings)]
        rec["conversations"] = convs
        lines.append(json.dumps(rec, ensure_ascii=False))
    (out / "demo.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with resources.as_file(resources.files("dataprep") / "assets" / "demo_tokenizer.json") as tok:
        shutil.copyfile(tok, out / "tokenizer.json")
    return DemoSummary(
        samples=samples,
        images=n_images,
        text_only=int(((counts == 0) & (media_kind == 0)).sum()),
        single_image=int((counts == 1).sum()),
        multi_image=int((counts > 1).sum()),
        out_dir=str(out),
        videos=int((media_kind == 1).sum()),
        audios=int((media_kind == 2).sum()),
    )


def split_days(
    out_dir: str | Path, *, days: int = 2, updates: int = 5, deletions: int = 3, seed: int = 0
) -> list[Path]:
    """Split ``demo.jsonl`` into arrivals for a nightly job: ``day-1.jsonl`` holds the first
    share of the records; each later ``day-K.jsonl`` holds the next share plus ``updates``
    earlier records with a changed answer, and ``day-K.delete`` lists ``deletions`` earlier ids
    (none of them updated). Deterministic for a seed."""
    if days < 2:
        raise ValueError(f"days must be >= 2 to split, got {days}")
    out = Path(out_dir)
    lines = (out / "demo.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    first = int(len(records) * 0.6)
    rest = np.array_split(np.arange(first, len(records)), days - 1)
    rng = np.random.default_rng(seed)
    written = [out / "day-1.jsonl"]
    written[0].write_text("".join(line + "\n" for line in lines[:first]))
    seen = list(range(first))
    for k, idx in enumerate(rest, start=2):
        picks = rng.choice(len(seen), size=min(len(seen), updates + deletions), replace=False)
        upd, dele = picks[:updates], picks[updates:]
        day = [lines[i] for i in idx]
        for j in upd:
            rec = json.loads(json.dumps(records[seen[j]]))
            turns = rec.get("conversations") or []
            if turns:
                turns[-1]["value"] = turns[-1]["value"] + f" (revised on day {k})"
            day.append(json.dumps(rec, ensure_ascii=False))
        (out / f"day-{k}.jsonl").write_text("".join(line + "\n" for line in day))
        (out / f"day-{k}.delete").write_text("".join(records[seen[j]]["id"] + "\n" for j in dele))
        written.append(out / f"day-{k}.jsonl")
        seen += idx.tolist()
    return written
