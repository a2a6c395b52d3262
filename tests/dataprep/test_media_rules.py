"""The audio and LLaVA-OneVision rules against the reference code, in process, at every limit.

Fast (no files to encode, no subprocess): the suite a mutation tool runs per mutant. The
references are transformers' own: ``WhisperFeatureExtractor`` (run on silence of each length),
``load_audio`` (soundfile and soxr, on a WAV of each length), Qwen2.5-Omni's
``chunk_and_pad_features`` and the audio output length of the processors;
``default_sample_indices_fn`` and ``LlavaOnevisionProcessor`` for the video rule. Lengths sit
at, below and above each limit: the 30-s and 300-s windows, a hop, a 2-s chunk, a frame count
equal to the frames asked for. The bugs named: a resampled length floored instead of rounded
up, a truncation at the wrong length, the last chunk dropped or padded, a window of the padded
encoder that follows the recording's length, a video's extra newline token forgotten, more
frames than the video has taken as the whole video.
"""

from __future__ import annotations

import numpy as np
import pytest

from dataprep.audio_header import AudioHeader
from dataprep.errors import SampleRejected
from dataprep.media_rules import (
    InternVLVideoRule,
    OneVisionVideoRule,
    WhisperAudioRule,
    audio_tokens,
)
from dataprep.media_rules.base import samples_at
from dataprep.video_header import VideoHeader

QWEN2AUDIO = WhisperAudioRule()
OMNI = WhisperAudioRule(chunk_length=300, n_window=100)

# lengths at 16 kHz around every limit: a hop (160), a 2-s chunk (200 frames = 32,000),
# the 30-s and 300-s windows
AT_16K = sorted(
    {1, 159, 160, 161, 319, 320, 321, 16_000, 31_999, 32_000, 32_001, 32_160, 479_999, 480_000}
    | {480_001, 480_160, 4_799_999, 4_800_000, 4_800_001, 5_000_000}
)


def _frames_reference(n: int, chunk_length: int) -> tuple[int, int]:
    """(mask frames, input feature frames) the feature extractor makes of ``n`` samples."""
    from transformers.models.whisper.feature_extraction_whisper import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=128, chunk_length=chunk_length)
    out = fe(
        [np.zeros(n, np.float32)],
        sampling_rate=16000,
        return_attention_mask=True,
        padding="max_length",
        return_tensors="np",
    )
    return int(out["attention_mask"].sum()), int(out["input_features"].shape[-1])


def _header(frames: int, rate: int = 16000, channels: int = 1) -> AudioHeader:
    return AudioHeader(nbytes=1, sample_rate=rate, frames=frames, channels=channels, format="WAV")


