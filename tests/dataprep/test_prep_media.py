"""``prep --video-rule`` / ``--audio-rule``: videos and recordings measured into their phases.

The bugs named: a video counted as text (34 tokens), its tokens left out of the LLM's count or
counted twice, the template's video marker not where the model's template writes it, a
LLaVA-Video ``<image>`` beside a video counted as an image, a video path outside the image
root read, a missing or broken file silently dropped, the table's metadata not saying which
phases it has and how each was measured. The reference for the LLM count is transformers'
own rendering of the model's chat template (``apply_chat_template``) and its real tokenizer,
plus the rule's count (itself checked against the processors in ``test_media_counts``).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile

from dataprep.audio_header import probe_audio_path
from dataprep.media_rules import parse_audio_rule, parse_video_rule
from dataprep.video_header import probe_video_path
from equishard.contracts.cost_table import read_cost_table, table_metadata
from tests.dataprep.helpers import run, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import make_media  # noqa: E402


def _video(path: Path, frames: int, w: int = 320, h: int = 240, rate: int = 10) -> Path:
    make_media.encode_video(
        make_media.VideoSpec(
            name=path.name,
            codec="libx264",
            pix_fmt="yuv420p",
            width=w,
            height=h,
            fps=f"{rate}/1",
            frames=frames,
        ),
        path,
    )
    return path


def _wav(path: Path, seconds: float, rate: int = 22050) -> Path:
    soundfile.write(path, np.zeros(int(seconds * rate), np.float32), rate)
    return path


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory, tokenizer_path) -> Path:
    """Qwen2-VL's chat template and a tokenizer with its special tokens."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train_hf_vlm as ex
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return ex.model_dir("qwen2vl", tokenizer_path, tmp_path_factory.mktemp("qwen") / "model")


def _conv(question: str, answer: str = "It is a clip.") -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


VIDEO = object()  # a video's place in a user turn (:func:`_rendered`)
IMAGE = object()  # an image's
AUDIO = object()  # a recording's


def _prep(tmp_path: Path, model: Path, records: list[dict], policy: str, spec: str) -> list[dict]:
    """Prep of ``records`` with the model's tokenizer and template and a video rule: its rows
    (no errors)."""
    data = write_jsonl(tmp_path / "d.jsonl", records)
    _res, rows, errors = run(
        tmp_path,
        [data],
        str(model / "tokenizer.json"),
        template=str(model),
        vision_policy=policy,
        video_rule=spec,
    )
    assert not errors
    return rows


def _rendered(model: Path, parts: list, template: str | None = None):
    """(tokenizer, text): transformers' rendering of the model's chat template (or
    ``template``) over a user turn of ``parts`` (:data:`VIDEO`, :data:`IMAGE`, :data:`AUDIO` or text) and
    the reply."""
    from transformers import PreTrainedTokenizerFast

    config = json.loads((model / "tokenizer_config.json").read_text())
    named = {k: config[k] for k in ("bos_token", "eos_token", "pad_token") if k in config}
    tok = PreTrainedTokenizerFast(tokenizer_file=str(model / "tokenizer.json"), **named)
    if template is None:
        template = config["chat_template"]
    kinds = {id(VIDEO): {"type": "video"}, id(IMAGE): {"type": "image"}}
    kinds[id(AUDIO)] = {"type": "audio"}
    content = [kinds.get(id(p)) or {"type": "text", "text": p} for p in parts]
    messages = [
        {"role": "user", "content": content},
        {"role": "assistant", "content": [{"type": "text", "text": "It is a clip."}]},
    ]
    return tok, tok.apply_chat_template(messages, chat_template=template, tokenize=False)


def _counted(tok, text: str, token: str) -> tuple[int, int]:
    """(tokens of ``text``, how many of them are ``token``), by the tokenizer."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return len(ids), ids.count(tok.convert_tokens_to_ids(token))


def _metadata(header, indices):
    """transformers' ``VideoMetadata`` of a probed video and the frames sampled from it."""
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(
        total_num_frames=header.frames,
        fps=header.fps,
        duration=header.frames / header.fps,
        frames_indices=indices,
    )


