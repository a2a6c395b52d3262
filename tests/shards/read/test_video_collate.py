"""The collator of a generation with videos (InternVL's rule) hands the encoder the frames the
model's loader takes, tiled as prep counted, with the frame labels prep counted (#67, item 3).

References: the InternVL model card's ``get_index`` and transformers'
``InternVLVideoProcessor.sample_frames`` (run in a process of their own,
:mod:`tests.dataprep.media_reference`), every frame of each clip decoded by PyAV here and painted
with its index, prep's own ``with_media_text`` for the prompt, the template's assistant spans.
Bugs named: the wrong frames (off by one, the segment's start instead of its middle, a short
video's repeats dropped), frames in another order, a frame's tiles out of the encoder order or
after another item's, frame labels missing or elsewhere (the LLM count then differs from prep's),
assistant spans not moved past the labels (a later answer's tokens not learnt, or the labels
learnt), a rule of another family or another patch grid accepted.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dataprep.media_rules import parse_video_rule
from shards.read.collate import Collator
from tests.shards.media_generation import (
    RULES,
    VIDEO_POLICY,
    VIDEO_RULE,
    VIDEOS,
    build_audio_generation,
    frame_level,
)

ROOT = Path(__file__).resolve().parents[3]
GRID = [
    (total, fps, opts)
    for total in (1, 2, 3, 4, 5, 7, 8, 19, 32, 33, 100)
    for fps, opts in [
        (8.0, {"num_frames": 1}),
        (8.0, {"num_frames": 4}),
        (30.0, {"num_frames": 8}),
        (25.0, {"num_frames": 32}),
        (10.0, {"source": "transformers", "num_frames": 0}),
        (10.0, {"source": "transformers", "num_frames": 4}),
        (10.0, {"source": "transformers", "num_frames": 3, "initial_shift": 0}),
        (10.0, {"source": "transformers", "num_frames": 0, "fps": 2.0}),
        (24.0, {"source": "transformers", "num_frames": 0, "fps": 4.0, "initial_shift": 0}),
    ]
]


def _spec(opts: dict) -> str:
    return "internvl:" + ",".join(f"{k}={v}" for k, v in opts.items())


def test_frame_indices_are_the_loaders(tmp_path):
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"indices": [{"total": t, "fps": f, "opts": o} for t, f, o in GRID]}))
    subprocess.run(
        [sys.executable, "-m", "tests.dataprep.media_reference", str(req), str(tmp_path / "r")],
        check=True,
        cwd=ROOT,
    )
    refs = json.loads((tmp_path / "r").read_text())["indices"]
    compared = 0
    for (total, fps, opts), ref in zip(GRID, refs, strict=True):
        rule = parse_video_rule(_spec(opts))
        if isinstance(ref, str):  # the processor refuses: so does the rule
            with pytest.raises(Exception, match="frame"):
                rule.frame_indices(total, fps)
            continue
        got = rule.frame_indices(total, fps)
        assert got == ref, (total, fps, opts)
        assert len(got) == rule.frames(total, fps)  # as many as prep counted
        compared += 1
    assert compared > 80


@pytest.fixture(scope="module")
def video_gen(tmp_path_factory, tokenizer_path):
    root = tmp_path_factory.mktemp("videogen")
    return build_audio_generation(root, RULES["chunks"], tokenizer_path, video_rule=VIDEO_RULE)


def _by_id(gen) -> dict:
    from shards import open_generation, read_group

    m = open_generation(gen)
    out = {}
    for shard, g in m.group_index().values():
        out.update({s.meta["sample_id"]: s for s in read_group(m.path, shard, g)[0]})
    return m, out


def _level(unit: np.ndarray) -> int:
    """The painted frame index a tile's uint8 patches show (their mean grey level)."""
    levels = [frame_level(k) for k in range(8)]
    return int(np.argmin([abs(float(unit.mean()) - v) for v in levels]))


def test_each_video_reaches_the_encoder_as_its_sampled_frames_in_order(video_gen):
    m, samples = _by_id(video_gen)
    c = Collator.from_generation(m, pixels="uint8")
    rule = parse_video_rule(VIDEO_RULE)
    files = {name: (frames, fps) for name, frames, _, _, fps in VIDEOS}
    for sid, name in (("v0", "v5.mp4"), ("va", "v19.mp4")):
        b = c([samples[sid]])
        total, fps = files[name]
        want = rule.frame_indices(total, float(fps))
        cu = b["patch_cu_seqlens"].tolist()
        tiles = [b["patches"][a:z].numpy() for a, z in itertools.pairwise(cu)]
        assert [_level(t) for t in tiles] == [k % 8 for k in want]  # one 56-px tile a frame
        assert b["units_hw"].tolist() == [[4, 4]] * len(want)
        n_tokens = int((b["input_ids"] == c.image_token_id).sum())
        assert n_tokens == len(want) * 4 == samples[sid].meta["cost"]["video_tokens"] // 4