@pytest.mark.parametrize("n", [n for n in AT_16K if n <= 480_160])
def test_qwen2_audio_equals_the_feature_extractor(n):
    frames, window = _frames_reference(n, 30)
    cost = QWEN2AUDIO.cost(_header(n))
    assert QWEN2AUDIO.frames(_header(n)) == frames
    assert cost.llm_tokens == (((frames - 1) // 2 + 1) - 2) // 2 + 1  # the processor's formula
    assert cost.seq_lens == (window // 2,) == (1500,)  # the padded window, whatever the length


@pytest.mark.parametrize("n", [n for n in AT_16K if n >= 4_799_999])
def test_omni_equals_the_feature_extractor_at_its_300_second_window(n):
    frames, _ = _frames_reference(n, 300)
    assert OMNI.frames(_header(n)) == frames


@pytest.mark.parametrize("frames", [1, 2, 3, 199, 200, 201, 399, 400, 401, 1250, 29_999, 30_000])
def test_omni_chunks_equal_chunk_and_pad_features(frames):
    import torch
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import chunk_and_pad_features
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import (
        _get_feat_extract_output_lengths,
    )

    n = frames * 160  # a length whose mask is exactly ``frames``
    assert OMNI.frames(_header(n)) == frames
    _, chunks = chunk_and_pad_features(torch.zeros(128, frames), torch.tensor([frames]), 100)
    cost = OMNI.cost(_header(n))
    assert cost.seq_lens == tuple((c - 1) // 2 + 1 for c in chunks.tolist())
    assert cost.llm_tokens == int(_get_feat_extract_output_lengths(torch.tensor(frames)))
    assert audio_tokens(frames) == cost.llm_tokens


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 48000])
@pytest.mark.parametrize("n", [1, 2, 3, 441, 1000, 44_099, 44_100, 44_101, 123_457])
def test_a_resampled_length_equals_load_audio(tmp_path, rate, n):
    """transformers' ``load_audio`` (soundfile, soxr, then padded or cut to its length): the
    samples the features start from, for a WAV of ``n`` samples at ``rate``."""
    import soundfile
    from transformers.audio_utils import load_audio

    soundfile.write(tmp_path / "a.wav", np.zeros(n, np.float32), rate)
    got = load_audio(str(tmp_path / "a.wav"), sampling_rate=16000, backend="soundfile")
    assert QWEN2AUDIO.samples(_header(n, rate)) == len(got) == samples_at(_header(n, rate), 16000)


def test_channels_do_not_change_the_length():
    assert QWEN2AUDIO.cost(_header(48000, 48000, 6)) == QWEN2AUDIO.cost(_header(48000, 48000, 1))


@pytest.mark.parametrize(
    "bad",
    [
        {"sampling_rate": 0},
        {"hop_length": 0},
        {"chunk_length": 0},
        {"n_window": -1},
        {"n_window": 1.5},
    ],
)
def test_whisper_rule_refuses_values_at_and_below_its_limits(bad):
    with pytest.raises(ValueError):
        WhisperAudioRule(**bad)


def _video(frames: int, fps: float = 30.0) -> VideoHeader:
    return VideoHeader(
        nbytes=1,
        width=640,
        height=360,
        frames=frames,
        fps=fps,
        duration=frames / fps,
        codec="h264",
        container="mp4",
    )


def _onevision_reference(total: int, fps: float, num_frames, sample_fps) -> tuple[int, int] | None:
    from transformers.models.llava_onevision.processing_llava_onevision import (
        LlavaOnevisionProcessor,
    )
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    try:
        n = len(
            default_sample_indices_fn(
                VideoMetadata(total_num_frames=total, fps=fps),
                num_frames=num_frames,
                fps=sample_fps,
            )
        )
    except ValueError:
        return None
    proc = object.__new__(LlavaOnevisionProcessor)
    proc.num_image_tokens = 729
    return n, proc._get_num_multimodal_tokens(video_sizes=[(n, 384, 384)])["num_video_tokens"][0]


@pytest.mark.parametrize("total", [1, 7, 8, 9, 31, 32, 33, 45, 64, 65, 300])
@pytest.mark.parametrize(
    ("kw", "ref"),
    [
        ({}, (32, None)),  # the defaults: 32 frames
        ({"num_frames": 0, "fps": 4.0}, (None, 4.0)),  # total / rate * fps, not floored first
        ({"num_frames": 8}, (8, None)),
        ({"num_frames": 32}, (32, None)),
        ({"num_frames": 0, "fps": 1.0}, (None, 1.0)),
        ({"num_frames": 0, "fps": 0.25}, (None, 0.25)),
        ({"num_frames": 0}, (None, None)),
    ],
)
def test_onevision_equals_transformers(total, kw, ref):
    want = _onevision_reference(total, 30.0, *ref)
    rule = OneVisionVideoRule(**kw)
    if want is None:
        with pytest.raises(SampleRejected):
            rule.cost(_video(total))
        return
    cost = rule.cost(_video(total))
    assert (len(cost.seq_lens), cost.llm_tokens) == want
    assert set(cost.seq_lens) == {729}


@pytest.mark.parametrize(
    "bad",
    [
        {"fps": -1.0},
        {"num_frames": 8, "fps": 1.0},
        {"patch_size": 0},
        {"image_size": 10, "patch_size": 14},
    ],
)
def test_onevision_rule_refuses_values_at_and_below_its_limits(bad):
    with pytest.raises(ValueError):
        OneVisionVideoRule(**bad)


def test_onevision_rule_at_its_limits_and_an_odd_pooled_side():
    """Accepted at each limit (a 1-px patch, a frame of one patch, fps 0); a frame of 25 x 25
    patches pools to 13 x 13 (odd: the newline token then makes the count even, which an
    ``| 1`` in its place would not) against the processor's count; fps just below 0
    refused."""
    OneVisionVideoRule(patch_size=1, image_size=1)
    OneVisionVideoRule(patch_size=14, image_size=14, fps=0.0)
    with pytest.raises(ValueError, match="fps must be >= 0"):
        OneVisionVideoRule(num_frames=0, fps=-0.5)
    from transformers.models.llava_onevision.processing_llava_onevision import (
        LlavaOnevisionProcessor,
    )

    proc = object.__new__(LlavaOnevisionProcessor)
    proc.num_image_tokens = 625
    for n in (1, 3):
        rule = OneVisionVideoRule(num_frames=n, image_size=350)
        want = proc._get_num_multimodal_tokens(video_sizes=[(n, 350, 350)])["num_video_tokens"]
        assert rule.cost(_video(5)).llm_tokens == want[0]
        assert rule.cost(_video(5)).seq_lens == (625,) * n


def test_counts_are_whole_numbers():
    """Token counts and window lengths are ints, as the processors' (a float 1500.0 would
    pass an equality check and break the cost table's integer columns)."""
    for rule in (QWEN2AUDIO, OMNI):
        for n in (1, 16_000, 480_000, 481_000):
            cost = rule.cost(_header(n))
            assert type(cost.llm_tokens) is int
            assert all(type(s) is int for s in cost.seq_lens)
    assert type(audio_tokens(1001)) is int


def test_whisper_rule_takes_its_smallest_values_and_keywords_only():
    rule = WhisperAudioRule(sampling_rate=1, hop_length=1, chunk_length=1)
    assert rule.frames(_header(5, 1)) == 1  # 1 s kept of 5 samples at 1 Hz, one sample a hop
    with pytest.raises(TypeError):
        WhisperAudioRule(16000)  # a field's value given positionally is refused
    with pytest.raises(TypeError):
        OneVisionVideoRule(32)


def _video(frames: int, fps: float = 30.0, w: int = 640, h: int = 480) -> VideoHeader:
    return VideoHeader(
        nbytes=1,
        width=w,
        height=h,
        frames=frames,
        fps=fps,
        duration=frames / fps,
        codec="h264",
        container="mp4",
    )


def _arange_length(total: int, n: int, shift: bool) -> int:
    """``len(torch.arange(shift, total, total / n))``: InternVLVideoProcessor.sample_frames."""
    import torch

    step = total / n
    return len(torch.arange(step / 2 if shift else 0, total, step))


@pytest.mark.parametrize("shift", [True, False])
def test_internvl_transformers_frames_are_the_arange_length(shift):
    """Every count the processor may be asked for, 1 to 300 frames: the bug named, a frame
    count taken as the frames asked for where ``torch.arange`` yields one more (sampled from
    frame 0: 17 of 14)."""
    diffs = []
    for total in range(1, 301):
        for n in sorted({1, 2, 7, 14, 16, 32, total - 1, total} - {0}):
            rule = InternVLVideoRule(source="transformers", num_frames=n, initial_shift=shift)
            got = rule.frames(total, 30.0) if n <= total else "refused"
            want = _arange_length(total, n, shift) if n <= total else "refused"
            if got != want:
                diffs.append((total, n, got, want))
    assert not diffs, diffs[:5]
    assert InternVLVideoRule(source="transformers", num_frames=14, initial_shift=False).frames(
        17, 30.0
    ) == _arange_length(17, 14, False)


def test_internvl_transformers_limits():
    """More frames asked than the video has: refused, at and below accepted; fps leaving no
    frame: refused; num_frames 0 without fps: every frame."""
    rule = InternVLVideoRule(source="transformers", num_frames=16)
    assert rule.frames(16, 30.0) == 16 and rule.frames(17, 30.0) == 16
    with pytest.raises(SampleRejected, match="asked for 16"):
        rule.frames(15, 30.0)
    every = InternVLVideoRule(source="transformers", num_frames=0)
    assert every.frames(1, 30.0) == 1 and every.frames(301, 30.0) == 301
    per_second = InternVLVideoRule(source="transformers", num_frames=0, fps=1.0)
    assert per_second.frames(30, 30.0) == 1 and per_second.frames(90, 30.0) == 3
    with pytest.raises(SampleRejected, match="samples none"):
        per_second.frames(29, 30.0)  # int(29 / 30) frames: the processor divides by zero


def test_internvl_model_card_samples_every_segment_and_tiles_each_frame():
    """The model card's load_video takes one frame a segment however short the video (a
    one-frame video gives them all), each frame tiled as the image policy tiles an image of
    its size, a thumbnail beside a grid of several."""
    from dataprep.policies.internvl import InternVLPolicy

    rule = InternVLVideoRule(num_frames=8, max_tiles=6)
    for w, h in ((1920, 1080), (448, 448), (90, 1600), (449, 448), (1, 1)):
        want = InternVLPolicy(min_tiles=1, max_tiles=6).num_tiles(w, h)
        cost = rule.cost(_video(1, w=w, h=h))
        assert rule.tiles(w, h) == want
        assert cost.seq_lens == (1024,) * (8 * want) and cost.llm_tokens == 256 * 8 * want
    assert cost.text == "".join(f"Frame{i}: <img></img>\n" for i in range(1, 9))
    one = InternVLVideoRule(num_frames=3)
    assert one.tiles(1920, 1080) == 1 and one.cost(_video(300)).llm_tokens == 3 * 256
    hf = InternVLVideoRule(source="transformers", num_frames=2).cost(_video(5))
    assert hf.text == "Frame1: <img></img>\nFrame2: <img></img>"  # joined, no newline after
    small = InternVLVideoRule(num_frames=1, tile_size=224, patch_size=14)
    assert small.cost(_video(5)).seq_lens == (256,) and small.cost(_video(5)).llm_tokens == 64


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"source": "decord"}, "source must be one of"),
        ({"num_frames": -1}, "whole number"),
        ({"fps": -0.5}, "fps >= 0"),
        ({"num_frames": 0}, "num_frames >= 1 segments"),
        ({"fps": 1.0}, "no fps"),
        ({"max_tiles": 0}, "max_tiles >= 1"),
        ({"source": "transformers", "num_frames": 4, "fps": 1.0}, "not both"),
        ({"source": "transformers", "max_tiles": 2}, "one tile a frame"),
        ({"patch_size": 0}, "multiple of patch_size"),
        ({"tile_size": 450}, "multiple of patch_size"),
        ({"downsample_ratio": 0.0}, "downsample_ratio"),
        ({"downsample_ratio": 1.5}, "downsample_ratio"),
        ({"tile_size": 14, "downsample_ratio": 0.5}, "leaving a token"),
    ],
)
def test_internvl_video_refuses_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InternVLVideoRule(**kwargs)


def test_internvl_video_settings_at_their_limits():
    InternVLVideoRule(num_frames=1, max_tiles=1, downsample_ratio=1.0)
    InternVLVideoRule(source="transformers", num_frames=0, fps=0.0)
    InternVLVideoRule(tile_size=28, patch_size=14)  # 4 patches, one token a tile
    for rule in (InternVLVideoRule(), InternVLVideoRule(source="transformers", num_frames=0)):
        from dataprep.media_rules import parse_video_rule

        assert parse_video_rule(rule.spec()) == rule


def test_every_video_rule_belongs_to_a_family_and_every_named_rule_exists():
    """A family's ``video_rules`` (the one home of which model a video rule is the processor
    of) name rules that exist, and no video rule is left to no family (it would be refused
    beside every vision policy)."""
    from dataprep.families.registry import FAMILIES
    from dataprep.media_rules import VIDEO_RULES

    named = {r for f in FAMILIES.values() for r in f.video_rules}
    assert named == set(VIDEO_RULES)
    for f in FAMILIES.values():
        assert not f.video_rules or "video" in f.media_tokens, f.name