def test_a_video_is_measured_exactly_as_the_model_sees_it(tmp_path, qwen_model):
    from transformers import PreTrainedTokenizerFast

    clips = [_video(tmp_path / "a.mp4", 40), _video(tmp_path / "b.mp4", 7, 180, 640, 5)]
    records = [
        {"id": "v1", "video": "a.mp4", "conversations": _conv("<video>\nWhat happens?")},
        # LLaVA-Video's convention: <image> marks the video named by the field
        {"id": "v2", "video": "b.mp4", "conversations": _conv("<image>\nDescribe it.")},
        {"id": "t", "conversations": _conv("Just text.")},
    ]
    data = write_jsonl(tmp_path / "d.jsonl", records)
    spec = "qwen2vl:fps=2,max_frames=16"
    res, rows, errors = run(
        tmp_path,
        [data],
        str(qwen_model / "tokenizer.json"),
        template=str(qwen_model),
        vision_policy="qwen2vl",
        video_rule=spec,
    )
    assert not errors and res.n_written == 3
    rule = parse_video_rule(spec)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(qwen_model / "tokenizer.json"))
    template = json.loads((qwen_model / "tokenizer_config.json").read_text())["chat_template"]
    by_id = {r["sample_id"]: r for r in rows}
    for sid, clip, question in (
        ("v1", clips[0], "What happens?"),
        ("v2", clips[1], "Describe it."),
    ):
        cost = rule.cost(probe_video_path(clip))
        messages = [
            {
                "role": "user",
                "content": [{"type": "video"}, {"type": "text", "text": "\n" + question}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "It is a clip."}]},
        ]
        text = tok.apply_chat_template(messages, chat_template=template, tokenize=False)
        assert text.count("<|video_pad|>") == 1
        n_text = len(tok(text, add_special_tokens=False)["input_ids"]) - 1  # the pad: expanded
        row = by_id[sid]
        assert row["num_videos"] == 1 and row["video_seq_lens"] == list(cost.seq_lens)
        assert row["video_tokens"] == cost.tokens and row["num_images"] == 0
        assert row["text_tokens"] == n_text
        assert row["llm_tokens"] == n_text + cost.llm_tokens
        assert row["modality"] == "video"
    assert by_id["t"]["num_videos"] == 0 and by_id["t"]["video_seq_lens"] == []
    meta = table_metadata(tmp_path / "out" / "cost.parquet")
    assert meta["phases"] == ["vision", "video", "llm"]
    assert meta["video_rule"]["spec"] == rule.spec() and "audio_rule" not in meta
    read_cost_table(tmp_path / "out" / "cost.parquet")  # validates every phase's columns


@pytest.mark.parametrize(
    "spec", ["internvl:source=transformers,num_frames=8", "internvl:num_frames=6,max_tiles=4"]
)
def test_an_internvl_video_counts_its_frame_labels(tmp_path, tokenizer_path, spec):
    """InternVL writes ``Frame{i}: <img>...</img>`` a frame: the labels are text the tokenizer
    counts, the context tokens the rule's. Reference: the model's chat template, then the
    processor's own ``replace_video_token`` (transformers) or the model card's prompt (one
    ``Frame{i}: <image>\\n`` a frame, each ``<image>`` its tiles' context tokens), counted by
    the tokenizer. The bugs named: labels left out of the count, counted as tokens of the
    video, the card's and the processor's newlines swapped, a tile count without the
    thumbnail."""
    from transformers import InternVLProcessor

    from tests.dataprep.test_jinja_template import make_model_dir

    model = make_model_dir(tmp_path, "internvl", tokenizer_path)
    clip = _video(tmp_path / "a.mp4", 30, 640, 240)
    records = [
        {"id": "v", "video": "a.mp4", "conversations": _conv("<video>\nWhat happens?")},
        {"id": "t", "conversations": _conv("Just text.")},
    ]
    rows = _prep(tmp_path, model, records, "internvl", spec)
    rule = parse_video_rule(spec)
    header = probe_video_path(clip)
    n, tiles = rule.frames(header.frames, header.fps), rule.tiles(header.width, header.height)
    assert (n, tiles) == ((8, 1) if rule.source == "transformers" else (6, 4))  # 3x1 + thumb
    tok, text = _rendered(model, [VIDEO, "\nWhat happens?"])
    if rule.source == "transformers":
        writer = object.__new__(InternVLProcessor)
        writer.start_image_token, writer.end_image_token = "<img>", "</img>"
        writer.image_token, writer.image_seq_length = "<IMG_CONTEXT>", 256
        frames = writer.replace_video_token({"pixel_values_videos": [np.zeros(n)]}, 0)
    else:
        image = "<img>" + "<IMG_CONTEXT>" * 256 * tiles + "</img>"
        frames = "".join(f"Frame{i + 1}: <image>\n" for i in range(n)).replace("<image>", image)
    total, context = _counted(tok, text.replace("<video>", frames), "<IMG_CONTEXT>")
    assert context == 256 * n * tiles
    row = {r["sample_id"]: r for r in rows}["v"]
    assert row["llm_tokens"] == total and row["text_tokens"] == total - context
    assert row["video_seq_lens"] == [1024] * (n * tiles) and row["num_images"] == 0


