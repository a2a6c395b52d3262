"""A sample carrying media prep does not measure is refused, never counted as its text alone.

The bug these tests catch: a LLaVA-Video record (``"video": "clip.mp4"``, ``<video>`` in the
prompt) or an audio sample prepped as a text row (modality ``text``, 34 tokens) and balanced as
a caption. Each way a sample can carry a video or audio is tried in each reader (JSON lines,
Parquet, a saved HF dataset, a WebDataset tar), with real encoded files beside the records, and
the counts still add up: every sample is a row or an error.
"""

from __future__ import annotations

import io
import json
import math
import tarfile
import wave

import av
import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataprep.errors import REASONS, SampleRejected
from dataprep.records import normalize_record
from equishard.contracts.media import MEASURED, MODALITIES, suffix_modality
from tests.conftest import image_bytes, write_image
from tests.dataprep.helpers import add_member, llava, run, write_jsonl


def wav_bytes(seconds: float = 0.25, rate: int = 16000) -> bytes:
    """A real PCM WAV file (a 440 Hz tone)."""
    t = np.arange(int(seconds * rate)) / rate
    pcm = (np.sin(2 * math.pi * 440 * t) * 20000).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def mp4_bytes(frames: int = 4, size: int = 32) -> bytes:
    """A real MPEG-4 video (``frames`` frames at 2 fps) encoded by FFmpeg through PyAV."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=2)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            img = np.full((size, size, 3), 40 * i, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def _conv(question: str) -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": "A short answer."}]


@pytest.fixture()
def media(tmp_path):
    (tmp_path / "clip.mp4").write_bytes(mp4_bytes())
    (tmp_path / "speech.wav").write_bytes(wav_bytes())
    write_image(tmp_path / "ok.jpg", 448, 448)
    with av.open(str(tmp_path / "clip.mp4")) as c:  # the fixture's video is a real one
        assert c.streams.video[0].frames == 4
    return tmp_path


def test_every_way_a_jsonl_record_carries_video_or_audio_is_refused(media, tokenizer_path):
    records = [
        llava("text", None),
        llava("image", "ok.jpg", question="<image>\nWhat is this?"),
        # LLaVA-Video: the field and its placeholder
        {"id": "video", "video": "clip.mp4", "conversations": _conv("<video>\nDescribe it.")},
        # the field alone (placeholder missing), and the placeholder alone (media missing)
        {"id": "video-field", "video": "clip.mp4", "conversations": _conv("Describe it.")},
        {"id": "video-text", "conversations": _conv("<video>\nDescribe it.")},
        {"id": "videos", "videos": ["clip.mp4", "clip.mp4"], "conversations": _conv("Two.")},
        {"id": "Video", "Video": "clip.mp4", "conversations": _conv("Case.")},
        {"id": "qwen-pad", "conversations": _conv("<|vision_start|><|video_pad|><|vision_end|>")},
        {"id": "audio", "audio": "speech.wav", "conversations": _conv("<audio>\nTranscribe.")},
        {"id": "speech", "speech": "speech.wav", "conversations": _conv("Transcribe.")},
        {"id": "omni", "conversations": _conv("<|audio_bos|><|AUDIO|><|audio_eos|>Say it.")},
        {
            "id": "part-video",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "video", "video": "clip.mp4"},
                        {"type": "text", "text": "?"},
                    ],
                },
                {"role": "assistant", "content": "A clip."},
            ],
        },
        {
            "id": "part-audio",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                        {"type": "text", "text": "?"},
                    ],
                },
                {"role": "assistant", "content": "Words."},
            ],
        },
        # an image beside a video is still a video sample: refused whole
        {
            "id": "image-and-video",
            "image": "ok.jpg",
            "video": "clip.mp4",
            "conversations": _conv("<image>\n<video>\nCompare."),
        },
        # an image under a field prep does not read, and none where it reads them
        {"id": "image-path", "image_path": "ok.jpg", "conversations": _conv("<image>\nWhat?")},
        # a media field that is present but empty names no media, nor does a plain value
        {
            "id": "empty-fields",
            "video": None,
            "audio": [],
            "speech": "",
            "videos": [None, ""],
            "score": 3,
            "conversations": _conv("Hello."),
        },
        # an empty field before one that is not: the second is still looked at
        {"id": "after-empty", "audio": None, "video": "clip.mp4", "conversations": _conv("Hi.")},
        # an image read, with the same image named under another field too
        {
            "id": "image-twice",
            "image": "ok.jpg",
            "image_path": "ok.jpg",
            "conversations": _conv("<image>\nWhat?"),
        },
        # a content part of no known modality is malformed text, not media
        {
            "id": "part-unknown",
            "messages": [
                {"role": "user", "content": [{"type": "hologram"}, {"type": "text", "text": "?"}]}
            ],
        },
    ]
    res, rows, errors = run(media, [write_jsonl(media / "d.jsonl", records)], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["text", "image", "empty-fields", "image-twice"]
    assert [r["modality"] for r in rows] == ["text", "image", "text", "image"]
    reasons = {e["sample_id"]: e["reason"] for e in errors}
    assert reasons == {
        "video": "unsupported_modality",
        "video-field": "unsupported_modality",
        "video-text": "unsupported_modality",
        "videos": "unsupported_modality",
        "Video": "unsupported_modality",
        "qwen-pad": "unsupported_modality",
        "audio": "unsupported_modality",
        "speech": "unsupported_modality",
        "omni": "unsupported_modality",
        "part-video": "unsupported_modality",
        "part-audio": "unsupported_modality",
        "image-and-video": "unsupported_modality",
        "image-path": "unread_media_field",
        "after-empty": "unsupported_modality",
        "part-unknown": "non_string_text",
    }
    assert res.n_in == 19 and res.reasons["unsupported_modality"] == 13
    detail = {e["sample_id"]: e["detail"] for e in errors}
    assert "video" in detail["video"] and "images only" in detail["video"]
    assert "'<video>' in turn 0" in detail["video-text"]
    assert "'<|AUDIO|>'" in detail["omni"] and "audio" in detail["omni"]
    assert "type 'input_audio'" in detail["part-audio"]
    assert "'image_path'" in detail["image-path"] and "image/images" in detail["image-path"]
    assert all(e["location"].startswith(str(media / "d.jsonl") + "#") for e in errors)


def test_a_table_with_a_video_or_audio_column_refuses_the_rows_that_carry_one(
    tmp_path, tokenizer_path
):
    conv = _conv("<image>\nWhat?")
    table = pa.table(
        {
            "id": ["a", "b", "c"],
            "image": [image_bytes(448, 448), image_bytes(448, 448), image_bytes(448, 448)],
            "audio": [{"bytes": wav_bytes(), "path": "x.wav"}, None, {"bytes": None, "path": None}],
            "conversations": [conv, conv, conv],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    _res, rows, errors = run(tmp_path, [tmp_path / "t.parquet"], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["b", "c"]  # c's audio struct is all nulls
    assert [(e["sample_id"], e["reason"]) for e in errors] == [("a", "unsupported_modality")]


def test_a_saved_hf_dataset_with_an_audio_feature_is_refused_not_read_as_text(
    tmp_path, tokenizer_path
):
    (tmp_path / "s.wav").write_bytes(wav_bytes())
    feats = datasets.Features(
        {
            "id": datasets.Value("string"),
            "audio": {"bytes": datasets.Value("binary"), "path": datasets.Value("string")},
            "conversations": [
                {"from": datasets.Value("string"), "value": datasets.Value("string")}
            ],
        }
    )
    rows = {
        "id": ["h0"],
        "audio": [{"bytes": wav_bytes(), "path": "s.wav"}],
        "conversations": [_conv("Transcribe.")],
    }
    ds = datasets.Dataset.from_dict(rows, features=feats)  # encoding an Audio needs torchcodec:
    ds = ds.cast_column("audio", datasets.Audio(sampling_rate=16000, decode=False))  # cast it
    assert isinstance(ds.features["audio"], datasets.Audio)
    ds.save_to_disk(str(tmp_path / "hf"))
    _res, out, errors = run(tmp_path, [tmp_path / "hf"], tokenizer_path)
    assert out == [] and [(e["sample_id"], e["reason"]) for e in errors] == [
        ("h0", "unsupported_modality")
    ]


def test_a_decoded_audio_under_any_field_name_is_refused():
    record = {"id": "x", "clip": {"array": [0.0, 0.1], "sampling_rate": 16000}, "text": "hi"}
    with pytest.raises(SampleRejected, match=r"unsupported_modality: .*'clip' holds decoded audio"):
        normalize_record(record, "x")


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ({"k.json": "conv", "k.mp4": "mp4"}, "unsupported_modality"),
        ({"k.json": "conv", "k.0.jpg": "jpg", "k.1.webm": "mp4"}, "unsupported_modality"),
        ({"k.json": "conv", "k.flac": "wav"}, "unsupported_modality"),
        ({"k.json": "conv", "k.WAV": "wav"}, "unsupported_modality"),
        ({"k.json": "conv", "k.tiff": "jpg"}, "unsupported_format"),
        ({"k.json": "conv", "k.0.jpg": "jpg", "k.1.TIF": "jpg"}, "unsupported_format"),
        # video and audio in formats prep does not read, whatever the run measures
        ({"k.json": "conv", "k.wmv": "mp4"}, "unsupported_format"),
        ({"k.json": "conv", "k.m4a": "wav"}, "unsupported_format"),
        # the JSON names an image the tar does not carry: not measured as text
        ({"k.json": "conv-image-field"}, "unread_media_field"),
    ],
)
def test_a_tar_sample_with_a_media_member_prep_cannot_read_is_refused(
    tmp_path, tokenizer_path, members, reason
):
    data = {"mp4": mp4_bytes(), "wav": wav_bytes(), "jpg": image_bytes(448, 448)}
    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        add_member(tf, "ok.json", b'{"conversations": [{"from": "human", "value": "hi"}]}')
        for name, kind in members.items():
            n_img = sum(m.endswith(".jpg") for m in members)
            conv = {"conversations": _conv("<image>" * n_img + "Describe.")}
            if kind == "conv-image-field":
                conv["image"] = "coco/0001.jpg"
            add_member(
                tf,
                name,
                json.dumps(conv).encode() if kind in ("conv", "conv-image-field") else data[kind],
            )
        add_member(tf, "txt.json", b'{"conversations": [{"from": "human", "value": "yo"}]}')
        add_member(tf, "txt.cls", b"3")  # a label member: not media, left alone
    _res, rows, errors = run(tmp_path, [tmp_path / "s.tar"], tokenizer_path)
    assert [r["sample_id"] for r in rows] == ["ok", "txt"]
    assert [(e["sample_id"], e["reason"]) for e in errors] == [("k", reason)]
    member = next((m for m in members if not m.endswith((".json", ".jpg"))), None)
    if member is not None:
        assert member in errors[0]["detail"] and str(tmp_path / "s.tar") in errors[0]["detail"]
    else:
        assert "'image'" in errors[0]["detail"] and "members" in errors[0]["detail"]


def test_the_vocabulary_is_consistent():
    """Every modality's suffixes, fields and placeholders map back to it, its own placeholder
    first; each refusal reason has its summary sentence."""
    from equishard.contracts.media import field_modality

    assert {"image"} == MEASURED  # video and audio only in a run given their rule
    for m in MODALITIES:
        for s in (*m.suffixes, *m.other_suffixes):
            assert suffix_modality(s) is m and suffix_modality(f"3.{s.upper()}") is m
        for f in (*m.read_fields, *m.alias_fields):
            assert field_modality(f) is m and field_modality(f.upper()) is m
        assert m.placeholders[0] == f"<{m.name}>" and m.read_fields
    assert suffix_modality("cls") is None and suffix_modality("json") is None
    assert {"unsupported_modality", "unread_media_field", "unsupported_format"} <= set(REASONS)


ALL = frozenset({"image", "video", "audio"})  # a run with a video and an audio rule


@pytest.mark.parametrize(
    ("field", "mark", "n"),
    [
        ("video", "<video>", 1),
        ("videos", "<video>", 2),
        ("audio", "<audio>", 1),
        ("audios", "<audio>", 3),
    ],
)
def test_a_video_or_recording_without_its_placeholder_is_refused(field, mark, n):
    """A clip's place in the prompt is never guessed: no mark at all is refused as a mark
    count off by one is (images keep LLaVA's convention: placed before the first turn)."""
    files = [f"m{i}.mp4" if "video" in field else f"m{i}.flac" for i in range(n)]
    value = files if field.endswith("s") else files[0]
    conv = [{"from": "human", "value": "What is it?"}, {"from": "gpt", "value": "ok"}]
    with pytest.raises(SampleRejected) as e:
        normalize_record({"id": "x", field: value, "conversations": conv}, "x", measured=ALL)
    assert e.value.reason == "media_placeholder_mismatch" and mark in str(e.value)
    conv[0]["value"] = mark * (n + 1) + " What is it?"  # one mark too many: refused too
    with pytest.raises(SampleRejected, match="placeholder"):
        normalize_record({"id": "x", field: value, "conversations": conv}, "x", measured=ALL)
    conv[0]["value"] = mark * n + " What is it?"
    got = normalize_record({"id": "x", field: value, "conversations": conv}, "x", measured=ALL)
    assert len(got.videos if "video" in field else got.audios) == n
    plain = [{"from": "human", "value": "What is it?"}, {"from": "gpt", "value": "ok"}]
    image = normalize_record({"id": "i", "image": "a.jpg", "conversations": plain}, "i")
    assert image.turns[0][1].startswith("<image>\n")  # images: LLaVA's placement
