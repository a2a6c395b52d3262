"""Both qwen2vl resize forms against the code they come from, on a grid of image sizes:
``resize=transformers`` against transformers' ``smart_resize`` and its Qwen2-VL image processor,
``resize=qwen-vl-utils`` against the ``smart_resize`` of the installed qwen-vl-utils (read from
its source: the module imports torchvision, which has no CPU build here)."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from dataprep.errors import SampleRejected
from dataprep.policies import Qwen2VLPolicy, qwen2vl_smart_resize

SIDES = [1, 3, 10, 13, 14, 27, 28, 29, 41, 42, 55, 56, 57, 99, 100, 224, 333, 448, 500, 999, 1000]
SIDES += [1023, 1500, 2000, 2999, 3000, 4000, 5000, 8000]
# the last: a small max_pixels, where a long thin image's short side shrinks below 28 px and
# transformers keeps it at 28 (the only bounds under which that branch is reached)
BOUNDS = [(56 * 56, 28 * 28 * 1280), (256 * 28 * 28, 1280 * 28 * 28), (3136, 200_000)]
BOUNDS += [(3136, 12_544)]
# a min_pixels of one 28-px square: a thin image's short side rounds to 0 (transformers) and
# the product 0 is under it, where a side floored at 1 would pass unscaled
BOUNDS += [(784, 1_003_520)]
GRID = [(h, w, lo, hi) for h, w in itertools.product(SIDES, SIDES) for lo, hi in BOUNDS]


def _ours(h, w, lo, hi, resize):
    try:
        return qwen2vl_smart_resize(h, w, 28, lo, hi, resize)
    except SampleRejected:
        return "rejected"


def _theirs(fn, h, w, lo, hi):
    try:
        return tuple(fn(h, w, factor=28, min_pixels=lo, max_pixels=hi))
    except ValueError:  # aspect ratio over 200
        return "rejected"


def test_transformers_form_equals_transformers_smart_resize():
    # the PIL processor module (the torch one imports torchvision); a copy of the same function
    mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    diff = [
        (h, w, lo, hi)
        for h, w, lo, hi in GRID
        if _ours(h, w, lo, hi, "transformers") != _theirs(mod.smart_resize, h, w, lo, hi)
    ]
    assert not diff, diff[:5]


def _qwen_vl_utils_smart_resize():
    """``smart_resize`` and the helpers it calls, compiled from qwen-vl-utils' own source."""
    spec = importlib.util.find_spec("qwen_vl_utils")
    if spec is None:
        pytest.skip("qwen-vl-utils is not installed (pip install -e '.[dev]')")
    path = spec.submodule_search_locations[0] + "/vision_process.py"
    tree = ast.parse(Path(path).read_text())
    keep = {"smart_resize", "round_by_factor", "ceil_by_factor", "floor_by_factor"}
    nodes = [
        n
        for n in tree.body
        if (isinstance(n, ast.FunctionDef) and n.name in keep)
        or (
            isinstance(n, ast.Assign)
            and isinstance(n.targets[0], ast.Name)
            and n.targets[0].id.isupper()
            and isinstance(n.value, ast.Constant)
        )
    ]
    ns = {"math": math, "Optional": object, "Tuple": tuple}
    exec(compile(ast.Module(nodes, type_ignores=[]), path, "exec"), ns)
    return ns["smart_resize"]


def test_qwen_vl_utils_form_equals_qwen_vl_utils():
    fn = _qwen_vl_utils_smart_resize()
    diff = [
        (h, w, lo, hi)
        for h, w, lo, hi in GRID
        if _ours(h, w, lo, hi, "qwen-vl-utils") != _theirs(fn, h, w, lo, hi)
    ]
    assert not diff, diff[:5]


def test_the_two_forms_differ_where_the_issue_says():
    """On 2,000 random sizes the forms disagree only on small or extreme-aspect images."""
    rng = np.random.default_rng(0)
    sizes = zip(rng.integers(4, 3000, 2000), rng.integers(4, 3000, 2000), strict=True)
    diff = [
        (int(w), int(h))
        for w, h in sizes
        if max(w, h) / min(w, h) <= 200
        and Qwen2VLPolicy(resize="transformers").image_cost(int(w), int(h))
        != Qwen2VLPolicy(resize="qwen-vl-utils").image_cost(int(w), int(h))
    ]
    assert diff
    assert all(min(w, h) < 42 for w, h in diff)  # a side that rounds to 0 or 28 differently


