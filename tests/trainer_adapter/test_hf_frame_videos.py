"""LLaVA-OneVision's video inputs (:mod:`trainer_adapter.hf.frame_videos`): the settings that
change a video's frames or tokens checked against the processor at, below and above the
rule's values; the rules and rows its model cannot take refused. (The frames and ids against
the real ``LlavaOnevisionProcessor``, and the balanced parity, are in
``test_hf_video_inputs.py``.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.dataprep.test_jinja_template import make_model_dir, processor_for

pytest.importorskip("transformers")

SPEC = "llava-onevision:num_frames=8"


def _video_processor(name: str, settings: dict, given: dict):
    """A user's video processor (with torchvision) named ``name``: ``settings`` with the test's
    ``given`` ones over them, and a scaling of its own (std 0.25) to see it taken."""
    scaling = {"image_mean": [0.5] * 3, "image_std": [0.25] * 3, "rescale_factor": 1 / 255,
               "do_rescale": True, "do_normalize": True}  # fmt: skip
    return type(name, (SimpleNamespace,), {})(**{**scaling, **settings, **given})


def _packer(tmp_path, tokenizer_path, spec=SPEC, **vp):
    from trainer_adapter.hf.inputs import HFPacker

    mdir = make_model_dir(tmp_path, "llava_onevision", tokenizer_path)
    proc = processor_for("llava_onevision", mdir)
    if vp:
        base = {"size": {"height": 384, "width": 384}, "num_frames": None}
        proc.video_processor = _video_processor("LlavaOnevisionVideoProcessor", base, vp)
    return HFPacker(family="llava_onevision", processor=proc, template=str(mdir), video_rule=spec)


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "llava-onevision:num_frames=0,fps=1",
            r"one \[videos, frames, C, H, W\] tensor.*num_frames",
        ),
        ("llava-onevision:num_frames=0", r"every video needs one frame count"),
    ],
)
def test_a_rule_without_one_frame_count_is_refused(spec, message, tmp_path, tokenizer_path):
    with pytest.raises(ValueError, match=message):
        _packer(tmp_path, tokenizer_path, spec)


@pytest.mark.parametrize(
    "spec, bad",
    [
        ("llava-onevision:num_frames=8,image_size=384,patch_size=14", None),  # 27 a side: 729
        (
            "llava-onevision:num_frames=8,image_size=364,patch_size=14",
            r"num_image_tokens is 729 \(27 patches a side\).*has 26",
        ),
        ("llava-onevision:num_frames=8,image_size=392,patch_size=14", r"has 28"),
    ],
)
def test_the_tile_is_checked_against_the_processors_tokens(spec, bad, tmp_path, tokenizer_path):
    """The rule's patches a side below, at and above the processor's ``num_image_tokens``."""
    from shards.read.prep_settings import SettingsMismatch

    if bad is None:
        assert _packer(tmp_path, tokenizer_path, spec)._video.token == "<video>"
        return
    with pytest.raises(SettingsMismatch, match=bad):
        _packer(tmp_path, tokenizer_path, spec)


@pytest.mark.parametrize(
    "setting, value, bad",
    [
        ("num_frames", 7, r"LlavaOnevisionVideoProcessor num_frames is 7.*has 8"),
        ("num_frames", 9, r"num_frames is 9.*has 8"),
        ("num_frames", 8, None),
        ("height", 383, r"height is 383.*has 384"),
        ("height", 385, r"height is 385.*has 384"),
        ("width", 383, r"width is 383.*has 384"),
        ("width", 384, None),
    ],
)
def test_the_video_processor_is_checked_against_the_rule(setting, value, bad, tmp_path,
                                                         tokenizer_path):  # fmt: skip
    """A user's video processor (with torchvision): its frame count and size at, below and
    above the rule's; where they agree its scaling is the one taken."""
    from shards.read.prep_settings import SettingsMismatch

    kw = ({"size": {"height": 384, "width": 384, setting: value}}
          if setting in ("height", "width") else {setting: value})  # fmt: skip
    if bad is None:
        assert _packer(tmp_path, tokenizer_path, **kw)._video.std == (0.25,) * 3
        return
    with pytest.raises(SettingsMismatch, match=bad):
        _packer(tmp_path, tokenizer_path, **kw)