def _qwen3_reference_resize(n, h, w, min_px, max_px):
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    try:
        return smart_resize(
            n, h, w, temporal_factor=2, factor=32, min_pixels=min_px, max_pixels=max_px
        )
    except ValueError:
        return "refused"


def test_qwen3vl_video_resize_equals_the_processors():
    """Qwen3-VL's own ``smart_resize`` (the budget over the whole video) at its limits: one,
    two and three frames (fewer than two: refused), sides below the 32-px factor (scaled up
    first), aspect ratios at, below and above 200, budgets just met and just passed."""
    from dataprep.policies.glm4v import glm4v_video_resize

    sizes = [(1080, 1920), (31, 500), (32, 32), (1, 1), (20, 4000), (16, 3200), (10, 2001),
             (10, 2000), (10, 1999), (33, 6601), (480, 640), (2160, 3840)]  # fmt: skip
    budgets = [(4096, 786432), (131072, 786432), (4096, 25165824), (131072, 131072 * 2)]
    diffs = []
    for n in (1, 2, 3, 4, 5, 17, 768):
        for h, w in sizes:
            for lo, hi in budgets:
                want = _qwen3_reference_resize(n, h, w, lo, hi)
                try:
                    got = glm4v_video_resize(n, h, w, 32, 2, lo, hi)
                except SampleRejected:
                    got = "refused"
                if got != want:
                    diffs.append((n, h, w, lo, hi, got, want))
    assert not diffs, diffs[:5]


