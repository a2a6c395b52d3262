"""Gemma 3's vision policy: hand-worked pan-and-scan cases, its crops against
``Gemma3ImageProcessorPil.pan_and_scan`` over thousands of sizes, and the text an image with
crops brings in front of the template's own image start."""

import math
import random

import numpy as np
import pytest

from dataprep.errors import SampleRejected
from dataprep.measure import with_image_text
from dataprep.policies import parse_vision_policy
from dataprep.records import IMAGE_PLACEHOLDER
from tests.conftest import built_or_refused

PAS = "gemma3:pan_and_scan=1"


@pytest.mark.parametrize(
    ("spec", "w", "h", "crops"),
    [
        (PAS, 896, 896, 0),  # square: below the 1.2 aspect that starts it
        (PAS, 1190, 1000, 0),  # aspect 1.19
        (PAS, 1000, 500, 2),  # aspect 2: two 500-px crops
        (PAS, 900, 300, 3),  # aspect 3, and 900 px hold three 256-px crops
        (PAS, 600, 400, 2),  # aspect 1.5 rounds to 2: two 300 x 400 crops
        (PAS, 1000, 400, 3),  # aspect 2.5: half rounds up, three 334 x 400 crops
        (PAS, 3000, 500, 4),  # aspect 6, at most 4 crops (750 x 500)
        (PAS, 500, 300, 0),  # 2 at least, but 250-px crops are under 256: none
        (PAS, 300, 1000, 3),  # portrait: aspect 3.3, three 300 x 334 crops one above the other
        (PAS + ",min_ratio=1", 1000, 1000, 2),  # a square too: at least two crops
        (PAS + ",max_crops=6,min_crop_size=100", 3000, 500, 6),
        ("gemma3", 900, 300, 0),  # the processor's default: no pan-and-scan
    ],
)
def test_gemma3_hand_worked(spec, w, h, crops):
    p = parse_vision_policy(spec)
    c = p.image_cost(w, h)
    assert c.vit_seq_lens == (4096,) * (1 + crops) and c.llm_tokens == 256 * (1 + crops)
    assert bool(c.before) == bool(crops) and c.text == ""
    assert c.after.count("<start_of_image>") == crops
    assert parse_vision_policy(p.spec()) == p


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("gemma3:min_ratio=wide", "min_ratio takes a finite number"),
        ("gemma3:pan_and_scan=1,max_crops=1", "max_crops >= 2"),
        ("gemma3:min_ratio=0.5", "min_ratio"),
        ("gemma3:llm_tokens=250", "square"),
    ],
)
def test_gemma3_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_vision_policy(spec)