def test_a_row_of_videos_with_other_frame_counts_is_refused():
    """The model takes a row's videos as one tensor: frames of one count stack, others are
    refused naming the counts."""
    from trainer_adapter.hf.video_inputs import pack_videos

    v = lambda n: {"frames": torch.zeros(n, 3, 4, 4)}  # noqa: E731
    row = pack_videos([{"videos": [v(2)]}, {"videos": [v(2)]}])
    assert row["pixel_values_videos"].shape == (2, 2, 3, 4, 4)
    with pytest.raises(ValueError, match=r"videos have \[2, 3\] frames.*one num_frames"):
        pack_videos([{"videos": [v(2)]}, {"videos": [v(3)]}])


def test_tokens_are_the_ones_prep_counts():
    """The text a video of n frames becomes equals prep's ``llm_tokens`` for its rule, over
    tiles with an odd and an even patch grid (pooling rounds up)."""
    from dataprep.media_rules import OneVisionVideoRule
    from dataprep.video_header import VideoHeader
    from trainer_adapter.hf.frame_videos import OneVisionVideo

    for size, patch in ((384, 14), (112, 14), (56, 14)):
        rule = OneVisionVideoRule(num_frames=5, image_size=size, patch_size=patch)
        video = OneVisionVideo(rule=rule, token="V", mean=(0.0,) * 3, std=(1.0,) * 3,
                               rescale_factor=1.0, do_rescale=False, do_normalize=False)  # fmt: skip
        header = VideoHeader(nbytes=1, width=64, height=48, frames=20, fps=10.0, duration=2.0,
                             codec="h264", container="mp4")  # fmt: skip
        written = video.text({"frames": torch.zeros(5, 3, size, size)}).count("V")
        assert written == rule.cost(header).llm_tokens


NEXT = "llava-next-video:num_frames=8"


def _next_packer(tmp_path, tokenizer_path, patch=14, **vp):
    from trainer_adapter.hf.inputs import HFPacker

    mdir = make_model_dir(tmp_path, "llava_next", tokenizer_path)
    proc = processor_for("llava_next", mdir)
    proc.patch_size = patch
    if vp:
        base = {"size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 336},
                "num_frames": None}  # fmt: skip
        proc.video_processor = _video_processor("LlavaNextVideoVideoProcessor", base, vp)
    return HFPacker(family="llava_next", processor=proc, template=str(mdir), video_rule=NEXT)


@pytest.mark.parametrize(
    "kw, bad",
    [
        ({"patch": 13}, r"LlavaNextProcessor patch_size is 13.*has 14"),
        ({"patch": 15}, r"patch_size is 15.*has 14"),
        ({"size": {"shortest_edge": 335}}, r"size\['shortest_edge'\] is 335.*has 336"),
        ({"size": {"shortest_edge": 337}}, r"size\['shortest_edge'\] is 337.*has 336"),
        ({"crop_size": {"height": 335, "width": 336}}, r"crop_size\['height'\] is 335"),
        ({"crop_size": {"height": 336, "width": 337}}, r"crop_size\['width'\] is 337"),
        ({"num_frames": 7}, r"num_frames is 7.*has 8"),
        ({"num_frames": 9}, r"num_frames is 9.*has 8"),
        ({"num_frames": 8}, None),
    ],
)
def test_next_video_settings_are_checked_against_the_rule(kw, bad, tmp_path, tokenizer_path):
    """LLaVA-NeXT-Video: the processor's patch size, its video processor's shortest side, crop
    and frame count at, below and above the rule's; the marker prep counted (``<video>``) is
    the token where the processor (LLaVA-NeXT's, images only) names none."""
    from shards.read.prep_settings import SettingsMismatch

    if bad is None:
        video = _next_packer(tmp_path, tokenizer_path, **kw)._video
        assert video.token == "<video>" and video.std == (0.25,) * 3
        return
    with pytest.raises(SettingsMismatch, match=bad):
        _next_packer(tmp_path, tokenizer_path, **kw)