def test_qwen3vl_frames_equal_the_sampler():
    """``Qwen3VLVideoProcessor.sample_frames`` for 1 to 400 frames at four rates, by fps and
    by a fixed count: the frames and their indices (the timestamps' source)."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    from dataprep.media_rules import Qwen3VideoRule

    cls = Qwen3VLVideoProcessor
    proc = object.__new__(cls)
    for k in ("num_frames", "fps", "min_frames", "max_frames"):
        setattr(proc, k, getattr(cls, k))
    rules = [(Qwen3VideoRule(), None), (Qwen3VideoRule(fps=0, num_frames=9), 9)]
    diffs = []
    for total in range(1, 401):
        for rate in (1.0, 24000 / 1001, 30.0, 60.0):
            for rule, num in rules:
                meta = VideoMetadata(total_num_frames=total, fps=rate)
                want = cls.sample_frames(proc, meta, num_frames=num).tolist()
                n = rule.frames(total, rate)
                if rule.indices(total, n) != want:
                    diffs.append((total, rate, num, n, len(want)))
    assert not diffs, diffs[:5]


def test_qwen3vl_timestamps_are_the_processors():
    """The prompt text against ``Qwen3VLProcessor.replace_video_token``: an odd frame count
    (the last frame repeated), rates whose timestamps round at .x5, a video past 10 s (more
    digits)."""
    from types import SimpleNamespace

    import torch
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    from dataprep.media_rules import Qwen3VideoRule

    writer = object.__new__(Qwen3VLProcessor)
    writer.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    writer.vision_start_token, writer.vision_end_token = "<|vision_start|>", "<|vision_end|>"
    writer.video_token = "<|video_pad|>"
    for rule in (Qwen3VideoRule(), Qwen3VideoRule(fps=0, num_frames=7)):
        for total, rate in ((9, 30.0), (130, 25.0), (901, 30000 / 1001), (40, 8.0), (7, 2.0)):
            header = _video(total, rate, 320, 240)
            cost = rule.cost(header)
            n = rule.frames(total, rate)
            h, w = rule.frame_size(320, 240, n)
            grid = torch.tensor([[-(-n // 2), h // 16, w // 16]])
            meta = VideoMetadata(
                total_num_frames=total, fps=rate, frames_indices=rule.indices(total, n)
            )
            want = writer.replace_video_token({"video_grid_thw": grid, "video_metadata": [meta]}, 0)
            assert cost.text == want.replace("<|video_pad|>", ""), (total, rate)
            assert cost.llm_tokens == want.count("<|video_pad|>")
            assert cost.seq_lens == ((h // 16) * (w // 16),) * int(grid[0, 0])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"source": "decord"}, "source must be one of"),
        ({"fps": -1.0}, "one of them"),
        ({"fps": 0.0}, "one of them"),
        ({"num_frames": 8}, "one of them"),
        ({"source": "qwen-vl-utils", "fps": 0.0, "num_frames": 8}, "transformers processor"),
        ({"min_frames": 9, "max_frames": 8}, "min_frames <= max_frames"),
        ({"min_frames": 0, "max_frames": 0}, "max_frames >= 1"),
        ({"min_pixels": 0}, "0 < min_pixels"),
        ({"min_pixels": 4097, "max_pixels": 4096}, "min_pixels <= max_pixels"),
        ({"patch_size": 0}, "patch_size"),
        ({"merge_size": 0}, "merge_size"),
        ({"temporal_patch_size": 0}, "temporal_patch_size"),
    ],
)
def test_qwen3vl_video_refuses_bad_settings(kwargs, match):
    from dataprep.media_rules import Qwen3VideoRule

    with pytest.raises(ValueError, match=match):
        Qwen3VideoRule(**kwargs)


def test_qwen3vl_video_settings_at_their_limits():
    from dataprep.media_rules import Qwen3VideoRule, parse_video_rule

    Qwen3VideoRule(min_frames=8, max_frames=8, min_pixels=4096, max_pixels=4096)
    Qwen3VideoRule(source="qwen-vl-utils", max_pixels=0)  # qwen-vl-utils' own cap
    for rule in (Qwen3VideoRule(), Qwen3VideoRule(source="qwen-vl-utils", fps=0.5)):
        assert parse_video_rule(rule.spec()) == rule
    with pytest.raises(SampleRejected, match="at least 2"):
        Qwen3VideoRule().cost(_video(1))  # one frame: the processor raises


def test_media_text_stands_before_each_placeholder_and_a_whole_wrapper_goes():
    """``with_media_text``: each item's text in front of its own placeholder, in order; a
    rule's collapsed wrapper taken out only where it stands whole around the placeholder (the
    processor's pattern); a placeholder count that is not the items' refused. The bugs named:
    the second video's timestamps given to the first, a lone ``<|vision_start|>`` taken out,
    a missing placeholder passing silently."""
    from dataprep.measure import with_media_text
    from dataprep.media_rules import InternVLVideoRule, MediaCost, Qwen3VideoRule

    q3 = {"video": Qwen3VideoRule()}
    costs = {"video": [MediaCost((4,), 1, "<A>"), MediaCost((4,), 1, "<B>")]}
    s, e = "<|vision_start|>", "<|vision_end|>"
    text = f"x{s}<video>{e} y {s}<video> z"
    assert with_media_text(text, costs, q3) == f"x<A><video> y {s}<B><video> z"
    ivl = {"video": InternVLVideoRule()}
    assert with_media_text(text, costs, ivl) == f"x{s}<A><video>{e} y {s}<B><video> z"
    plain = {"video": InternVLVideoRule()}
    none = {"video": [MediaCost((4,), 1), MediaCost((4,), 1)]}
    assert with_media_text(text, none, plain) == text  # no text, nothing collapsed: as it was
    with pytest.raises(SampleRejected, match="1 video placeholder"):
        with_media_text("only <video> here", costs, q3)


def test_internvl_video_defaults_limits_and_grids_that_tell_the_formulas_apart():
    """The defaults (32 segments; a transformers rule sampled from the middle of each step:
    14 of 17 frames, not the 15 of sampling from frame 0), the settings accepted at their
    limits and refused just past them, frame rates and ratios where a wrong operator gives
    another count, and tile grids (3 x 1, 2 x 2) where the thumbnail's rule and a grid's size
    differ from a formula that merely agrees on 2 x 1; counts are whole numbers."""
    from dataprep.media_rules import parse_video_rule

    assert InternVLVideoRule().frames(5, 30.0) == 32
    assert InternVLVideoRule(source="transformers", num_frames=14).frames(17, 30.0) == 14
    two = InternVLVideoRule(source="transformers", num_frames=0, fps=2.0)
    assert two.frames(45, 30.0) == 3 and two.frames(300, 30.0) == 20  # int(45 / 30 * 2)
    assert InternVLVideoRule(source="transformers", num_frames=0, fps=0.5).frames(120, 30.0) == 2
    wide = InternVLVideoRule(num_frames=1, max_tiles=6)
    assert wide.tiles(1344, 448) == 3 + 1  # 3 x 1 and the thumbnail
    assert wide.tiles(896, 896) == 4 + 1  # 2 x 2 and the thumbnail
    assert wide.tiles(448, 448) == 1  # one tile: no thumbnail
    full = InternVLVideoRule(num_frames=1, downsample_ratio=1.0)
    assert full.tokens_per_tile == 1024 and full.cost(_video(3)).llm_tokens == 1024
    quarter = InternVLVideoRule(num_frames=1, downsample_ratio=0.25)
    assert quarter.tokens_per_tile == 64
    cost = InternVLVideoRule(num_frames=2).cost(_video(3))
    assert all(type(s) is int for s in cost.seq_lens) and type(cost.llm_tokens) is int
    InternVLVideoRule(patch_size=1, tile_size=2)  # the smallest patch: one token a tile
    with pytest.raises(ValueError, match="downsample_ratio"):
        InternVLVideoRule(downsample_ratio=-0.5)
    with pytest.raises(ValueError, match="one tile a frame"):
        InternVLVideoRule(source="transformers", num_frames=0, max_tiles=0)
    with pytest.raises(TypeError):
        InternVLVideoRule("internvl")  # keyword-only
    # a source given in a spec is a string of its own (not the interned literal)
    card = parse_video_rule("internvl:source=internvl,num_frames=2").cost(_video(3))
    assert card.text.endswith("</img>\n")
    hf = parse_video_rule("internvl:source=transformers,num_frames=2").cost(_video(3))
    assert hf.text.endswith("</img>") and "\n" in hf.text
    more = parse_video_rule("internvl:source=internvl,num_frames=5")
    assert more.frames(3, 30.0) == 5  # the card's segments repeat frames of a short video
    with pytest.raises(ValueError, match="num_frames >= 1 segments"):
        parse_video_rule("internvl:source=internvl,num_frames=0")
    with pytest.raises(ValueError, match="one tile a frame"):
        parse_video_rule("internvl:source=transformers,max_tiles=2")


def _smolvlm_reference(total: int, rate: float, num_frames: int, fps: float, seq: int = 81):
    """(indices, prompt text without its image tokens, image tokens) as SmolVLM's video
    processor samples (``sample_frames``; every frame with ``num_frames`` 0, its
    ``do_sample_frames=False``) and its processor writes (``replace_video_token``)."""
    from transformers.models.smolvlm.processing_smolvlm import SmolVLMProcessor
    from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor
    from transformers.video_utils import VideoMetadata

    meta = VideoMetadata(total_num_frames=total, fps=rate, duration=total / rate)
    if num_frames:
        proc = object.__new__(SmolVLMVideoProcessor)
        proc.num_frames, proc.fps = num_frames, fps
        idx = SmolVLMVideoProcessor.sample_frames(proc, meta).tolist()
    else:
        idx = list(range(total))
    meta.frames_indices = idx
    writer = object.__new__(SmolVLMProcessor)
    writer.image_seq_len, writer.image_token = seq, "<image>"
    writer.fake_image_token, writer.global_image_token = "<fake_token_around_image>", "<global-img>"
    text = writer.replace_video_token({"video_metadata": [meta]}, 0)
    return idx, text.replace("<image>", ""), text.count("<image>")


@pytest.mark.parametrize("num_frames, fps", [(64, 1.0), (8, 2.0), (0, 1.0), (64, 0.5)])
def test_smolvlm_video_equals_its_processors(num_frames, fps):
    """Frame counts and prompts against SmolVLM's own sampler and prompt writer, from one
    frame to 10 minutes at five rates: where the skip of a second at each end starts (a video
    longer than 2 s + frames / fps), where ``np.unique`` drops repeated indices (fewer frames
    than asked), the frame count in words and the minutes past 9 and 59 in the timestamps."""
    from dataprep.media_rules import SmolVLMVideoRule

    rule = SmolVLMVideoRule(num_frames=num_frames, fps=fps)
    totals = [1, 2, 3, 29, 30, 31, 59, 60, 61, 89, 90, 91, 1979, 1980, 1981, 2011, 18000]
    diffs = []
    for rate in (30.0, 24000 / 1001, 25.0, 7.5, 1.0):  # 1 fps: sampled faster than filmed
        for total in totals:
            if not num_frames and total > 2000:
                continue  # every frame of a long video: the same rule, a long prompt
            idx, text, images = _smolvlm_reference(total, rate, num_frames, fps)
            cost = rule.cost(_video(total, rate))
            got = (rule.indices(total, rate), cost.text, cost.llm_tokens, cost.seq_lens)
            if got != (idx, text, images, (729,) * len(idx)):
                diffs.append((total, rate, len(idx), len(got[0])))
    assert not diffs, diffs[:5]


def test_smolvlm_video_settings():
    from dataprep.media_rules import SmolVLMVideoRule, parse_video_rule

    small = SmolVLMVideoRule(tile=512, patch_size=16, tokens_per_tile=64)  # SmolVLM2-500M
    assert (
        small.cost(_video(90)).seq_lens[0] == 1024 and small.cost(_video(90)).llm_tokens == 3 * 64
    )
    SmolVLMVideoRule(skip_secs=0.0, patch_size=1, tile=1, tokens_per_tile=1)  # at the limits
    for bad, match in (
        ({"fps": 0.0}, "fps > 0"),
        ({"skip_secs": -1.0}, "skip_secs >= 0"),
        ({"patch_size": 0}, "patch_size"),
        ({"tile": 13, "patch_size": 14}, "patch_size <= tile"),
        ({"tokens_per_tile": 0}, "tokens_per_tile >= 1"),
    ):
        with pytest.raises(ValueError, match=match):
            SmolVLMVideoRule(**bad)
    assert parse_video_rule(SmolVLMVideoRule().spec()) == SmolVLMVideoRule()


_GLM_INDICES: dict = {}  # (total, rate, fps, max_duration): the sampler's indices, padded


def _glm4v_reference(total: int, rate: float, fps: float, max_duration: int, w: int, h: int):
    """(grid, prompt text without its image tokens, image tokens) as GLM-4.1V's video
    processor samples (``sample_frames``) and resizes (its ``smart_resize``) and its
    processor writes (``replace_video_token``); 'refused' where the processor raises."""
    from types import SimpleNamespace

    import torch
    from transformers.models.glm4v.processing_glm4v import Glm4vProcessor
    from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor, smart_resize
    from transformers.video_utils import VideoMetadata

    meta = VideoMetadata(total_num_frames=total, fps=rate, duration=total / rate)
    proc = object.__new__(Glm4vVideoProcessor)
    proc.fps, proc.max_duration = fps, max_duration
    idx = Glm4vVideoProcessor.sample_frames(proc, meta).tolist()
    _GLM_INDICES[(total, rate, fps, max_duration)] = idx
    try:
        rh, rw = smart_resize(len(idx), h, w, 2, 28, 112 * 112, 28 * 28 * 2 * 30000)
    except ValueError:
        return "refused"
    grid = [len(idx) // 2, rh // 14, rw // 14]
    meta.frames_indices = idx
    writer = object.__new__(Glm4vProcessor)
    writer.video_processor = SimpleNamespace(merge_size=2)
    writer.image_token = "<|image|>"
    thw = torch.tensor([grid])
    text = writer.replace_video_token({"video_grid_thw": thw, "video_metadata": [meta]}, 0)
    return grid, text.replace("<|image|>", ""), text.count("<|image|>")


@pytest.mark.parametrize("fps, max_duration", [(2.0, 300), (1.0, 300), (2.0, 20)])
def test_glm4v_video_equals_its_processors(fps, max_duration):
    """Frames, sizes and prompts against GLM-4.1V's own sampler, resize and prompt writer:
    one frame to 15 minutes at five rates (1 fps: indices that repeat and are dropped), on
    either side of ``max_duration`` (then spread by linspace, or every frame where that is
    fewer), an odd count (the last frame repeated), a 1:250 frame refused."""
    from dataprep.media_rules import Glm4vVideoRule

    rule = Glm4vVideoRule(fps=fps, max_duration=max_duration)
    diffs = []
    cases = [
        (total, rate, 640, 480)
        for rate in (30.0, 24000 / 1001, 25.0, 7.5, 1.0)
        for total in (1, 2, 3, 29, 30, 31, 59, 61, 599, 600, 601, 640, 9000, 27000)
    ]
    cases += [(t, 30.0, w, h) for t in (3, 601) for w, h in ((90, 1600), (1000, 4))]
    for total, rate, w, h in cases:
        want = _glm4v_reference(total, rate, fps, max_duration, w, h)
        try:
            cost = rule.cost(_video(total, rate, w, h))
        except SampleRejected:
            got = "refused"
        else:
            t, g = len(cost.seq_lens), cost.seq_lens[0] if cost.seq_lens else 0
            got = (t, g, cost.text, cost.llm_tokens)
            if want != "refused":
                grid, text, images = want
                want = (grid[0], grid[1] * grid[2], text, images)
        if got != want:
            diffs.append((total, rate, w, h, str(got)[:60], str(want)[:60]))
        if rule.indices(total, rate) != _GLM_INDICES[(total, rate, fps, max_duration)]:
            diffs.append((total, rate, "indices"))
    assert not diffs, diffs[:5]


def test_glm4v_video_defaults_are_the_processors_and_bind_where_they_should():
    """The rule's defaults against the processor's class defaults, where each decides: a
    video of exactly ``max_duration`` seconds, a budget that binds (600 full-HD frames), a
    frame too small for the pixel floor; counts are whole numbers; keyword-only."""
    from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor as P

    from dataprep.media_rules import Glm4vVideoRule

    rule = Glm4vVideoRule()
    assert (rule.fps, rule.max_duration) == (P.fps, P.max_duration)
    assert (rule.min_pixels, rule.max_pixels) == (P.size["shortest_edge"], P.size["longest_edge"])
    for total, w, h in ((9000, 1920, 1080), (8970, 1920, 1080), (2, 20, 20), (40, 64, 30)):
        grid, text, images = _glm4v_reference(total, 30.0, P.fps, P.max_duration, w, h)
        cost = rule.cost(_video(total, 30.0, w, h))
        assert (len(cost.seq_lens), cost.seq_lens[0], cost.text, cost.llm_tokens) == (
            grid[0],
            grid[1] * grid[2],
            text,
            images,
        ), (total, w, h)
        assert all(type(x) is int for x in (*cost.seq_lens, cost.llm_tokens))
    one = Glm4vVideoRule(merge_size=1).cost(_video(60, 30.0))  # no merge: every patch a token
    assert one.llm_tokens == len(one.seq_lens) * one.seq_lens[0]
    with pytest.raises(TypeError):
        Glm4vVideoRule(2.0)


def test_glm4v_video_settings():
    from dataprep.media_rules import Glm4vVideoRule, parse_video_rule

    Glm4vVideoRule(max_duration=1, min_pixels=1, max_pixels=1, patch_size=1, merge_size=1)
    for bad, match in (
        ({"fps": 0.0}, "fps > 0"),
        ({"fps": -2.0}, "fps > 0"),
        ({"max_duration": 0}, "max_duration >= 1"),
        ({"min_pixels": 0}, "1 <= min_pixels"),
        ({"min_pixels": 9, "max_pixels": 8}, "min_pixels <= max_pixels"),
        ({"temporal_patch_size": 0}, "temporal_patch_size"),
    ):
        with pytest.raises(ValueError, match=match):
            Glm4vVideoRule(**bad)
    assert parse_video_rule(Glm4vVideoRule().spec()) == Glm4vVideoRule()


def _from_source(
    module: str, names: tuple[str, ...], cls: str = "", extra: dict | None = None
) -> tuple[dict, dict]:
    """(functions, class constants) of a transformers module, taken from its source: the
    video processors of Gemma 4 and ERNIE 4.5-VL need torchvision to import (their annotations
    or imports name it), and torchvision has no CPU build for this torch on the index. The
    functions named (top-level, or methods of ``cls``, which then take any ``self``) are
    compiled from their own code, annotations dropped, beside the names in ``extra``; the
    constants are ``cls``'s."""
    import ast
    import contextlib
    import math
    from pathlib import Path

    import numpy as np
    import torch
    import transformers

    path = Path(transformers.__file__).parent / "models" / f"{module}.py"
    tree = ast.parse(path.read_text())
    space: dict = {"math": math, "np": np, "torch": torch, **(extra or {})}
    found, constants = [], {}
    for node in tree.body:
        in_class = isinstance(node, ast.ClassDef) and node.name == cls
        for item in node.body if in_class else [node]:
            if isinstance(item, ast.FunctionDef) and item.name in names:
                item.returns = None
                for arg in (*item.args.args, *item.args.kwonlyargs):
                    arg.annotation = None
                found.append(item)
            if in_class and isinstance(item, ast.Assign):
                value = compile(ast.Expression(item.value), str(path), "eval")
                # a literal or arithmetic on literals, evaluated with no names at all; another
                # module's value (OPENAI_CLIP_MEAN, a resampling mode) is left out
                with contextlib.suppress(NameError):
                    constants[item.targets[0].id] = eval(value, {"__builtins__": {}})
    exec(compile(ast.Module(found, []), str(path), "exec"), space)
    assert sorted(n.name for n in found) == sorted(names), (module, names)
    return {n: space[n] for n in names}, constants