@pytest.mark.parametrize("settings", [{}, {"min_crop_size": 128, "max_crops": 6, "min_ratio": 1.5}])
def test_gemma3_crops_equal_its_image_processor(settings):
    """The crops of 4000 sizes equal ``Gemma3ImageProcessorPil.pan_and_scan``'s, in number and
    in size (each resized to 896 x 896, so each costs one image)."""
    pytest.importorskip("transformers")
    from transformers.models.gemma3 import Gemma3ImageProcessorPil

    from dataprep.policies.gemma3 import gemma3_crops

    ip = Gemma3ImageProcessorPil()
    spec = PAS + "".join(f",{k}={v}" for k, v in settings.items())
    policy = parse_vision_policy(spec)
    kw = dict(
        pan_and_scan_min_crop_size=policy.min_crop_size,
        pan_and_scan_max_num_crops=policy.max_crops,
        pan_and_scan_min_ratio_to_activate=policy.min_ratio,
    )
    rng = random.Random(5)
    sizes = [(rng.randint(1, 5000), rng.randint(1, 5000)) for _ in range(3000)]
    sizes += [(rng.randint(200, 1500), rng.randint(200, 1500)) for _ in range(1000)]
    wrong, some = [], 0
    for w, h in sizes:
        image = np.broadcast_to(np.zeros((1, 1, 1), np.uint8), (3, h, w))  # no pixels needed
        crops = ip.pan_and_scan(image=image, **kw)
        cols, rows = gemma3_crops(w, h, policy.min_crop_size, policy.max_crops, policy.min_ratio)
        some += bool(crops)
        if len(crops) != cols * rows or len(policy.image_cost(w, h).vit_seq_lens) != 1 + len(crops):
            wrong.append((w, h, len(crops), cols, rows))
        elif crops and {c.shape[1:] for c in crops[:-1]} != {(-(-h // rows), -(-w // cols))}:
            wrong.append((w, h, [c.shape for c in crops]))
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"
    assert 0.3 * len(sizes) < some < 0.95 * len(sizes)


def test_pan_and_scan_sentence_goes_before_the_template_image_start(tmp_path, tokenizer_path):
    """An image with crops: the text prep counts is ``Gemma3Processor.replace_image_token``'s
    where the template wrote the image's block (its soft tokens the placeholder, the crops'
    counted apart); an image without crops keeps the template's block."""
    pytest.importorskip("transformers")
    from tests.dataprep.test_jinja_template import make_model_dir, processor_for

    processor = processor_for("gemma3", make_model_dir(tmp_path, "gemma3", tokenizer_path))
    soft = processor.tokenizer.image_token * processor.image_seq_length
    policy = parse_vision_policy(PAS)
    start, end = "\n\n<start_of_image>", "<end_of_image>\n\n"
    assert processor.full_image_sequence == start + soft + end  # the template family's block
    block = start + IMAGE_PLACEHOLDER + end
    costs = [policy.image_cost(1000, 500), policy.image_cost(10, 10)]
    got = with_image_text(f"a{block}b{block}", costs, start)
    theirs = processor.replace_image_token({"num_crops": [2]}, 0)
    want = theirs.replace(soft, IMAGE_PLACEHOLDER, 1).replace(soft, "")
    assert got == f"a{want}b{block}"
    with pytest.raises(SampleRejected, match="image start"):  # another family's template
        with_image_text(f"a{IMAGE_PLACEHOLDER}b", costs[:1], start)


def _limit_sizes(min_crop_size, min_ratio):
    """Sizes at, one below and one above each limit pan-and-scan has: the aspect that starts it
    (min_ratio x the short side), half-way aspects (round half up), a long side of k whole
    min_crop_size pieces, and crops exactly min_crop_size wide; both orientations."""
    sizes = set()
    for short in (min_crop_size - 1, min_crop_size, min_crop_size + 1, 300, 333, 400, 500):
        if short < 1:
            continue
        for k2 in range(2, 14):  # aspect k2 / 2: whole and half-way ratios
            sizes.add((short * k2 // 2, short))
        at = math.ceil(short * min_ratio)
        for k in range(2, 8):
            sizes.update({(k * min_crop_size + e, short) for e in (-1, 0, 1)})
        sizes.update({(at + e, short) for e in (-1, 0, 1)})
    return sorted({(w, h) for w, h in sizes if w >= 1} | {(h, w) for w, h in sizes if w >= 1})


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"min_crop_size": 128, "max_crops": 6, "min_ratio": 1.5},
        {"min_crop_size": 1, "max_crops": 2, "min_ratio": 1.0},
    ],
)
def test_gemma3_crops_at_every_limit_equal_its_image_processor(settings):
    """Anchor: ``Gemma3ImageProcessorPil.pan_and_scan`` at, below and above each of its limits
    (the random sizes above rarely land on one)."""
    pytest.importorskip("transformers")
    from transformers.models.gemma3 import Gemma3ImageProcessorPil

    from dataprep.policies.gemma3 import gemma3_crops

    ip = Gemma3ImageProcessorPil()
    policy = parse_vision_policy(PAS + "".join(f",{k}={v}" for k, v in settings.items()))
    kw = dict(
        pan_and_scan_min_crop_size=policy.min_crop_size,
        pan_and_scan_max_num_crops=policy.max_crops,
        pan_and_scan_min_ratio_to_activate=policy.min_ratio,
    )
    wrong = []
    sizes = _limit_sizes(policy.min_crop_size, policy.min_ratio)
    for w, h in sizes:
        image = np.broadcast_to(np.zeros((1, 1, 1), np.uint8), (3, h, w))
        crops = ip.pan_and_scan(image=image, **kw)
        cols, rows = gemma3_crops(w, h, policy.min_crop_size, policy.max_crops, policy.min_ratio)
        if len(crops) != cols * rows or (
            crops and {c.shape[1:] for c in crops[:-1]} != {(-(-h // rows), -(-w // cols))}
        ):
            wrong.append((w, h, len(crops), cols, rows))
    assert not wrong, f"{len(wrong)} of {len(sizes)} differ, e.g. {wrong[:3]}"


@pytest.mark.parametrize(
    ("kw", "bad"),
    [
        ({}, None),
        ({"image_size": 0}, "image_size divisible by patch_size, got 0/14"),
        ({"patch_size": 0}, "image_size divisible by patch_size, got 896/0"),
        ({"image_size": 900}, "got 900/14"),
        ({"image_size": 14}, None),  # one patch, pooled to one token
        ({"image_size": 14, "llm_tokens": 1}, None),
        ({"llm_tokens": 0}, "must be a square whose side divides 64, got llm_tokens=0"),
        ({"llm_tokens": 4096}, None),  # the grid itself: side 64
        ({"llm_tokens": 16384}, "side divides 64"),  # side 128
        ({"llm_tokens": 255}, "a square"),
        ({"llm_tokens": 36}, "side divides 64"),  # 6 does not divide 64
        ({"llm_tokens": 1}, None),
        ({"llm_tokens": 17}, "a square"),  # its root's floor, 4, divides 64: still no square
        ({"llm_tokens": 68}, "a square"),
        ({"image_size": 14, "patch_size": 1, "llm_tokens": 49}, None),  # a patch of 1 pixel
        ({"min_crop_size": 1}, None),
        (
            {"min_crop_size": 0},
            "min_crop_size >= 1, max_crops >= 2 and min_ratio >= 1, got 0, 4, 1.2",
        ),
        ({"max_crops": 2}, None),
        ({"max_crops": 1}, "got 256, 1, 1.2"),
        ({"min_ratio": 1.0}, None),
        ({"min_ratio": 0.999}, "got 256, 4, 0.999"),
    ],
)
def test_gemma3_settings_at_below_and_above_their_limits(kw, bad):
    from dataprep.policies.gemma3 import Gemma3Policy

    if "image_size" in kw and "llm_tokens" not in kw and bad is None:
        kw = {**kw, "llm_tokens": 1}
    p = built_or_refused(Gemma3Policy, kw, bad)
    if p is None:
        return
    assert p.image_cost(100, 100).vit_seq_lens == ((p.image_size // p.patch_size) ** 2,)
    assert p.image_cost(100, 100).llm_tokens == p.llm_tokens


def test_gemma3_text_around_an_image_with_crops_and_the_spec():
    """By hand, two crops: the sentence before the image's own block; after it, the block's
    end, the crops' sentence and each crop's block joined by a space, the last one's end left
    to the template. The spec names pan-and-scan's settings only where it is on."""
    from dataprep.policies.gemma3 import Gemma3Policy

    c = Gemma3Policy(pan_and_scan=True).image_cost(1000, 500)
    block = "\n\n<start_of_image><end_of_image>\n\n"
    assert c.before == "Here is the original image "
    assert c.after == (
        "<end_of_image>\n\n and here are some crops to help you see better "
        + block
        + " "
        + "\n\n<start_of_image>"
    )
    assert Gemma3Policy().spec() == "gemma3:image_size=896,patch_size=14,llm_tokens=256"
    assert Gemma3Policy(pan_and_scan=True, min_ratio=1.25).spec() == (
        "gemma3:image_size=896,patch_size=14,llm_tokens=256,pan_and_scan=1,min_crop_size=256,"
        "max_crops=4,min_ratio=1.25"
    )
    assert Gemma3Policy().image_cost(1000, 500) == Gemma3Policy().image_cost(500, 1000)
    assert Gemma3Policy().image_cost(1000, 500).before == ""


def test_no_crops_is_none_by_none_costs_are_whole_and_the_policy_keyword_only():
    from dataprep.policies.gemma3 import Gemma3Policy, gemma3_crops

    assert gemma3_crops(896, 896, 256, 4, 1.2) == (0, 0)  # below the starting aspect
    assert gemma3_crops(500, 300, 256, 4, 1.2) == (0, 0)  # crops under 256 px
    c = Gemma3Policy(pan_and_scan=True).image_cost(1000, 500)
    assert all(type(n) is int for n in (*c.vit_seq_lens, c.llm_tokens))
    with pytest.raises(TypeError):
        Gemma3Policy(896)
