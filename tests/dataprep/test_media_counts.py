"""Video and audio counts from headers equal the references' counts on real encoded files.

The files are encoded for real by ``tools/make_media.py`` (H.264, HEVC, MPEG-4, VP8, VP9, MJPEG,
MPEG-2 in MP4, MOV, Matroska, WebM, AVI, MPEG-TS; 0.5 s to 30 min, 1 to 60 fps, portrait,
extreme, 4K and rotated frames, variable frame rates; WAV, FLAC, MP3, Ogg Vorbis and Opus at 8
to 48 kHz, one to six channels, 0.1 s to 2 h). equishard reads headers only; the references
(:mod:`tests.dataprep.media_reference`, in a process of their own) decode every frame and every
sample and run qwen-vl-utils' and transformers' own code (SmolVLM2's and GLM-4.1V's samplers
and prompt writers run in this process on the decoded frame counts and rates). The bug each
catches: a frame count
taken from the wrong place (a Matroska header without one, a VFR stream's duration), a sampling
or pixel-budget formula that drifts from the processor's (rounding to the temporal patch,
``torch.arange``'s length, the per-frame cap), a resampled length off by one, a window split
that is not the model's.

The default run checks every eighth file and the longest ones (the 30-minute video, the
two-hour recording); ``-m slow`` checks all 200 + 200.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dataprep.audio_header import probe_audio_path
from dataprep.errors import SampleRejected
from dataprep.media_rules.ernie_video import ErnieVideoRule
from dataprep.media_rules.gemma4_video import Gemma4VideoRule
from dataprep.media_rules.glm4v_video import Glm4vVideoRule
from dataprep.media_rules.internvl_video import InternVLVideoRule
from dataprep.media_rules.onevision_video import OneVisionVideoRule
from dataprep.media_rules.qwen3_video import Qwen3VideoRule
from dataprep.media_rules.qwen_video import QwenVideoRule
from dataprep.media_rules.smolvlm_video import SmolVLMVideoRule
from dataprep.media_rules.whisper_audio import WhisperAudioRule
from dataprep.video_header import probe_video_path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import make_media  # noqa: E402

N = 200
SMALL = {
    "fps": 1.0,
    "max_frames": 32,
    "min_pixels": 4 * 28 * 28,
    "max_pixels": 256 * 28 * 28,
    "total_pixels": 20480 * 28 * 28,
}
# (our rule, the reference's arguments): qwen-vl-utils' element keys, transformers' options
VIDEO_RULES = {
    "qvu": (QwenVideoRule(), ("qwen_vl_utils", {"fps": 2.0})),
    "qvu_small": (QwenVideoRule(**SMALL), ("qwen_vl_utils", SMALL)),
    "tf": (QwenVideoRule(source="transformers"), ("transformers", {"fps": 2.0})),
    "tf_cap": (
        QwenVideoRule(source="transformers", cap_pixels_per_frame=True),
        ("transformers", {"fps": 2.0, "cap": True}),
    ),
    "tf_every": (QwenVideoRule(source="transformers", fps=0), ("transformers", {"fps": 0})),
    "tf_small": (
        QwenVideoRule(source="transformers", fps=0.5, max_frames=16, max_pixels=256 * 28 * 28),
        ("transformers", {"fps": 0.5, "max_frames": 16, "max_pixels": 256 * 28 * 28}),
    ),
}
# LLaVA-OneVision / LLaVA-Video: [frames, LLM tokens] against transformers' own functions
ONEVISION_RULES = {
    "ov32": (OneVisionVideoRule(), {"num_frames": 32}),
    "ov64": (OneVisionVideoRule(num_frames=64), {"num_frames": 64}),
    "ov_fps1": (OneVisionVideoRule(num_frames=0, fps=1.0), {"fps": 1.0}),
    "ov_every": (OneVisionVideoRule(num_frames=0), {}),
}
# InternVL: [frames, tiles a frame, prompt text] against its processor and its model cards'
INTERNVL_RULES = {
    "ivl32": (InternVLVideoRule(), {"source": "internvl", "num_frames": 32}),
    "ivl8x6": (
        InternVLVideoRule(num_frames=8, max_tiles=6),
        {"source": "internvl", "num_frames": 8, "max_tiles": 6},
    ),
    "ivl_every": (InternVLVideoRule(source="transformers", num_frames=0), {}),
    "ivl_16": (InternVLVideoRule(source="transformers", num_frames=16), {"num_frames": 16}),
    "ivl_fps1": (InternVLVideoRule(source="transformers", num_frames=0, fps=1.0), {"fps": 1.0}),
    "ivl_14_at_0": (  # sampled from frame 0: torch.arange's length may pass the frames asked
        InternVLVideoRule(source="transformers", num_frames=14, initial_shift=False),
        {"num_frames": 14, "initial_shift": False},
    ),
}
# Qwen3-VL: [grid t, h, w, prompt text with its timestamps] against its processor and
# qwen-vl-utils
QWEN3_RULES = {
    "q3": (Qwen3VideoRule(), {}),
    "q3_big": (
        Qwen3VideoRule(min_pixels=4096, max_pixels=25165824),
        {"min_pixels": 4096, "max_pixels": 25165824},
    ),
    "q3_cap": (
        Qwen3VideoRule(cap_pixels_per_frame=True, max_pixels=25165824),
        {"cap": True, "max_pixels": 25165824},
    ),
    "q3_n9": (Qwen3VideoRule(fps=0, num_frames=9), {"num_frames": 9}),
    "q3_qvu": (Qwen3VideoRule(source="qwen-vl-utils"), {"source": "qwen-vl-utils"}),
    "q3_qvu_small": (
        Qwen3VideoRule(source="qwen-vl-utils", fps=1.0, max_frames=32, max_pixels=256 * 32 * 32),
        {"source": "qwen-vl-utils", "fps": 1.0, "max_frames": 32, "max_pixels": 256 * 32 * 32},
    ),
}
# on the grid, each source's defaults: the settings' limits are the in-process tests' work
# (tests/dataprep/test_media_rules.py: Qwen3-VL's sampler over 1-400 frames, its resize)
GRID_QWEN3 = ("q3", "q3_qvu")
AUDIO_RULES = {
    "qwen2audio": (WhisperAudioRule(), (30, 0)),
    "omni": (WhisperAudioRule(chunk_length=300, n_window=100), (300, 100)),
}


def _chosen(n: int, slow: bool) -> list[int]:
    """make test's files: every 16th (each of the 11 video and 7 audio kinds at least once) and
    the two extremes (30 minutes, half a second); make test-slow takes them all."""
    return list(range(n)) if slow else [i for i in range(n) if i % 16 == 0 or i in (1, 2)]


def _media(tmp_path_factory, slow: bool):
    out = tmp_path_factory.mktemp("media")
    videos = [s for i, s in enumerate(make_media.draw_videos(N)) if i in _chosen(N, slow)]
    audios = [s for i, s in enumerate(make_media.draw_audios(N)) if i in _chosen(N, slow)]
    for spec in videos:
        make_media.encode_video(spec, out / spec.name)
    for spec in audios:
        make_media.encode_audio(spec, out / spec.name)
    request = {
        "videos": [
            {
                "path": str(out / s.name),
                "qwen_vl_utils": {
                    k: a for k, (_, (kind, a)) in VIDEO_RULES.items() if kind == "qwen_vl_utils"
                },
                "transformers": {
                    k: a for k, (_, (kind, a)) in VIDEO_RULES.items() if kind == "transformers"
                },
                "onevision": {k: a for k, (_, a) in ONEVISION_RULES.items()},
                "internvl": {k: a for k, (_, a) in INTERNVL_RULES.items()},
                "qwen3": {k: a for k, (_, a) in QWEN3_RULES.items()},
            }
            for s in videos
        ],
        "audios": [
            {"path": str(out / s.name), "settings": {k: a for k, (_, a) in AUDIO_RULES.items()}}
            for s in audios
        ],
    }
    (out / "request.json").write_text(json.dumps(request))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.dataprep.media_reference",
            out / "request.json",
            out / "result.json",
        ],
        cwd=ROOT,
        check=True,
    )
    return out, videos, audios, json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def some_media(tmp_path_factory):
    return _media(tmp_path_factory, slow=False)


def _onevision_diffs(header, ref: dict, label) -> list:
    """The OneVision rules' [frames, tokens] against the reference's, and each frame one
    sequence of 729 patches."""
    diffs = []
    for name, (rule, _) in ONEVISION_RULES.items():
        want = ref[name]
        try:
            cost = rule.cost(header)
            got = [len(cost.seq_lens), cost.llm_tokens]
            if set(cost.seq_lens) - {729}:
                got.append("not 729 a frame")
        except SampleRejected:
            got = "refused"
        if isinstance(want, str):
            want = "refused"
        if got != want:
            diffs.append((label, name, got, want))
    return diffs


def _internvl_diffs(header, ref: dict, label) -> list:
    """The InternVL rules' frames, tiles and prompt text against the reference's: each tile
    one sequence of 1024 patches and 256 LLM tokens."""
    diffs = []
    for name, (rule, _) in INTERNVL_RULES.items():
        want = ref[name]
        try:
            cost = rule.cost(header)
        except SampleRejected:
            got = "refused"
        else:
            n, tiles = (
                rule.frames(header.frames, header.fps),
                rule.tiles(header.width, header.height),
            )
            got = [n, tiles, cost.text]
            if cost.seq_lens != (1024,) * (n * tiles) or cost.llm_tokens != 256 * n * tiles:
                got.append(("cost", len(cost.seq_lens), cost.llm_tokens))
        if isinstance(want, str):
            want = "refused"
        if got != want:
            diffs.append((label, name, str(got)[:80], str(want)[:80]))
    return diffs


def _qwen3_diffs(header, ref: dict, label, names=tuple(QWEN3_RULES)) -> list:
    """The Qwen3-VL rules' grid and prompt text (timestamps) against the reference's."""
    diffs = []
    for name in names:
        rule = QWEN3_RULES[name][0]
        want = ref[name]
        try:
            cost = rule.cost(header)
        except SampleRejected:
            got = "refused"
        else:
            n = rule.frames(header.frames, header.fps)
            h, w = rule.frame_size(header.width, header.height, n)
            got = [len(cost.seq_lens), h // 16, w // 16, cost.text]
            per_t = (h // 16) * (w // 16)
            if set(cost.seq_lens) != {per_t} or cost.llm_tokens != len(cost.seq_lens) * per_t // 4:
                got.append(("cost", cost.seq_lens[:1], cost.llm_tokens))
        if isinstance(want, str):
            want = "refused"
        if got != want:
            diffs.append((label, name, str(got)[:100], str(want)[:100]))
    return diffs


def _processor_diffs(header, truth: dict, label) -> list:
    """SmolVLM2's, GLM-4.1V's, Gemma 4's and ERNIE 4.5-VL's default rules against their
    processors' own samplers, resize and prompt writers (``tests/dataprep/test_media_rules.py``'s
    references, in process), run on the decoded truth: the frame count, rate and size the
    processors would be given."""
    from tests.dataprep.test_media_rules import (
        _ernie_reference,
        _gemma4_reference,
        _glm4v_reference,
        _smolvlm_reference,
    )

    if not truth["fps"]:
        return []
    smol, glm = SmolVLMVideoRule(), Glm4vVideoRule()
    diffs = []
    idx, text, images = _smolvlm_reference(truth["frames"], truth["fps"], smol.num_frames, smol.fps)
    cost = smol.cost(header)
    got = (smol.indices(header.frames, header.fps), cost.text, cost.llm_tokens)
    if got != (idx, text, images):
        diffs.append((label, "smolvlm", str(got)[:80], str((idx, text, images))[:80]))
    want = _glm4v_reference(
        truth["frames"], truth["fps"], glm.fps, glm.max_duration, truth["width"], truth["height"]
    )
    try:
        cost = glm.cost(header)
    except SampleRejected:
        got = "refused"
    else:
        got = (len(cost.seq_lens), cost.seq_lens[0], cost.text, cost.llm_tokens)
        if want != "refused":
            grid, text, images = want
            want = (grid[0], grid[1] * grid[2], text, images)
    if got != want:
        diffs.append((label, "glm4v", str(got)[:80], str(want)[:80]))
    frames, rate, w, h = truth["frames"], truth["fps"], truth["width"], truth["height"]
    gemma, ernie = Gemma4VideoRule(), ErnieVideoRule()
    want = _gemma4_reference(frames, rate, w, h, gemma.num_frames, gemma.fps)
    try:
        cost = gemma.cost(header)
    except SampleRejected:
        got = "refused"
    else:
        got = (gemma.indices(header.frames, header.fps), cost.text, cost.llm_tokens)
    if got != want:
        diffs.append((label, "gemma4", str(got)[:80], str(want)[:80]))
    want = _ernie_reference(frames, rate, w, h, ernie.num_frames, ernie.fps)
    try:
        cost = ernie.cost(header)
    except SampleRejected:
        got = "refused"
    else:
        got = ([len(cost.seq_lens), cost.seq_lens[0]], cost.llm_tokens)
        if want != "refused":
            (t, gh, gw), tokens = want
            want = ([t, gh * gw], tokens)
    if got != want:
        diffs.append((label, "ernie45vl", str(got)[:80], str(want)[:80]))
    return diffs


def _video_diffs(out, videos, result):
    diffs = []
    for spec in videos:
        path = str(out / spec.name)
        ref = result["videos"][path]
        header = probe_video_path(path)
        truth = ref["truth"]
        if (header.frames, header.width, header.height) != (
            truth["frames"],
            truth["width"],
            truth["height"],
        ):
            diffs.append((spec.name, "header", header, truth))
            continue
        diffs += _onevision_diffs(header, ref, spec.name)
        diffs += _internvl_diffs(header, ref, spec.name)
        diffs += _qwen3_diffs(header, ref, spec.name)
        diffs += _processor_diffs(header, truth, spec.name)
        for name, (rule, _) in VIDEO_RULES.items():
            want = ref[name]
            try:
                cost = rule.cost(header)
            except SampleRejected as exc:
                if not (isinstance(want, str) and want.startswith("refused")):
                    diffs.append((spec.name, name, f"we refuse: {exc}", want))
                continue
            if isinstance(want, str):
                diffs.append((spec.name, name, cost.llm_tokens, want))
                continue
            t, h, w = want
            if cost.seq_lens != (h * w,) * t or cost.llm_tokens != t * h * w // 4:
                diffs.append(
                    (
                        spec.name,
                        name,
                        (len(cost.seq_lens), cost.seq_lens[:1], cost.llm_tokens),
                        want,
                    )
                )
    return diffs


def _audio_diffs(out, audios, result):
    diffs = []
    for spec in audios:
        path = str(out / spec.name)
        header = probe_audio_path(path)
        for name, (rule, _) in AUDIO_RULES.items():
            ref = result["audios"][path][name]
            got = {
                "samples": rule.samples(header),
                "frames": rule.frames(header),
                "tokens": rule.cost(header).llm_tokens,
                "windows": list(rule.cost(header).seq_lens),
            }
            if got != ref:
                diffs.append((spec.name, name, got, ref))
    return diffs


def test_video_counts_equal_the_references(some_media):
    out, videos, _, result = some_media
    kinds = len(make_media.VIDEO_KINDS)
    assert len(videos) == 15 and {i % kinds for i in _chosen(N, False)} == set(range(kinds))
    diffs = _video_diffs(out, videos, result)
    assert not diffs, diffs[:5]


def test_audio_counts_equal_the_references(some_media):
    out, _, audios, result = some_media
    kinds = len(make_media.AUDIO_KINDS)
    assert len(audios) == 15 and {i % kinds for i in _chosen(N, False)} == set(range(kinds))
    diffs = _audio_diffs(out, audios, result)
    assert not diffs, diffs[:5]


def _references(kind: str) -> dict:
    return {k: a for k, (_, (source, a)) in VIDEO_RULES.items() if source == kind}


def test_frame_sampling_equals_the_references_on_a_grid(tmp_path):
    """Every frame count from 1 to 300 at eight frame rates and three frame sizes, against
    the references run on the same metadata: catches a rounding of the frame count
    (``torch.arange(0, total, total / n)`` yields n + 1 frames for 17 and 14), a minimum
    or maximum not taken as the processor takes it, a pixel budget off at one frame count."""
    from dataprep.video_header import VideoHeader

    grid = [
        (frames, fps, w, h)
        for frames in range(1, 301)
        for fps in (0.5, 1.0, 2.5, 24000 / 1001, 25.0, 30000 / 1001, 30.0, 60.0)
        for w, h in ((1920, 1080), (90, 1600), (320, 240))
        if (frames + int(fps * 7) + w) % 3 == 0  # a third of the grid, every count and rate
    ]
    request = {
        "synthetic": [
            {
                "truth": {"frames": n, "fps": fps, "width": w, "height": h},
                "qwen_vl_utils": _references("qwen_vl_utils"),
                "transformers": _references("transformers"),
                "onevision": {k: a for k, (_, a) in ONEVISION_RULES.items()},
                "internvl": {k: a for k, (_, a) in INTERNVL_RULES.items()},
                "qwen3": {k: QWEN3_RULES[k][1] for k in GRID_QWEN3},
            }
            for n, fps, w, h in grid
        ]
    }
    (tmp_path / "request.json").write_text(json.dumps(request))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.dataprep.media_reference",
            tmp_path / "request.json",
            tmp_path / "result.json",
        ],
        cwd=ROOT,
        check=True,
    )
    result = json.loads((tmp_path / "result.json").read_text())["synthetic"]
    diffs = []
    for (n, fps, w, h), ref in zip(grid, result, strict=True):
        header = VideoHeader(
            nbytes=1,
            width=w,
            height=h,
            frames=n,
            fps=fps,
            duration=n / fps,
            codec="h264",
            container="mp4",
        )
        diffs += _onevision_diffs(header, ref, (n, fps, w, h))
        diffs += _internvl_diffs(header, ref, (n, fps, w, h))
        diffs += _qwen3_diffs(header, ref, (n, fps, w, h), GRID_QWEN3)
        for name, (rule, _) in VIDEO_RULES.items():
            want = ref[name]
            try:
                cost = rule.cost(header)
                got = [len(cost.seq_lens), cost.llm_tokens]
            except SampleRejected:
                got = "refused"
            want = (
                "refused" if isinstance(want, str) else [want[0], want[0] * want[1] * want[2] // 4]
            )
            if got != want:
                diffs.append(((n, fps, w, h), name, got, want))
    assert len(grid) > 2000
    assert not diffs, diffs[:5]


@pytest.mark.slow
def test_all_400_files_equal_the_references(tmp_path_factory):
    out, videos, audios, result = _media(tmp_path_factory, slow=True)
    assert len(videos) == len(audios) == N
    diffs = _video_diffs(out, videos, result) + _audio_diffs(out, audios, result)
    assert not diffs, diffs[:5]
