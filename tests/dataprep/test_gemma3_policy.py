"""Gemma 3's vision policy: hand-worked pan-and-scan cases, its crops against
``Gemma3ImageProcessorPil.pan_and_scan`` over thousands of sizes, and the text an image with
crops brings in front of the template's own image start."""

import random

import numpy as np
import pytest

from dataprep.errors import SampleRejected
from dataprep.measure import with_image_text
from dataprep.policies import parse_vision_policy
from dataprep.records import IMAGE_PLACEHOLDER

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