def _gemma4_video_source() -> tuple:
    """(``get_aspect_ratio_preserving_size``, the class defaults) of Gemma 4's own video
    processor (:func:`_from_source`)."""
    fns, defaults = _from_source(
        "gemma4/video_processing_gemma4", ("get_aspect_ratio_preserving_size",),
        "Gemma4VideoProcessor",
    )  # fmt: skip
    return fns["get_aspect_ratio_preserving_size"], defaults


def _gemma4_reference(total, rate, w, h, num_frames, fps, soft=70, patch=16, k=3):
    """(indices, prompt text without its video tokens, video tokens) as Gemma 4's video
    processor samples (the base ``sample_frames``; every frame where it does not sample) and
    resizes (its ``get_aspect_ratio_preserving_size``) and ``Gemma4Processor`` writes
    (``replace_video_token``); 'refused' where the sampler raises."""
    from types import SimpleNamespace

    from transformers import Gemma4Processor
    from transformers.video_processing_utils import BaseVideoProcessor
    from transformers.video_utils import VideoMetadata

    resize, _ = _gemma4_video_source()
    meta = VideoMetadata(total_num_frames=total, fps=rate, duration=total / rate)
    if num_frames or fps:
        config = SimpleNamespace(num_frames=num_frames or None, fps=fps or None)
        try:
            idx = BaseVideoProcessor.sample_frames(config, meta).tolist()
        except ValueError:
            return "refused"
    else:
        idx = list(range(total))
    meta.frames_indices = idx
    th, tw = resize(height=h, width=w, patch_size=patch, max_patches=soft * k * k,
                    pooling_kernel_size=k)  # fmt: skip
    per_frame = (th // patch) * (tw // patch) // (k * k)
    writer = object.__new__(Gemma4Processor)
    writer.boi_token, writer.eoi_token, writer.video_token = "<|image>", "<image|>", "<|video|>"
    inputs = {"num_soft_tokens_per_video": [per_frame], "video_metadata": [meta]}
    text = writer.replace_video_token(inputs, 0)
    return idx, text.replace("<|video|>", ""), text.count("<|video|>")


@pytest.mark.parametrize("num_frames, fps", [(32, 0.0), (8, 0.0), (0, 1.0), (0, 0.0)])
def test_gemma4_video_equals_its_processors(num_frames, fps):
    """Frames, sizes and prompts against Gemma 4's own sampler, resize and prompt writer: one
    frame to ten hours at five rates (1 fps: sampled faster than filmed), a video of exactly
    the frames asked for and one fewer (refused, as the sampler raises), frames wide, tall,
    tiny and huge (a side that rounds to nothing), the minutes past 9, 59 and 99 in the
    timestamps."""
    from dataprep.media_rules import Gemma4VideoRule

    rule = Gemma4VideoRule(num_frames=num_frames, fps=fps)
    totals = [1, 2, 7, 8, 9, 31, 32, 33, 59, 60, 61, 1799, 1800, 18000, 1_080_000]
    sizes = [(640, 480), (1920, 1080), (90, 1600), (1000, 4), (4, 4), (7680, 4320), (48, 48)]
    diffs = []
    for rate in (30.0, 24000 / 1001, 25.0, 7.5, 1.0):
        for total in totals:
            if total > (2000 if not num_frames else 10**7) or (fps and total > 20000):
                continue  # every frame (or each second) of a long video: a long prompt
            for w, h in sizes if total in (8, 1800) else sizes[:1]:
                want = _gemma4_reference(total, rate, w, h, num_frames, fps)
                try:
                    cost = rule.cost(_video(total, rate, w, h))
                except SampleRejected as e:
                    assert e.reason == "video_too_short"
                    got = "refused"
                else:
                    idx = rule.indices(total, rate)
                    assert cost.seq_lens == (630,) * len(idx)
                    got = (idx, cost.text, cost.llm_tokens)
                if got != want:
                    diffs.append((total, rate, w, h, str(got)[:60], str(want)[:60]))
    assert not diffs, diffs[:5]


def test_gemma4_video_defaults_are_the_processors_and_its_budget_binds():
    """The rule's defaults are the video processor's class defaults (read from its source); a
    frame's budget is its own (70 soft tokens, not an image's 280), at every budget the
    processor accepts; counts are whole numbers; keyword-only."""
    from dataprep.media_rules import Gemma4VideoRule

    _, defaults = _gemma4_video_source()
    rule = Gemma4VideoRule()
    assert defaults["do_sample_frames"] is True
    assert (rule.num_frames, rule.max_soft_tokens) == (defaults["num_frames"], 70)
    assert (rule.patch_size, rule.pooling_kernel_size) == (
        defaults["patch_size"],
        defaults["pooling_kernel_size"],
    )
    assert defaults["max_soft_tokens"] == rule.max_soft_tokens
    for soft in (70, 140, 280, 560, 1120):
        r = Gemma4VideoRule(max_soft_tokens=soft)
        _, text, tokens = _gemma4_reference(60, 30.0, 1920, 1080, 32, 0.0, soft=soft)
        cost = r.cost(_video(60, 30.0, 1920, 1080))
        assert (cost.llm_tokens, cost.text, cost.seq_lens) == (tokens, text, (soft * 9,) * 32)
        assert tokens <= 32 * soft
        assert all(type(x) is int for x in (*cost.seq_lens, cost.llm_tokens))
    with pytest.raises(TypeError):
        Gemma4VideoRule(32)


def test_gemma4_video_settings():
    from dataprep.media_rules import Gemma4VideoRule, parse_video_rule

    Gemma4VideoRule(num_frames=0, fps=0.0, patch_size=1, pooling_kernel_size=1)  # the limits
    Gemma4VideoRule(num_frames=1)
    Gemma4VideoRule(num_frames=0, fps=0.001)
    for bad, match in (
        ({"num_frames": -1}, "whole number in 0"),
        ({"num_frames": 0, "fps": -1.0}, "fps >= 0"),
        ({"num_frames": 8, "fps": 1.0}, "not both set"),
        ({"max_soft_tokens": 71}, "one of"),
        ({"max_soft_tokens": 0}, "one of"),
        ({"patch_size": 0}, "patch_size and pooling_kernel_size >= 1"),
        ({"pooling_kernel_size": 0}, "patch_size and pooling_kernel_size >= 1"),
    ):
        with pytest.raises(ValueError, match=match):
            Gemma4VideoRule(**bad)
    for rule in (Gemma4VideoRule(), Gemma4VideoRule(num_frames=0, fps=0.5, max_soft_tokens=280)):
        assert parse_video_rule(rule.spec()) == rule
    # a video of one frame more, exactly, and one fewer than asked
    rule = Gemma4VideoRule(num_frames=8)
    assert rule.indices(9, 30.0) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert rule.indices(8, 30.0) == list(range(8))
    with pytest.raises(SampleRejected, match="asked for 8"):
        rule.indices(7, 30.0)


def _ernie_reference(total, rate, w, h, num_frames, fps):
    """(grid, video tokens) as ERNIE 4.5-VL's video processor samples (its ``sample_frames``),
    pads to an even count (its ``_prepare_input_videos``) and resizes (its ``smart_resize``),
    and ``Ernie4_5_VLMoeProcessor`` writes (``replace_video_token``); 'refused' where the
    processor raises."""
    from types import SimpleNamespace

    import torch
    from transformers.image_utils import ChannelDimension, infer_channel_dimension_format
    from transformers.models.ernie4_5_vl_moe.processing_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeProcessor,
    )
    from transformers.video_utils import VideoMetadata

    extra = {
        "ChannelDimension": ChannelDimension,
        "infer_channel_dimension_format": infer_channel_dimension_format,
    }
    fns, c = _from_source(
        "ernie4_5_vl_moe/video_processing_ernie4_5_vl_moe",
        ("sample_frames", "_prepare_input_videos"),
        "Ernie4_5_VLMoeVideoProcessor",
        extra,
    )
    resize = _from_source("ernie4_5_vl_moe/image_processing_ernie4_5_vl_moe", ("smart_resize",))
    meta = VideoMetadata(total_num_frames=total, fps=rate, duration=total / rate)
    config = SimpleNamespace(
        num_frames=None, min_frames=c["min_frames"], max_frames=c["max_frames"]
    )
    try:
        idx = fns["sample_frames"](config, meta, num_frames=num_frames or None, fps=fps or None)
        rh, rw = resize[0]["smart_resize"](
            h, w, 28, c["size"]["shortest_edge"], c["size"]["longest_edge"]
        )
    except ValueError:
        return "refused"
    frames = torch.zeros(len(idx), 3, 2, 2)
    (video,) = fns["_prepare_input_videos"](config, [frames], None, None, [meta], False)
    grid = [len(video), rh // 14, rw // 14]
    writer = object.__new__(Ernie4_5_VLMoeProcessor)
    writer.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    writer.video_token = "<|VIDEO_PLACEHOLDER|>"
    text = writer.replace_video_token({"video_grid_thw": torch.tensor([grid])}, 0)
    return grid, text.count(writer.video_token)


@pytest.mark.parametrize("num_frames, fps", [(0, 0.0), (16, 0.0), (180, 0.0), (0, 2.0), (0, 0.7)])
def test_ernie_video_equals_its_processors(num_frames, fps):
    """Frame counts, sizes and tokens against ERNIE 4.5-VL's own sampler, pad, resize and
    prompt writer: one frame to ten hours at five rates, on either side of 16 and 180 frames
    (clamped, or refused where ``num_frames`` is more than the video has), an odd count
    (the last frame repeated), a fractional count from ``fps`` (``torch.arange``'s length),
    frames wide, tall, tiny and huge, a 1:250 frame refused."""
    from dataprep.media_rules import ErnieVideoRule

    rule = ErnieVideoRule(num_frames=num_frames, fps=fps)
    totals = [1, 2, 15, 16, 17, 31, 179, 180, 181, 359, 361, 1801, 18000, 1_080_000]
    sizes = [(640, 480), (1920, 1080), (90, 1600), (1000, 4), (4, 4), (7680, 4320), (28, 28)]
    diffs = []
    for rate in (30.0, 24000 / 1001, 25.0, 7.5, 1.0):
        for total in totals:
            for w, h in sizes if total in (17, 181) else sizes[:1]:
                want = _ernie_reference(total, rate, w, h, num_frames, fps)
                try:
                    cost = rule.cost(_video(total, rate, w, h))
                except SampleRejected:
                    got = "refused"
                else:
                    t = len(cost.seq_lens)
                    assert t == rule.frames(total, rate) + rule.frames(total, rate) % 2
                    got = ([t, *cost.seq_lens[:1]], cost.llm_tokens)
                    if want != "refused":
                        grid, tokens = want
                        want = ([grid[0], grid[1] * grid[2]], tokens)
                if got != want:
                    diffs.append((total, rate, w, h, str(got)[:60], str(want)[:60]))
    assert not diffs, diffs[:5]


def test_ernie_video_defaults_are_the_processors():
    """The rule's defaults are the video processor's class defaults (read from its source):
    16..180 frames, a frame's pixel bounds, 14-px patches merged 2 x 2; counts are whole
    numbers; keyword-only."""
    from dataprep.media_rules import ErnieVideoRule

    _, c = _from_source(
        "ernie4_5_vl_moe/video_processing_ernie4_5_vl_moe", (), "Ernie4_5_VLMoeVideoProcessor"
    )
    rule = ErnieVideoRule()
    assert (rule.min_frames, rule.max_frames) == (c["min_frames"], c["max_frames"])
    assert (rule.min_pixels, rule.max_pixels) == (
        c["size"]["shortest_edge"],
        c["size"]["longest_edge"],
    )
    assert (rule.patch_size, rule.merge_size, c["temporal_patch_size"]) == (
        c["patch_size"],
        c["merge_size"],
        2,
    )
    cost = rule.cost(_video(9000, 30.0, 1920, 1080))  # 5 min: clamped to 180 frames
    assert len(cost.seq_lens) == 180 and all(
        type(x) is int for x in (*cost.seq_lens, cost.llm_tokens)
    )
    assert cost.text == ""
    for merge in (1, 3):  # every patch a token, pairs of frames merged; 3 x 3 blocks
        c = ErnieVideoRule(merge_size=merge).cost(_video(40, 30.0))
        assert c.llm_tokens == len(c.seq_lens) * c.seq_lens[0] // (merge * merge * 2)
    with pytest.raises(TypeError):
        ErnieVideoRule(16)


def test_ernie_video_settings():
    from dataprep.media_rules import ErnieVideoRule, parse_video_rule

    ErnieVideoRule(min_frames=1, max_frames=1, num_frames=1, min_pixels=1, max_pixels=1)
    ErnieVideoRule(patch_size=1, merge_size=1, fps=0.001)
    ErnieVideoRule(num_frames=16)  # at min_frames and at max_frames
    ErnieVideoRule(num_frames=180)
    for bad, match in (
        ({"num_frames": 8, "fps": 1.0}, "not both set"),
        ({"fps": -1.0}, "fps >= 0"),
        ({"num_frames": 15}, "outside min_frames"),
        ({"num_frames": 181}, "outside min_frames"),
        ({"min_frames": 0}, "1 <= min_frames <= max_frames"),
        ({"min_frames": 17, "max_frames": 16}, "1 <= min_frames <= max_frames"),
        ({"min_pixels": 0}, "1 <= min_pixels"),
        ({"min_pixels": 9, "max_pixels": 8}, "min_pixels <= max_pixels"),
        ({"patch_size": 0}, "patch_size and merge_size >= 1"),
        ({"merge_size": 0}, "patch_size and merge_size >= 1"),
    ):
        with pytest.raises(ValueError, match=match):
            ErnieVideoRule(**bad)
    for rule in (ErnieVideoRule(), ErnieVideoRule(num_frames=32, max_pixels=500_000)):
        assert parse_video_rule(rule.spec()) == rule
    rule = ErnieVideoRule(num_frames=16)  # a video of exactly the frames asked, one fewer
    assert rule.frames(16, 30.0) == 16
    with pytest.raises(SampleRejected, match="asked for 16"):
        rule.frames(15, 30.0)


def _gemma4_audio_reference(n: int) -> tuple[str, int] | str:
    """(prompt text without its audio tokens, audio tokens) for ``n`` samples at 16 kHz, as
    ``Gemma4AudioFeatureExtractor`` masks its frames (run on silence of that length) and
    ``Gemma4Processor.replace_audio_token`` writes them; 'refused' where the extractor
    raises (too short for a frame)."""
    from transformers import Gemma4Processor
    from transformers.models.gemma4.feature_extraction_gemma4 import (
        Gemma4AudioFeatureExtractor,
    )

    try:
        mask = Gemma4AudioFeatureExtractor()([np.zeros(n, np.float32)])["input_features_mask"][0]
    except ValueError:
        return "refused"
    writer = object.__new__(Gemma4Processor)
    writer.boa_token, writer.eoa_token, writer.audio_token = "<|audio>", "<audio|>", "<|audio|>"
    text = writer.replace_audio_token({"input_features_mask": [mask]}, 0)
    _GEMMA4_FRAMES[n] = int(mask.sum())
    return text.replace("<|audio|>", ""), text.count("<|audio|>")


_GEMMA4_FRAMES: dict[int, int] = {}  # samples at 16 kHz: the feature mask's real frames


GEMMA4_16K = [1, 127, 128, 160, 161, 320, 321, 480, 481, 482, 640, 641, 801, 16_000, 31_999]
GEMMA4_16K += [479_679, 479_680, 479_839, 479_840, 479_999, 480_000, 480_001, 960_000]


@pytest.mark.parametrize("n", GEMMA4_16K)
def test_gemma4_audio_equals_its_feature_extractor_and_processor(n):
    """Tokens and text against Gemma 4's own feature extractor and prompt writer, at 16 kHz
    around every limit: a hop (160 samples), a frame's window (321), each halving's odd and
    even counts, the 30-s truncation (480,000); a recording with no whole frame refused (the
    processor gives it no token, or its extractor raises)."""
    from dataprep.media_rules import Gemma4AudioRule

    want = _gemma4_audio_reference(n)
    rule = Gemma4AudioRule()
    try:
        cost = rule.cost(_header(n))
    except SampleRejected as e:
        assert e.reason == "audio_too_short"
        assert want == "refused" or want[1] == 0, want
        return
    assert (cost.text, cost.llm_tokens) == want
    assert cost.seq_lens == (cost.llm_tokens,)
    assert cost.llm_tokens <= 750  # 30 s at 40 ms a token
    assert type(cost.llm_tokens) is int and type(rule.frames(_header(n))) is int
    assert rule.frames(_header(n)) == _GEMMA4_FRAMES[n]  # the mask's frames, not just tokens


def test_gemma4_audio_defaults_resampling_and_settings():
    """The feature extractor's defaults (20-ms windows every 10 ms at 16 kHz, 30 s kept); a
    recording at another rate counted at 16 kHz; each setting at its limit taken, below it
    refused; the spec round-trips."""
    from transformers.models.gemma4.feature_extraction_gemma4 import (
        Gemma4AudioFeatureExtractor,
    )

    from dataprep.media_rules import Gemma4AudioRule, parse_audio_rule

    ref = Gemma4AudioFeatureExtractor()
    rule = Gemma4AudioRule()
    assert (rule.sampling_rate, rule.frame_length, rule.hop_length) == (
        ref.sampling_rate,
        ref.frame_length,
        ref.hop_length,
    )
    import inspect

    default = inspect.signature(Gemma4AudioFeatureExtractor.__call__).parameters["max_length"]
    assert rule.max_length == default.default
    # 2 s at 44.1 kHz: 32,000 samples at 16 kHz, 199 frames, 50 tokens
    assert rule.cost(_header(88_200, 44_100)) == rule.cost(_header(32_000))
    assert rule.cost(_header(32_000)).llm_tokens == _gemma4_audio_reference(32_000)[1] == 50
    Gemma4AudioRule(sampling_rate=1, frame_length=1, hop_length=1, max_length=1)
    for bad in ("sampling_rate", "frame_length", "hop_length", "max_length"):
        with pytest.raises(ValueError, match=">= 1"):
            Gemma4AudioRule(**{bad: 0})
    # a window longer than the recording: no frame (never fewer than none)
    assert Gemma4AudioRule(frame_length=1000).frames(_header(1)) == 0
    with pytest.raises(TypeError):
        Gemma4AudioRule(16000)
    short = Gemma4AudioRule(max_length=161)  # at the first whole frame: one token
    assert short.cost(_header(10**6)).llm_tokens == 1
    with pytest.raises(SampleRejected, match="no whole 20-ms frame"):
        Gemma4AudioRule(max_length=160).cost(_header(10**6))
    assert parse_audio_rule(Gemma4AudioRule(max_length=960_000).spec()) == Gemma4AudioRule(
        max_length=960_000
    )


def _llava_next_video_reference(total, rate, num_frames, fps, size, patch=14):
    """Video tokens as ``LlavaNextVideoProcessor.replace_video_token`` writes them for the
    frames transformers' default sampler keeps (every frame where it does not sample), each
    ``size`` square after the video processor's resize and center crop; 'refused' where the
    sampler raises."""
    from transformers.models.llava_next_video.processing_llava_next_video import (
        LlavaNextVideoProcessor,
    )
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    meta = VideoMetadata(total_num_frames=total, fps=rate)
    if num_frames or fps:
        try:
            n = len(default_sample_indices_fn(meta, num_frames=num_frames or None, fps=fps or None))
        except ValueError:
            return "refused"
    else:
        n = total
    writer = object.__new__(LlavaNextVideoProcessor)
    writer.patch_size, writer.video_token = patch, "<video>"
    frames = np.zeros((n, 3, size, size), np.uint8)
    return writer.replace_video_token({"pixel_values_videos": [frames]}, 0).count("<video>")


@pytest.mark.parametrize("num_frames, fps", [(8, 0.0), (32, 0.0), (0, 1.0), (0, 0.0)])
def test_llava_next_video_frames_equal_its_processor(num_frames, fps):
    """Frame counts against transformers' default sampler and the processor's prompt writer,
    one frame to an hour at five rates, a video of exactly the frames asked for and one fewer
    (refused, as the sampler raises); small frames (the count is per frame)."""
    from dataprep.media_rules import LlavaNextVideoRule

    rule = LlavaNextVideoRule(num_frames=num_frames, fps=fps, image_size=56)
    diffs = []
    for rate in (30.0, 24000 / 1001, 25.0, 7.5, 1.0):
        for total in (1, 7, 8, 9, 31, 32, 33, 299, 300, 301, 3600, 108_000):
            if not (num_frames or fps) and total > 400:
                continue
            want = _llava_next_video_reference(total, rate, num_frames, fps, 56)
            try:
                cost = rule.cost(_video(total, rate))
                got = cost.llm_tokens
                assert cost.seq_lens == (16,) * (got // 4)
            except SampleRejected as e:
                assert e.reason == "video_too_short"
                got = "refused"
            if got != want:
                diffs.append((total, rate, got, want))
    assert not diffs, diffs[:5]


def test_llava_next_video_frame_sizes_and_settings():
    """Tokens a frame at the released checkpoints' 336 px (576 patches, 144 tokens), at the
    class default 224 and at an odd side (floor of patches / 4, as the processor writes);
    any video size gives the same square frames; each setting at its limit taken, past it
    refused; the spec round-trips."""
    from dataprep.media_rules import LlavaNextVideoRule, parse_video_rule

    for size, patches, tokens in ((336, 576, 144), (224, 256, 64), (378, 729, 182)):
        rule = LlavaNextVideoRule(image_size=size)
        for w, h in ((640, 480), (90, 1600), (4, 4)):
            cost = rule.cost(_video(100, 30.0, w, h))
            assert cost.seq_lens == (patches,) * 8 and cost.llm_tokens == 8 * tokens
        assert _llava_next_video_reference(100, 30.0, 8, 0.0, size) == 8 * tokens
    LlavaNextVideoRule(patch_size=1, image_size=1, num_frames=0, fps=0.0)
    for bad, match in (
        ({"fps": -1.0, "num_frames": 0}, "fps >= 0"),
        ({"fps": 1.0}, "not both set"),
        ({"patch_size": 0}, "1 <= patch_size <= image_size"),
        ({"image_size": 13}, "1 <= patch_size <= image_size"),
    ):
        with pytest.raises(ValueError, match=match):
            LlavaNextVideoRule(**bad)
    for rule in (LlavaNextVideoRule(), LlavaNextVideoRule(num_frames=0, fps=0.5, image_size=224)):
        assert parse_video_rule(rule.spec()) == rule
    assert LlavaNextVideoRule().cost(_video(8, 30.0)).llm_tokens == 8 * 144
    with pytest.raises(TypeError):
        LlavaNextVideoRule(8)
    with pytest.raises(SampleRejected, match="asked for 8"):
        LlavaNextVideoRule().cost(_video(7, 30.0))


@pytest.mark.parametrize(
    "kw, bad",
    [
        ({"max_windows": 0}, "max_windows must be within 1..1000, got 0"),
        ({"max_windows": 1}, None),
        ({"max_windows": 1000}, None),
        ({"max_windows": 1001}, "max_windows must be within 1..1000, got 1001"),
        ({"n_window": 1}, "pads every window"),
    ],
)
def test_whisper_windows_rule_limits(kw, bad):
    """Audio Flamingo 3's windows rule at, below and above its bound; padded windows only."""
    from dataprep.media_rules import WhisperWindowsRule

    if bad is None:
        assert WhisperWindowsRule(**kw).max_windows == kw["max_windows"]
        # the default: AudioFlamingo3Processor's max_audio_len (600 s) in 30-s windows
        assert WhisperWindowsRule().max_windows == 20
        with pytest.raises(TypeError):
            WhisperWindowsRule(16000)  # a field given positionally is refused
        return
    with pytest.raises(ValueError, match=bad):
        WhisperWindowsRule(**kw)


@pytest.mark.parametrize(
    "samples, windows, frames",
    [
        (0, 1, 0),
        (16000, 1, 100),
        (480000, 1, 3000),
        (480160, 2, 3001),
        (960000, 2, 6000),
        (976000, 2, 6000),
        (960, 1, 6),
        (961, 1, 7),
    ],
)
def test_whisper_windows_rule_counts(samples, windows, frames):
    """Windows of 30 s, an empty recording one, cut at max_windows (2 here); every window's
    encoder sequence the whole padded window; tokens of all the frames together (a frame of a
    partial hop counted: 961 samples are 7 frames, whose tokens are one more than 6's)."""
    from dataprep.media_rules import parse_audio_rule

    rule = parse_audio_rule("audioflamingo3:max_windows=2")
    cost = rule.cost(_header(samples, 16000))
    assert cost.seq_lens == (1500,) * windows
    assert cost.llm_tokens == audio_tokens(frames)
    assert all(type(x) is int for x in (*cost.seq_lens, cost.llm_tokens))  # counts, not floats
    assert audio_tokens(7) == audio_tokens(6) + 1  # so the partial hop's frame shows
    assert parse_audio_rule(rule.spec()) == rule  # the recorded spec parses to the same rule