def test_transformers_form_equals_the_image_processor_grid():
    """The patch count the real Qwen2-VL image processor produces for real images."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil()
    policy = Qwen2VLPolicy()
    sizes = [(500, 10), (10, 500), (640, 480), (28, 28), (3000, 20), (1, 57), (4000, 3000)]
    # at the default bounds: 28*28*1280 px (kept), 28*28*1281 (scaled), 56*56 (kept), 84x28
    sizes += [(1120, 896), (1708, 588), (56, 56), (84, 28)]
    for w, h in sizes:
        out = proc(images=[Image.new("RGB", (w, h))], return_tensors="np")
        t, gh, gw = out["image_grid_thw"][0]
        cost = policy.image_cost(w, h)
        assert cost.vit_seq_lens == (int(t * gh * gw),), (w, h)
        # whole numbers (the cost table's int32 lengths), not floats equal to them
        assert type(cost.vit_seq_lens[0]) is int and type(cost.llm_tokens) is int
        # the size the image is resized to before its patches are cut
        assert policy.resized(w, h) == (int(gh) * 14, int(gw) * 14), (w, h)


def test_qwen3vl_spec_equals_qwen3vl_image_processor():
    """``qwen3vl``: the patch grid of Qwen3-VL's released image processor settings (16-px
    patches, 2x2 merge, 65536..16777216 pixels) on real images, small, thin and large."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    from dataprep.policies import parse_vision_policy

    proc = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 65536, "longest_edge": 16777216},
        patch_size=16,
        merge_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    policy = parse_vision_policy("qwen3vl")
    for w, h in [
        (32, 32),
        (300, 200),
        (640, 480),
        (1001, 333),
        (2000, 10),
        (250, 4000),
        (4100, 4100),
        # scaled up to min_pixels: 65,536 takes these to one more 32-px column than 65,535
        (343, 7),
        (525, 21),
    ]:
        out = proc(images=[Image.new("RGB", (w, h))], return_tensors="np")
        t, gh, gw = out["image_grid_thw"][0]
        cost = policy.image_cost(w, h)
        assert cost.vit_seq_lens == (int(t * gh * gw),), (w, h)
        assert cost.llm_tokens == int(t * gh * gw) // 4
    assert parse_vision_policy("qwen3vl:max_pixels=1000000").max_pixels == 1_000_000


def test_ernie45vl_spec_equals_ernie_image_processor():
    """``ernie45vl``: ERNIE 4.5-VL's own image processor (its defaults: 14-px patches, 2x2
    merge, 3136..4842768 pixels) over 3000 sizes by its count helper, and on real images, small,
    thin and large; an aspect ratio above 200 refused by both."""
    import random

    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.ernie4_5_vl_moe import Ernie4_5_VLMoeImageProcessorPil

    from dataprep.errors import SampleRejected
    from dataprep.policies import parse_vision_policy

    proc = Ernie4_5_VLMoeImageProcessorPil()
    policy = parse_vision_policy("ernie45vl")
    rng = random.Random(3)
    wrong = []
    for w, h in [(rng.randint(1, 6000), rng.randint(1, 6000)) for _ in range(3000)]:
        if max(w, h) / min(w, h) > 200:
            continue
        want = proc.get_number_of_image_patches(h, w, {})
        if policy.image_cost(w, h).vit_seq_lens != (want,):
            wrong.append(((w, h), want, policy.image_cost(w, h)))
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"
    for w, h in [(28, 28), (300, 200), (1001, 333), (2000, 10), (250, 4000), (3000, 2600)]:
        out = proc(images=[Image.new("RGB", (w, h))], return_tensors="np")
        t, gh, gw = out["image_grid_thw"][0]
        cost = policy.image_cost(w, h)
        assert cost.vit_seq_lens == (int(t * gh * gw),), (w, h)
        assert cost.llm_tokens == int(t * gh * gw) // 4
    with pytest.raises(ValueError):
        proc(images=[Image.new("RGB", (2010, 10))], return_tensors="np")
    with pytest.raises(SampleRejected):
        policy.image_cost(2010, 10)
    assert parse_vision_policy("ernie45vl:max_pixels=1000000").max_pixels == 1_000_000


@pytest.mark.parametrize("merge", [1, 3])
def test_merge_sizes_other_than_2_equal_the_image_processor(merge):
    """The 2x2 merge's 4 is also 2 + 2: merges of 1 and 3 tell a product from a sum. The
    processor's grid, patch count and LLM tokens (patches / merge^2) on real images."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(merge_size=merge)
    policy = Qwen2VLPolicy(merge_size=merge)
    for w, h in [(640, 480), (100, 900), (2000, 1500)]:
        out = proc(images=[Image.new("RGB", (w, h))], return_tensors="np")
        t, gh, gw = (int(x) for x in out["image_grid_thw"][0])
        cost = policy.image_cost(w, h)
        assert cost.vit_seq_lens == (t * gh * gw,) and cost.llm_tokens == t * gh * gw // merge**2
        assert policy.resized(w, h) == (gh * 14, gw * 14)