@pytest.mark.parametrize("shape", [(48, 64), (64, 48), (50, 50)])
def test_next_frames_are_cropped_from_the_centre_of_the_resized_frame(shape):
    """Landscape, portrait and square frames: the shortest side resized to the tile, the
    other by ``int(tile * long / short)``, the crop taken ``int(excess / 2)`` in; marked
    pixels land where that arithmetic puts them."""
    from dataprep.media_rules import LlavaNextVideoRule
    from trainer_adapter.hf.frame_videos import NextVideo

    rule = LlavaNextVideoRule(num_frames=1, image_size=32, patch_size=8)
    video = NextVideo(rule=rule, token="V", mean=(0.0,) * 3, std=(1.0,) * 3, rescale_factor=1.0,
                      do_rescale=False, do_normalize=False)  # fmt: skip
    h, w = shape
    frame = torch.arange(h * w, dtype=torch.float32).reshape(1, 1, h, w).expand(1, 3, h, w)
    out = video.resized(frame.to(torch.uint8), (32, 32))
    assert out.shape == (1, 3, 32, 32)
    short, long = min(h, w), max(h, w)
    big = (int(32 * long / short), 32) if w <= h else (32, int(32 * long / short))
    full = torch.nn.functional.interpolate(frame.to(torch.uint8), size=list(big), mode="bicubic",
                                           align_corners=False, antialias=True)  # fmt: skip
    top, left = int((big[0] - 32) / 2.0), int((big[1] - 32) / 2.0)
    assert torch.equal(out, full[..., top : top + 32, left : left + 32])
    assert video.text({"frames": out}).count("V") == (32 // 8) ** 2 // 4


INTERNVL = "internvl:source=transformers,num_frames=8"


def _internvl_packer(tmp_path, tokenizer_path, spec=INTERNVL, seq=256, **vp):
    from trainer_adapter.hf.inputs import HFPacker

    mdir = make_model_dir(tmp_path, "internvl", tokenizer_path)
    proc = processor_for("internvl", mdir)
    proc.image_seq_length = seq
    if vp:
        base = {"size": {"height": 448, "width": 448}, "num_frames": None, "initial_shift": True}
        proc.video_processor = _video_processor("InternVLVideoProcessor", base, vp)
    return HFPacker(family="internvl", processor=proc, template=str(mdir), video_rule=spec)


@pytest.mark.parametrize(
    "kw, bad",
    [
        ({"seq": 255}, r"InternVLProcessor image_seq_length is 255.*has 256"),
        ({"seq": 257}, r"image_seq_length is 257.*has 256"),
        ({"size": {"height": 447, "width": 448}}, r"size\['height'\] is 447.*has 448"),
        ({"size": {"height": 448, "width": 449}}, r"size\['width'\] is 449.*has 448"),
        ({"num_frames": 7}, r"num_frames is 7.*has 8"),
        ({"num_frames": 9}, r"num_frames is 9.*has 8"),
        ({"initial_shift": False}, r"initial_shift is False.*has True"),
        ({"num_frames": 8}, None),
    ],
)
def test_internvl_settings_are_checked_against_the_rule(kw, bad, tmp_path, tokenizer_path):
    """InternVL: the processor's tokens a tile, its video processor's tile, frame count and
    shift, at, below and above the rule's; where they agree its scaling is the one taken."""
    from shards.read.prep_settings import SettingsMismatch

    if bad is None:
        video = _internvl_packer(tmp_path, tokenizer_path, **kw)._video
        assert video.std == (0.25,) * 3 and video.tile_tokens == 256
        return
    with pytest.raises(SettingsMismatch, match=bad):
        _internvl_packer(tmp_path, tokenizer_path, **kw)


def test_internvl_videos_need_the_transformers_source(tmp_path, tokenizer_path):
    """The model card's loader (PIL tiles of each frame) is not what the packer builds."""
    with pytest.raises(ValueError, match=r"measure them with source=transformers"):
        _internvl_packer(tmp_path, tokenizer_path, "internvl:source=internvl,num_frames=8")


def test_internvl_frames_stand_among_the_tiles_in_the_order_of_their_marks():
    """A video before an image, an image between two videos, marks past their items left as
    text: the blocks in the order the marks stand, each image's tiles whole."""
    from dataprep.media_rules import InternVLVideoRule
    from trainer_adapter.hf.frame_videos import InternVLVideo

    video = InternVLVideo(rule=InternVLVideoRule(source="transformers"), token="C", tile_tokens=2,
                          mean=(0.0,) * 3, std=(1.0,) * 3, rescale_factor=1.0,
                          do_rescale=False, do_normalize=False)  # fmt: skip
    block = lambda tag, n: torch.full((n, 1, 1, 1), float(tag))  # noqa: E731
    images = {"pixel_values": torch.cat([block(1, 3), block(2, 1)]), "num_patches": [3, 1]}
    videos = [{"frames": block(7, 2)}, {"frames": block(8, 4)}]
    out = video.among_images(images, videos, [True, False, True, False, True, False])
    assert out["pixel_values"].flatten().tolist() == [7.0] * 2 + [1.0] * 3 + [8.0] * 4 + [2.0]
    assert video.text({"frames": block(0, 2)}) == "Frame1: <img>CC</img>\nFrame2: <img>CC</img>"