@pytest.mark.parametrize("spec", ["qwen3vl", "qwen3vl:source=qwen-vl-utils,fps=1,max_frames=8"])
def test_a_qwen3vl_video_counts_its_timestamps(tmp_path, tokenizer_path, spec):
    """Qwen3-VL writes ``<t seconds>`` and a vision start and end a pair of frames, and takes
    out the template's own wrapper around the video. Reference: the model's chat template,
    then ``Qwen3VLProcessor``'s own ``replace_video_token`` and ``get_text_with_replacements``
    (which collapses the wrapper), counted by the tokenizer. The bugs named: timestamps left
    out of the count, the template's wrapper counted beside the frames' own, a second
    video's text given to the first."""
    from types import SimpleNamespace

    import torch
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train_hf_vlm as ex
    finally:
        sys.path.remove(str(ROOT / "examples"))
    model = ex.model_dir("qwen3vl", tokenizer_path, tmp_path / "model")
    clips = [_video(tmp_path / "a.mp4", 130, 320, 240, 25), _video(tmp_path / "b.mp4", 24, 180, 90)]
    records = [
        {
            "id": "two",
            "videos": ["a.mp4", "b.mp4"],
            "conversations": _conv("<video> then <video>\nWhat changes?"),
        },
    ]
    rows = _prep(tmp_path, model, records, "qwen3vl", spec)
    rule = parse_video_rule(spec)
    writer = object.__new__(Qwen3VLProcessor)
    writer.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    writer.vision_start_token, writer.vision_end_token = "<|vision_start|>", "<|vision_end|>"
    writer.image_token, writer.video_token = "<|image_pad|>", "<|video_pad|>"
    replacements, pads = [], 0
    for clip in clips:
        header = probe_video_path(clip)
        n = rule.frames(header.frames, header.fps)
        h, w = rule.frame_size(header.width, header.height, n)
        grid = torch.tensor([[-(-n // 2), h // 16, w // 16]])
        meta = VideoMetadata(  # as the processor is given it: no duration
            total_num_frames=header.frames,
            fps=header.fps,
            frames_indices=rule.indices(header.frames, n),
        )
        replacements.append(
            writer.replace_video_token({"video_grid_thw": grid, "video_metadata": [meta]}, 0)
        )
        pads += int(grid.prod()) // 4
    tok, text = _rendered(model, [VIDEO, " then ", VIDEO, "\nWhat changes?"])
    assert text.count("<|vision_start|><|video_pad|><|vision_end|>") == 2
    (full,), _ = writer.get_text_with_replacements([text], videos_replacements=replacements)
    assert "seconds>" in full
    total, counted = _counted(tok, full, "<|video_pad|>")
    assert counted == pads
    row = rows[0]
    assert row["llm_tokens"] == total and row["text_tokens"] == total - pads
    assert row["num_videos"] == 2 and row["video_tokens"] == 4 * pads


def test_a_smolvlm_video_counts_its_sentence_and_timestamps(tmp_path, tokenizer_path):
    """SmolVLM2 writes a sentence with the frame count in words, then ``Frame from MM:SS:``
    and the frame's image tokens a frame. Reference: SmolVLM2's chat template (the processor's
    ``DEFAULT_CHAT_TEMPLATE``, which writes ``<video>``), then ``SmolVLMProcessor``'s own
    ``replace_video_token``, counted by the tokenizer. The bugs named: the sentence or the
    timestamps left out of the count, the frames' markers counted as image tokens."""
    from transformers.models.smolvlm.processing_smolvlm import (
        DEFAULT_CHAT_TEMPLATE,
        SmolVLMProcessor,
    )

    from tests.dataprep.test_jinja_template import make_model_dir

    model = make_model_dir(tmp_path, "smolvlm", tokenizer_path)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = DEFAULT_CHAT_TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    clip = _video(tmp_path / "a.mp4", 95, 320, 240, 10)
    records = [{"id": "v", "video": "a.mp4", "conversations": _conv("<video>What happens?")}]
    spec = "smolvlm:num_frames=8"
    rows = _prep(tmp_path, model, records, "smolvlm", spec)
    rule = parse_video_rule(spec)
    header = probe_video_path(clip)
    idx = rule.indices(header.frames, header.fps)
    assert len(idx) == 8
    writer = object.__new__(SmolVLMProcessor)
    writer.image_seq_len, writer.image_token = 81, "<image>"
    writer.fake_image_token, writer.global_image_token = "<fake_token_around_image>", "<global-img>"
    frames = writer.replace_video_token({"video_metadata": [_metadata(header, idx)]}, 0)
    assert "eight frames" in frames
    tok, text = _rendered(model, [VIDEO, "What happens?"], DEFAULT_CHAT_TEMPLATE)
    total, images = _counted(tok, text.replace("<video>", frames), "<image>")
    assert images == 8 * 81
    row = rows[0]
    assert row["llm_tokens"] == total and row["text_tokens"] == total - images
    assert row["video_seq_lens"] == [729] * 8


def test_a_glm4v_video_counts_its_seconds(tmp_path, tokenizer_path):
    """GLM-4.1V writes each pair of frames between image markers and then the pair's whole
    second, inside the template's own video markers, which stay. Reference: its chat
    template, then ``Glm4vProcessor``'s own ``replace_video_token``, counted by the
    tokenizer. The bugs named: the seconds left out, the video markers taken out."""
    from types import SimpleNamespace

    import torch
    from transformers.models.glm4v.processing_glm4v import Glm4vProcessor

    from tests.dataprep.test_jinja_template import make_model_dir

    model = make_model_dir(tmp_path, "glm4v", tokenizer_path)
    clip = _video(tmp_path / "a.mp4", 75, 320, 240, 5)  # 15 s: 30 frames at 2 fps
    records = [{"id": "v", "video": "a.mp4", "conversations": _conv("<video>\nWhat happens?")}]
    rows = _prep(tmp_path, model, records, "glm4v", "glm4v")
    rule = parse_video_rule("glm4v")
    header = probe_video_path(clip)
    cost = rule.cost(header)
    idx = rule.indices(header.frames, header.fps)
    grid_t, per_t = len(cost.seq_lens), cost.seq_lens[0]
    writer = object.__new__(Glm4vProcessor)
    writer.video_processor, writer.image_token = SimpleNamespace(merge_size=2), "<|image|>"
    thw = torch.tensor([[grid_t, 1, per_t]])
    meta = _metadata(header, idx)
    frames = writer.replace_video_token({"video_grid_thw": thw, "video_metadata": [meta]}, 0)
    tok, text = _rendered(model, [VIDEO, "\nWhat happens?"])
    assert "<|begin_of_video|><|video|><|end_of_video|>" in text
    total, images = _counted(tok, text.replace("<|video|>", frames), "<|image|>")
    assert images == cost.llm_tokens and grid_t == 15
    row = rows[0]
    assert row["llm_tokens"] == total and row["text_tokens"] == total - images


def test_a_gemma4_video_counts_its_timestamps(tmp_path, tokenizer_path):
    """Gemma 4 writes each frame's ``MM:SS`` and its tokens between image markers, the frames
    joined by spaces, in place of the template's ``<|video|>``. Reference: its chat template,
    then ``Gemma4Processor``'s own ``replace_video_token``, counted by the tokenizer. The bugs
    named: the timestamps or markers left out of the count, the frame markers counted as video
    tokens, a frame costing the encoder its own patches instead of the padded budget."""
    from transformers import Gemma4Processor

    from tests.dataprep.test_jinja_template import make_model_dir

    model = make_model_dir(tmp_path, "gemma4", tokenizer_path)
    clip = _video(tmp_path / "a.mp4", 95, 320, 240, 10)
    records = [{"id": "v", "video": "a.mp4", "conversations": _conv("<video>What happens?")}]
    spec = "gemma4:num_frames=8"
    rows = _prep(tmp_path, model, records, "gemma4", spec)
    rule = parse_video_rule(spec)
    header = probe_video_path(clip)
    idx = rule.indices(header.frames, header.fps)
    per_frame = rule.tokens_per_frame(header.width, header.height)
    writer = object.__new__(Gemma4Processor)
    writer.boi_token, writer.eoi_token, writer.video_token = "<|image>", "<image|>", "<|video|>"
    inputs = {"num_soft_tokens_per_video": [per_frame], "video_metadata": [_metadata(header, idx)]}
    frames = writer.replace_video_token(inputs, 0)
    assert frames.startswith("00:00 <|image><|video|>") and "00:08 <|image>" in frames
    tok, text = _rendered(model, [VIDEO, "What happens?"])
    assert "<|turn>user\n<|video|>What happens?<turn|>" in text
    total, tokens = _counted(tok, text.replace("<|video|>", frames), "<|video|>")
    assert tokens == 8 * per_frame and per_frame == 63  # 320 x 240: 336 x 240 px, 7 x 5 x 9
    row = rows[0]
    assert row["llm_tokens"] == total and row["text_tokens"] == total - tokens
    assert row["video_seq_lens"] == [630] * 8 and row["video_tokens"] == 8 * 630


def test_an_ernie_video_counts_its_numbered_markers(tmp_path, tokenizer_path):
    """ERNIE 4.5-VL's template numbers videos apart from pictures (``Picture 1:`` then ``Video
    1:``, each with its start and end markers); the processor expands the placeholder only.
    Reference: its chat template, then ``Ernie4_5_VLMoeProcessor``'s own
    ``replace_video_token``, counted by the tokenizer. The bugs named: the video numbered with
    the pictures, its markers left out of the count, frames paired in the tower (one sequence
    a frame)."""
    from types import SimpleNamespace

    import torch
    from PIL import Image
    from transformers.models.ernie4_5_vl_moe.processing_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeProcessor,
    )

    from tests.dataprep.test_jinja_template import make_model_dir

    model = make_model_dir(tmp_path, "ernie45vl", tokenizer_path)
    clip = _video(tmp_path / "a.mp4", 35, 320, 240, 10)  # 35 frames: 36 after the pad
    Image.new("RGB", (64, 64)).save(tmp_path / "p.png")
    question = "<image>\n<video>\nWhat happens?"
    records = [{"id": "v", "image": "p.png", "video": "a.mp4", "conversations": _conv(question)}]
    rows = _prep(tmp_path, model, records, "ernie45vl", "ernie45vl")
    cost = parse_video_rule("ernie45vl").cost(probe_video_path(clip))
    grid_t, per_frame = len(cost.seq_lens), cost.seq_lens[0]
    assert grid_t == 36 and per_frame == 30 * 40  # 320 x 240 scaled up to 560 x 420 px
    writer = object.__new__(Ernie4_5_VLMoeProcessor)
    writer.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    writer.video_token = "<|VIDEO_PLACEHOLDER|>"
    thw = torch.tensor([[grid_t, 30, 40]])
    frames = writer.replace_video_token({"video_grid_thw": thw}, 0)
    tok, text = _rendered(model, [IMAGE, "\n", VIDEO, "\nWhat happens?"])
    assert "Picture 1:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>" in text
    assert "Video 1:<|VIDEO_START|><|VIDEO_PLACEHOLDER|><|VIDEO_END|>" in text
    from dataprep.policies import parse_vision_policy

    image_tokens = parse_vision_policy("ernie45vl").image_cost(64, 64).llm_tokens
    text = text.replace("<|VIDEO_PLACEHOLDER|>", frames)
    total, tokens = _counted(tok, text, "<|VIDEO_PLACEHOLDER|>")
    _, marker = _counted(tok, text, "<|IMAGE_PLACEHOLDER|>")
    assert tokens == cost.llm_tokens == 36 * 1200 // 8
    row = rows[0]
    assert row["text_tokens"] == total - tokens - marker  # the image's marker is its tokens'
    assert row["llm_tokens"] == row["text_tokens"] + tokens + image_tokens
    assert row["video_seq_lens"] == [1200] * 36


def test_gemma4_measures_an_image_a_video_and_a_recording_in_one_sample(tmp_path, tokenizer_path):
    """A Gemma 4 sample with a picture, a clip and a recording, through its chat template: each
    marker expanded as ``Gemma4Processor`` expands it (the image between its markers, each
    frame's time and tokens, the recording's tokens between ``<|audio>`` and ``<audio|>``,
    its mask from ``Gemma4AudioFeatureExtractor``), the whole counted by the tokenizer; each
    phase in its own columns. The bugs named: the recording counted as text or as nothing,
    its markers left out, an audio rule accepted beside another family's vision policy."""
    from PIL import Image
    from transformers import Gemma4Processor
    from transformers.models.gemma4.feature_extraction_gemma4 import (
        Gemma4AudioFeatureExtractor,
    )

    from dataprep.media_rules.base import samples_at
    from dataprep.policies import parse_vision_policy
    from tests.dataprep.test_jinja_template import make_model_dir

    model = make_model_dir(tmp_path, "gemma4", tokenizer_path)
    clip = _video(tmp_path / "a.mp4", 40, 320, 240, 10)
    _wav(tmp_path / "a.wav", 2.5)  # 22,050 Hz: 40,000 samples at 16 kHz
    Image.new("RGB", (200, 100)).save(tmp_path / "p.png")
    record = {
        "id": "m",
        "image": "p.png",
        "video": "a.mp4",
        "audio": "a.wav",
        "conversations": _conv("<image><video><audio>What happens?"),
    }
    data = write_jsonl(tmp_path / "d.jsonl", [record])
    kw = dict(template=str(model), video_rule="gemma4:num_frames=4", audio_rule="gemma4")
    _res, rows, errors = run(
        tmp_path, [data], str(model / "tokenizer.json"), vision_policy="gemma4", **kw
    )
    assert not errors
    with pytest.raises(
        ValueError,
        match="--audio-rule gemma4 is the audio processor of the models of vision policy gemma4",
    ):
        kw.pop("video_rule")
        run(tmp_path, [data], str(model / "tokenizer.json"), vision_policy="qwen2vl", **kw)

    writer = object.__new__(Gemma4Processor)
    writer.boi_token, writer.eoi_token, writer.video_token = "<|image>", "<image|>", "<|video|>"
    writer.boa_token, writer.eoa_token, writer.audio_token = "<|audio>", "<audio|>", "<|audio|>"
    n = samples_at(probe_audio_path(tmp_path / "a.wav"), 16000)
    mask = Gemma4AudioFeatureExtractor()([np.zeros(n, np.float32)])["input_features_mask"][0]
    audio = writer.replace_audio_token({"input_features_mask": [mask]}, 0)
    video_rule = parse_video_rule("gemma4:num_frames=4")
    header = probe_video_path(clip)
    per_frame = video_rule.tokens_per_frame(header.width, header.height)
    idx = video_rule.indices(header.frames, header.fps)
    inputs = {"num_soft_tokens_per_video": [per_frame], "video_metadata": [_metadata(header, idx)]}
    video = writer.replace_video_token(inputs, 0)
    image_tokens = parse_vision_policy("gemma4").image_cost(200, 100).llm_tokens
    image = "<|image>" + "<|image|>" * image_tokens + "<image|>"

    tok, text = _rendered(model, [IMAGE, VIDEO, AUDIO, "What happens?"])
    assert "<|image|><|video|><|audio|>What happens?" in text
    text = text.replace("<|audio|>", audio, 1).replace("<|video|>", video, 1)
    total, _ = _counted(tok, text.replace("<|image|>", image, 1), "<|image|>")
    audio_tokens = audio.count("<|audio|>")
    assert audio_tokens == 63  # 2.5 s at 40 ms a token, rounded up
    row = rows[0]
    assert row["llm_tokens"] == total
    assert row["num_audios"] == 1 and row["audio_seq_lens"] == [63] == [row["audio_tokens"]]
    assert row["text_tokens"] == total - audio_tokens - 4 * per_frame - image_tokens
    assert row["video_seq_lens"] == [630] * 4


def test_audio_is_measured_with_its_rule(tmp_path, tokenizer_path):
    _wav(tmp_path / "a.wav", 12.5)
    _wav(tmp_path / "long.wav", 95.0, 8000)
    records = [
        {"id": "a", "audio": "a.wav", "conversations": _conv("<audio>\nTranscribe.")},
        {
            "id": "b",
            "audios": ["a.wav", "long.wav"],
            "conversations": _conv("<audio><audio> Both?"),
        },
    ]
    data = write_jsonl(tmp_path / "d.jsonl", records)
    _res, rows, errors = run(tmp_path, [data], tokenizer_path, audio_rule="qwen2_5_omni")
    assert not errors
    rule = parse_audio_rule("qwen2_5_omni")
    a, long = (rule.cost(probe_audio_path(tmp_path / n)) for n in ("a.wav", "long.wav"))
    by_id = {r["sample_id"]: r for r in rows}
    assert by_id["a"]["audio_seq_lens"] == list(a.seq_lens) and by_id["a"]["num_audios"] == 1
    assert by_id["b"]["audio_seq_lens"] == list(a.seq_lens + long.seq_lens)
    assert by_id["b"]["llm_tokens"] == by_id["b"]["text_tokens"] + a.llm_tokens + long.llm_tokens
    assert by_id["a"]["modality"] == "audio"
    # 12.5 s at 16 kHz: 1250 feature frames in chunks of 200 -> 6 of 100 positions, 1 of 25
    assert a.seq_lens == (100,) * 6 + (25,) and a.llm_tokens == 312


def test_media_errors_are_rows_naming_the_file(tmp_path, tokenizer_path):
    _video(tmp_path / "ok.mp4", 8)
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "one.mp4").write_bytes(_video(tmp_path / "one_src.mp4", 1).read_bytes())
    outside = tmp_path.parent / f"{tmp_path.name}-outside.mp4"
    outside.write_bytes((tmp_path / "ok.mp4").read_bytes())
    (tmp_path / "link.mp4").symlink_to(outside)
    records = [
        {"id": "missing", "video": "nope.mp4", "conversations": _conv("<video> hi")},
        {"id": "empty", "video": "empty.mp4", "conversations": _conv("<video> hi")},
        {"id": "short", "video": "one.mp4", "conversations": _conv("<video> hi")},
        {"id": "link", "video": "link.mp4", "conversations": _conv("<video> hi")},
        {"id": "two_marks", "video": "ok.mp4", "conversations": _conv("<video> <video> hi")},
        {"id": "audio", "audio": "x.wav", "conversations": _conv("hi")},
        {"id": "fine", "video": "ok.mp4", "conversations": _conv("<video> hi")},
    ]
    data = write_jsonl(tmp_path / "d.jsonl", records)
    _res, rows, errors = run(
        tmp_path, [data], tokenizer_path, vision_policy="qwen2vl", video_rule="qwen2vl"
    )
    reasons = {e["sample_id"]: e["reason"] for e in errors}
    assert reasons == {
        "missing": "missing_image",
        "empty": "empty_video",
        "short": "video_too_short",
        "link": "unsafe_path",
        "two_marks": "media_placeholder_mismatch",
        "audio": "unsupported_modality",  # no audio rule in this run
    }
    assert [r["sample_id"] for r in rows] == ["fine"]
    details = {e["sample_id"]: e["detail"] for e in errors}
    for sid in ("missing", "empty", "short", "link"):
        assert ".mp4" in details[sid], details[sid]
    assert "--audio-rule" in details["audio"]


def test_a_video_rule_of_another_family_is_refused(tmp_path, tokenizer_path):
    """A video rule beside another family's vision policy is refused, and beside a policy of
    its own family whose models take no videos (Idefics3 beside SmolVLM2: the bug named, its
    videos counted by a processor it does not have)."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": "x", "conversations": _conv("hi")}])
    with pytest.raises(ValueError, match="--vision-policy qwen2vl"):
        run(tmp_path, [data], tokenizer_path, vision_policy="qwen3vl", video_rule="qwen2vl")
    with pytest.raises(ValueError, match="vision policy smolvlm, but --vision-policy is idefics3"):
        run(tmp_path, [data], tokenizer_path, vision_policy="idefics3", video_rule="smolvlm")
    run(tmp_path, [data], tokenizer_path, vision_policy="smolvlm", video_rule="smolvlm")
    with pytest.raises(ValueError, match="not one of its options"):
        run(tmp_path, [data], tokenizer_path, vision_policy="qwen2vl", video_rule="qwen2vl:fsp=1")


def test_a_table_without_rules_keeps_its_columns_and_metadata(tmp_path, tokenizer_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": "x", "conversations": _conv("hi")}])
    run(tmp_path, [data], tokenizer_path)
    out = tmp_path / "out" / "cost.parquet"
    schema = pq.read_schema(out)
    assert "num_videos" not in schema.names and "num_audios" not in schema.names
    meta = table_metadata(out)
    assert meta["phases"] == ["vision", "llm"] and "video_rule" not in meta


def test_embedded_audio_bytes_are_measured(tmp_path, tokenizer_path):
    """A Parquet table's audio struct (bytes and path, as HF datasets store undecoded audio)."""
    import pyarrow as pa

    buf = io.BytesIO()
    soundfile.write(buf, np.zeros(48000, np.float32), 48000, format="FLAC")
    audio = pa.array(
        [{"bytes": buf.getvalue(), "path": "x.flac"}],
        pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
    )
    table = pa.table({"id": ["e"], "text": ["<audio> say"], "audio": audio})
    pq.write_table(table, tmp_path / "d.parquet")
    _, rows, errors = run(
        tmp_path, [tmp_path / "d.parquet"], tokenizer_path, audio_rule="qwen2audio"
    )
    assert not errors, errors
    assert rows[0]["audio_seq_lens"] == [1500]  # Qwen2-Audio: the padded 30-s window
    assert rows[0]["num_audios"] == 1 and rows[0]["llm_tokens"] == rows[0]["text_tokens"] + 25


def test_a_video_table_balances_and_is_written_through_the_cli(tmp_path, tokenizer_path):
    """Qwen2-VL's videos are its vision tower's load (balance folds them in); write checks the
    plan against the folded table and carries the videos; verify passes."""
    from equishard.cli import main

    _video(tmp_path / "a.mp4", 30)
    records = [
        {
            "id": f"s{i}",
            **({"video": "a.mp4"} if i % 2 else {}),
            "conversations": _conv("<video> hi" if i % 2 else "hi"),
        }
        for i in range(8)
    ]
    data = write_jsonl(tmp_path / "d.jsonl", records)
    run(tmp_path, [data], tokenizer_path, vision_policy="qwen2vl", video_rule="qwen2vl")
    cost = tmp_path / "out" / "cost.parquet"
    assert main(["balance", str(cost), "--dp", "2", "-o", str(tmp_path / "plan"), "--json"]) == 0
    plan = pq.read_table(tmp_path / "plan" / "plan.parquet").to_pydict()
    video = parse_video_rule("qwen2vl").cost(probe_video_path(tmp_path / "a.mp4")).tokens
    groups = dict(zip(plan["group_id"], plan["group_vit_tokens"], strict=True))
    assert sum(groups.values()) == 4 * video  # the four videos' patches, in the vision load
    code = main(
        ["write", str(tmp_path / "plan"), "--cost-table", str(cost), "--out", str(tmp_path / "gen")]
    )
    assert code == 0 and (tmp_path / "gen" / "CURRENT").exists()
    assert main(["verify", str(tmp_path / "gen")]) == 0


def test_a_cache_reuses_video_rows_and_measures_changed_videos_again(tmp_path, tokenizer_path):
    """--cache with a video rule: an unchanged sample keeps its row (video columns and all,
    under its seal), a video replaced since is measured again; a cache of another video rule
    is refused."""
    _video(tmp_path / "a.mp4", 20)
    _video(tmp_path / "b.mp4", 20)
    records = [
        {"id": k, "video": f"{k}.mp4", "conversations": _conv("<video> hi")} for k in ("a", "b")
    ]
    data = write_jsonl(tmp_path / "d.jsonl", records)
    kw = {"vision_policy": "qwen2vl", "video_rule": "qwen2vl"}
    _, first, _ = run(tmp_path, [data], tokenizer_path, **kw)
    cache = tmp_path / "cache.parquet"
    (tmp_path / "out" / "cost.parquet").rename(cache)
    _video(tmp_path / "b.mp4", 60)
    res, rows, _ = run(tmp_path, [data], tokenizer_path, cache=str(cache), **kw)
    assert res.n_cached == 1
    by_id = {r["sample_id"]: r for r in rows}
    old = {r["sample_id"]: r for r in first}
    assert by_id["a"]["video_seq_lens"] == old["a"]["video_seq_lens"]
    rule = parse_video_rule("qwen2vl")
    assert by_id["b"]["video_tokens"] == rule.cost(probe_video_path(tmp_path / "b.mp4")).tokens
    assert by_id["b"]["video_tokens"] != old["b"]["video_tokens"]
    with pytest.raises(ValueError, match="other settings"):
        run(
            tmp_path,
            [data],
            tokenizer_path,
            cache=str(cache),
            vision_policy="qwen2vl",
            video_rule="qwen2vl:fps=1",
        )


def test_a_llava_video_sample_is_measured_as_llava_onevision_counts_it(tmp_path, tokenizer_path):
    """LLaVA-Video's records (``<image>`` beside a video field) under LLaVA-OneVision's chat
    template and video rule: text counted by transformers' rendering of the template, the
    video as the processor expands ``<video>`` (frames x 196 + 1)."""
    from transformers import PreTrainedTokenizerFast

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train_hf_vlm as ex
    finally:
        sys.path.remove(str(ROOT / "examples"))
    model = ex.model_dir("llava_onevision", tokenizer_path, tmp_path / "model")
    _video(tmp_path / "c.mp4", 40)
    records = [{"id": "c", "video": "c.mp4", "conversations": _conv("<image>\nWhat is shown?")}]
    data = write_jsonl(tmp_path / "d.jsonl", records)
    spec = "llava-onevision:num_frames=8"
    _, rows, errors = run(
        tmp_path,
        [data],
        str(model / "tokenizer.json"),
        template=str(model),
        vision_policy="llava-onevision",
        video_rule=spec,
    )
    assert not errors, errors
    tok = PreTrainedTokenizerFast(tokenizer_file=str(model / "tokenizer.json"))
    template = json.loads((model / "tokenizer_config.json").read_text())["chat_template"]
    messages = [
        {
            "role": "user",
            "content": [{"type": "video"}, {"type": "text", "text": "\nWhat is shown?"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "It is a clip."}]},
    ]
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False)
    text = text.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    assert text.count("<video>") == 1
    n_text = len(tok(text, add_special_tokens=False)["input_ids"]) - 1
    assert rows[0]["text_tokens"] == n_text
    assert rows[0]["llm_tokens"] == n_text + 8 * 196 + 1
    assert rows[0]["video_seq_lens"] == [729] * 8


def test_a_llava_next_video_sample_counts_its_image_and_its_frames(tmp_path, tokenizer_path):
    """LLaVA-NeXT-Video's template (images, then videos, then text) over a sample with a
    picture and a clip: the picture as LLaVA-NeXT's anyres counts it, the clip as
    ``LlavaNextVideoProcessor.replace_video_token`` expands ``<video>`` (8 frames of 144), the
    text by transformers' rendering of the template. The bugs named: a video counted with
    the image family's rule, its frames unpooled, the template's newline after ``<video>`` lost."""
    from PIL import Image

    from dataprep.policies import parse_vision_policy
    from tests.dataprep.test_jinja_template import TEMPLATES, make_model_dir
    from tests.dataprep.test_media_rules import _llava_next_video_reference

    model = make_model_dir(tmp_path, "llava_next", tokenizer_path)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = (TEMPLATES / "llava_next_video.jinja").read_text()
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    _video(tmp_path / "c.mp4", 40)
    Image.new("RGB", (500, 300)).save(tmp_path / "p.png")
    question = "<image>\n<video>\nWhat is shown?"
    records = [{"id": "c", "image": "p.png", "video": "c.mp4", "conversations": _conv(question)}]
    rows = _prep(tmp_path, model, records, "llava-next", "llava-next-video")
    tok, text = _rendered(model, [IMAGE, "\n", VIDEO, "\nWhat is shown?"])
    assert text.startswith("USER: <image>\n<video>\n\n \nWhat is shown? ASSISTANT: ")
    image = parse_vision_policy("llava-next").image_cost(500, 300).llm_tokens
    video = _llava_next_video_reference(40, 10.0, 8, 0.0, 336)
    total, markers = _counted(tok, text, "<video>")
    n_text = total - markers - _counted(tok, text, "<image>")[1]  # the two markers
    assert video == 8 * 144
    row = rows[0]
    assert row["text_tokens"] == n_text and row["llm_tokens"] == n_text + image + video
    assert row["video_seq_lens"] == [576] * 8


def test_a_video_under_a_field_prep_does_not_read_is_refused_with_the_field_to_use(
    tmp_path, tokenizer_path
):
    _video(tmp_path / "a.mp4", 8)
    records = [{"id": "x", "video_path": "a.mp4", "conversations": _conv("<video> hi")}]
    data = write_jsonl(tmp_path / "d.jsonl", records)
    _, rows, errors = run(
        tmp_path, [data], tokenizer_path, vision_policy="qwen2vl", video_rule="qwen2vl"
    )
    assert not rows and [e["reason"] for e in errors] == ["unread_media_field"]
    assert "video/videos" in errors[0]["detail"] and "--image-column" not in errors[0]["detail"]