def test_the_prompt_is_preps_and_later_answers_are_still_learnt(video_gen, tokenizer_path):
    """Prep's own ``with_media_text`` puts the frame labels; the ids equal its text's
    encoding with each mark's run of tokens collapsed. In the sample whose video comes in the
    second turn, the labels moved the second answer: it must still be the target."""
    from tokenizers import Tokenizer

    from dataprep.measure import with_media_text

    m, samples = _by_id(video_gen)
    c = Collator.from_generation(m, pixels="uint8")
    rule = parse_video_rule(VIDEO_RULE)
    s = samples["turns"]
    b = c([s])
    text, _ = c._tmpl.render_spans([tuple(t) for t in s.meta["turns"]])
    cost = rule.cost(_header(video_gen, "v19.mp4"))
    prompt = with_media_text(text, {"video": [cost]}, {"video": rule})
    tok = c._tok
    enc = tok.encode(prompt, add_special_tokens=False).ids
    ids = b["input_ids"].tolist()
    collapsed = [i for n, i in enumerate(ids) if i != c.image_token_id or ids[n - 1] != i]
    marks = {tok.token_to_id("<image>"), tok.token_to_id("<video>")}
    assert collapsed == [c.image_token_id if i in marks else i for i in enc]
    learnt = Tokenizer.from_file(tokenizer_path).decode(
        [i for i, lab in zip(ids, b["labels"].tolist(), strict=True) if lab != -100]
    )
    assert "Blue, all of it." in learnt and "Grey frames." in learnt
    assert "Frame" not in learnt and "colour" not in learnt
    assert int(b["llm_lens"][0]) == s.meta["cost"]["llm_tokens"]
    # the image's tiles first (blue), then the frames' (grey): the order their tokens stand
    cu = b["patch_cu_seqlens"].tolist()
    rgb = [b["patches"][a:z].numpy().reshape(-1, 3).mean(0) for a, z in itertools.pairwise(cu)]
    n_img = s.meta["cost"]["vit_tokens"] // 16
    assert n_img >= 1 and len(rgb) == n_img + 4
    assert all(v[2] - v[0] > 100 for v in rgb[:n_img]), rgb  # (40, 120, 200)
    assert all(abs(v[2] - v[0]) < 8 for v in rgb[n_img:]), rgb


def _header(gen, name):
    from dataprep.video_header import probe_video_path

    return probe_video_path(gen.parent / "data" / name)


def test_a_frame_order_or_label_change_is_caught_by_preps_counts(video_gen, tokenizer_path):
    """A collator of other frames (8 a video instead of 4) makes other LLM and encoder
    counts than prep's: refused at the first video sample, naming it."""
    _, samples = _by_id(video_gen)
    c = Collator(tokenizer=tokenizer_path, vision_policy=VIDEO_POLICY, audio_rule=RULES["chunks"],
                 video_rule="internvl:num_frames=8,tile_size=56")  # fmt: skip
    with pytest.raises(ValueError, match="sample 'v0': this collator makes"):
        c([samples["v0"]])


@pytest.mark.parametrize(
    ("policy", "rule", "error"),
    [
        ("qwen2vl", "qwen2vl", "runs a video's frames as images"),
        (VIDEO_POLICY, "internvl:patch_size=28,tile_size=56", "14-px|28-px"),
        ("internvl:downsample_ratio=0.25,tile_size=56", VIDEO_RULE, "downsample_ratio"),
        # the other way round: the policy's grid the finer one
        ("internvl:patch_size=28,tile_size=56", VIDEO_RULE, "14-px"),
        (VIDEO_POLICY, "internvl:downsample_ratio=0.25,tile_size=56", "shuffled by 0.25"),
    ],
)
def test_a_video_rule_the_encoder_cannot_take_is_refused(tokenizer_path, policy, rule, error):
    with pytest.raises(ValueError, match=error):
        Collator(tokenizer=tokenizer_path, vision_policy=policy, video_rule=rule)


def test_videos_without_a_rule_are_refused_naming_the_sample(video_gen, tokenizer_path):
    _, samples = _by_id(video_gen)
    c = Collator(tokenizer=tokenizer_path, vision_policy=VIDEO_POLICY, audio_rule=RULES["chunks"])
    with pytest.raises(ValueError, match=r"sample 'v0' has 1 video\(s\)"):
        c([samples["v0"]])


@pytest.mark.parametrize("max_tiles", [1, 2, 4, 6])
@pytest.mark.parametrize(("w", "h"), [(56, 56), (96, 64), (200, 40), (40, 130), (57, 56)])
def test_a_frame_is_cut_into_the_tiles_prep_counted(max_tiles, w, h):
    """Each frame's tiles (``dynamic_preprocess``: a grid, and a thumbnail beside several)
    are as many as the rule counts (``InternVLVideoRule.tiles``, checked against
    GotOcr2's ``crop_to_patches`` in the media tests), each a 4 x 4 grid of patches."""
    from PIL import Image

    from dataprep.policies import parse_vision_policy
    from shards.read.image_units import image_units
    from shards.read.video_frames import VideoFrames

    rule = parse_video_rule(f"internvl:num_frames=2,max_tiles={max_tiles},tile_size=56")
    vf = VideoFrames(rule=rule, policy=parse_vision_policy(VIDEO_POLICY))
    units = image_units(vf.tiles, Image.new("RGB", (w, h)), raw=True)
    assert len(units) == rule.tiles(w, h)
    assert all(hw == (4, 4) and u.shape == (16, 588) for u, hw in units)


def test_the_frame_maker_is_a_frozen_keyword_config():
    from dataprep.policies import parse_vision_policy
    from shards.read.video_frames import VideoFrames

    rule, pol = parse_video_rule(VIDEO_RULE), parse_vision_policy(VIDEO_POLICY)
    with pytest.raises(TypeError):
        VideoFrames(rule, pol)  # the fields by name only
    vf = VideoFrames(rule=rule, policy=pol)
    with pytest.raises(AttributeError):
        vf.rule = rule
