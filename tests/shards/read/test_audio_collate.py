"""The collator of a generation with recordings builds what the processor builds and what prep
counted (#67: ``equishard train`` on images and audio).

References: transformers' own ``load_audio`` and ``WhisperFeatureExtractor`` run as Qwen2-Audio's
processor runs them (the whole padded window, its attention mask), the demo tokenizer's own
encoding of the rendered text, and the chunk rule computed here by hand. Bugs named: features
of another resampler or a shorter padding that changes the last frames, a recording past the
window not cut (or cut a frame early), the mask's frame count off by one at a hop boundary, an
``<audio>`` given another recording's tokens (two in one sample), audio tokens learnt as
targets, the audio rule's positions not checked against prep's (a collator with other chunks
passes the LLM count), a rule or mel count past its limits, a recorded rule that is not the
one this version builds, a sample whose marks and recordings disagree.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile

from dataprep.media_rules import parse_audio_rule
from shards.read.audio_features import MAX_MEL, AudioFeatures
from shards.read.collate import Collator
from tests.shards.media_generation import POLICY, RECORDINGS, RULES, build_audio_generation


def _processor_features(data: bytes, chunk_length: int, mel: int = 128) -> np.ndarray:
    """Qwen2-Audio's processor's steps: ``load_audio`` at 16 kHz, then the feature extractor
    over the whole window, the mask's frames kept."""
    from transformers import WhisperFeatureExtractor
    from transformers.audio_utils import load_audio

    wave = load_audio(
        "data:audio/wav;base64," + __import__("base64").b64encode(data).decode(),
        sampling_rate=16000,
        backend="soundfile",
    )
    fe = WhisperFeatureExtractor(feature_size=mel, chunk_length=chunk_length)
    out = fe([wave], sampling_rate=16000, return_attention_mask=True, return_tensors="np")
    frames = int(out["attention_mask"].sum())
    return out["input_features"][0][:, :frames].T


def _wav(samples: int, rate: int = 16000, channels: int = 1, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    soundfile.write(buf, (0.2 * rng.standard_normal((samples, channels))).astype(np.float32), rate,
                    format="WAV", subtype="FLOAT")  # fmt: skip
    return buf.getvalue()


@pytest.mark.parametrize("name", [r[0] for r in RECORDINGS])
def test_features_are_the_processors_on_every_frame_of_the_mask(tmp_path, name):
    from tests.shards.media_generation import write_recordings

    write_recordings(tmp_path)
    data = (tmp_path / name).read_bytes()
    ref = _processor_features(data, chunk_length=2)
    got = AudioFeatures(rule=parse_audio_rule(RULES["chunks"]))(data)
    assert got.shape == ref.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("samples", "frames"),
    [
        (31840, 199),  # 199 hops exactly
        (31841, 200),  # one sample into the next hop
        (31999, 200),  # below the 2-s window
        (32000, 200),  # at it
        (32001, 200),  # above: cut at the window, as the processor cuts it
        (40000, 200),
        (1, 1),
        (160, 1),
        (161, 2),
    ],
)
def test_the_mask_frames_at_every_boundary(samples, frames):
    data = _wav(samples)
    got = AudioFeatures(rule=parse_audio_rule(RULES["padded"]), mel=80)(data)
    assert got.shape == (frames, 80)
    np.testing.assert_allclose(got, _processor_features(data, 2, mel=80), rtol=0, atol=1e-6)


def test_a_resampled_stereo_recording_keeps_the_length_prep_counted():
    from dataprep.audio_header import probe_audio_bytes

    data = _wav(44100 + 7, rate=44100, channels=2)
    rule = parse_audio_rule("qwen2audio")
    got = AudioFeatures(rule=rule)(data)
    assert len(got) == rule.frames(probe_audio_bytes(data, "x.wav")) == 101


@pytest.mark.filterwarnings("ignore:At least one mel filter")  # 1,024 bins of 201 frequencies
@pytest.mark.parametrize(("mel", "ok"), [(0, False), (1, True), (MAX_MEL, True),
                                         (MAX_MEL + 1, False), (True, False)])  # fmt: skip
def test_mel_bins_at_their_limits(tokenizer_path, mel, ok):
    make = lambda: Collator(  # noqa: E731
        tokenizer=tokenizer_path, vision_policy=POLICY, audio_rule=RULES["padded"], audio_mel=mel
    )
    if ok:
        assert make().audio.mel == mel
    else:
        with pytest.raises(ValueError, match="audio_mel"):
            make()


def test_a_rule_that_is_not_whispers_is_refused(tokenizer_path):
    with pytest.raises(ValueError, match="Whisper"):
        Collator(tokenizer=tokenizer_path, vision_policy=POLICY, audio_rule="gemma4")
    # Audio Flamingo 3's several padded windows a recording: its HF model's, not this encoder's
    with pytest.raises(ValueError, match=r"several padded windows.*audioflamingo3"):
        Collator(tokenizer=tokenizer_path, vision_policy=POLICY, audio_rule="audioflamingo3")


@pytest.fixture(scope="module", params=sorted(RULES))
def audio_gen(request, tmp_path_factory, tokenizer_path):
    root = tmp_path_factory.mktemp(f"audiogen-{request.param}")
    return request.param, build_audio_generation(root, RULES[request.param], tokenizer_path)


def _all(gen):
    from shards import open_generation, read_group

    m = open_generation(gen)
    out = []
    for shard, g in m.group_index().values():
        out += read_group(m.path, shard, g)[0]
    return m, sorted(out, key=lambda s: s.meta["sample_id"])


def _positions(kind: str, frames: int) -> int:
    """The encoder's positions for one recording, by hand: the padded window's 100 (200
    frames, halved by the stem), or each chunk of 6 frames' ``(c - 1) // 2 + 1``."""
    if kind == "padded":
        return 100
    chunks = [6] * (frames // 6) + ([frames % 6] if frames % 6 else [])
    return sum((c - 1) // 2 + 1 for c in chunks)


def test_each_audio_mark_becomes_its_own_recordings_tokens(audio_gen, tokenizer_path):
    from tokenizers import AddedToken, Tokenizer

    kind, gen = audio_gen
    m, samples = _all(gen)
    c = Collator.from_generation(m)
    assert c.audio_rule == parse_audio_rule(RULES[kind]).spec()
    tok = Tokenizer.from_file(tokenizer_path)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<image>", "<IMG_CONTEXT>", "<audio>")])  # fmt: skip
    mark, image = tok.token_to_id("<audio>"), tok.token_to_id("<image>")
    data = {name: (gen.parent / "data" / name).read_bytes() for name, *_ in RECORDINGS}
    seen = 0
    for s in samples:
        b = c([s])
        ids, labels = b["input_ids"].tolist(), b["labels"].tolist()
        frames = b["audio_lens"][:, 0].tolist()
        assert b["num_audios"].tolist() == [len(s.audios)] and len(frames) == len(s.audios)
        assert b["audio_frames"].tolist() == [sum(frames)]
        # the features, recording by recording in the sample's order, are each file's own
        rows = np.split(b["audio_features"].numpy(), np.cumsum(frames)[:-1]) if frames else []
        for got, blob in zip(rows, s.audios, strict=True):
            name = next(n for n, d in data.items() if d == blob)
            np.testing.assert_allclose(got, _processor_features(blob, 2), rtol=0, atol=1e-6)
            seen += name == "tiny.wav"
        # the tokenizer's own encoding of the rendered text, each <audio> replaced by its
        # recording's count (the processors' formula) in order; each image's run of tokens
        # collapsed back to its mark (images are the image tests' business)
        want = [(((f - 1) // 2 + 1) - 2) // 2 + 1 for f in frames]
        text, _ = c._tmpl.render_spans([tuple(t) for t in s.meta["turns"]])
        expected, k = [], 0
        for i in tok.encode(text, add_special_tokens=False).ids:
            if i == mark:
                expected += [c.audio_token_id] * want[k]
                k += 1
            else:
                expected.append(i)
        got = [i for n, i in enumerate(ids) if i != c.image_token_id or ids[n - 1] != i]
        got = [image if i == c.image_token_id else i for i in got]
        assert k == len(frames) and got == expected
        assert all(lab == -100 for i, lab in zip(ids, labels, strict=True) if i == c.audio_token_id)
        cost = s.meta["cost"]
        assert int(b["llm_lens"][0]) == cost["llm_tokens"]
        assert sum(_positions(kind, f) for f in frames) == cost["audio_tokens"]
    assert seen == 1


def test_two_recordings_in_one_sample_keep_their_order(audio_gen):
    _, gen = audio_gen
    m, samples = _all(gen)
    two = next(s for s in samples if s.meta["sample_id"] == "two")
    b = Collator.from_generation(m)([two])
    assert b["audio_lens"][:, 0].tolist() == [90, 73]  # a22k.wav (0.9 s), then a16k.wav
    ids = b["input_ids"].tolist()
    tok = b["audio_token_id"]
    first = ids.index(tok)
    assert ids[first : first + 22] == [tok] * 22 and ids[first + 22] != tok  # 90 frames: 22
    assert ids.count(tok) == 22 + 18


def test_a_collator_of_other_chunks_is_refused_by_the_positions_prep_counted(audio_gen,
                                                                             tokenizer_path):  # fmt: skip
    """Chunks of 8 frames give the LLM the same tokens and the encoder as many positions:
    only the chunks' lengths differ from prep's (a padded window of 3 s: the positions too),
    so only the audio check can see it."""
    kind, gen = audio_gen
    _, samples = _all(gen)
    other = "whisper:chunk_length=2,n_window=4" if kind == "chunks" else "whisper:chunk_length=3"
    c = Collator(tokenizer=tokenizer_path, vision_policy=POLICY, audio_rule=other)
    a1 = next(s for s in samples if s.meta["sample_id"] == "a1")
    with pytest.raises(ValueError, match=r"sample 'a1': this collator makes .*audio.* prep count"):
        c([a1])
    off = Collator(tokenizer=tokenizer_path, vision_policy=POLICY, audio_rule=other,
                   check_costs=False)  # fmt: skip
    assert len(off([a1])["audio_lens"]) == 1


def test_marks_and_recordings_that_disagree_are_refused(tokenizer_path):
    c = Collator(tokenizer=tokenizer_path, vision_policy=POLICY, audio_rule=RULES["padded"])
    s = SimpleNamespace(
        meta={"sample_id": "x", "turns": [["user", "<audio> and <audio>"], ["assistant", "hi"]]},
        images=[],
        audios=[_wav(1600)],
    )
    with pytest.raises(ValueError, match=r"sample 'x': 2 <audio> tokens for 1 recordings"):
        c([s])
    empty = c([])
    assert empty["audio_features"].shape == (0, 128) and empty["audio_frames"].numel() == 0
    assert empty["audio_lens"].shape == (0, 1) and empty["num_audios"].numel() == 0


def test_without_an_audio_rule_audio_is_text_and_recordings_are_refused(tokenizer_path):
    c = Collator(tokenizer=tokenizer_path, vision_policy=POLICY)
    assert c.audio is None and c.audio_token_id is None
    s = SimpleNamespace(
        meta={"sample_id": "y", "turns": [["user", "<audio> said"], ["assistant", "hi"]]},
        images=[],
        audios=[],
    )
    b = c([s])
    assert "audio_features" not in b and b["llm_lens"][0] > 1  # "<audio>" is its text
    s.audios = [_wav(1600)]
    with pytest.raises(ValueError, match="1 recording"):
        c([s])


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        ("qwen2audio", "audio_rule must be an object"),
        ({"kind": "WhisperAudioRule"}, "spec must be a non-empty string"),
        ({"spec": ""}, "spec must be a non-empty string"),
        ({"spec": "nope:x=1"}, "audio_rule.*nope"),
        ("n_window", "differing: n_window"),  # the recorded fields are not the spec's
        ("extra", "differing: hidden"),
    ],
)
def test_a_recorded_audio_rule_is_checked_where_it_enters(audio_gen, rule, error):
    import copy

    from shards import open_generation
    from shards.read.prep_settings import PrepSettings

    _, gen = audio_gen
    m = open_generation(gen)
    raw = copy.deepcopy(m.raw)
    if rule == "n_window":
        raw["prep"]["audio_rule"]["n_window"] = 7
    elif rule == "extra":
        raw["prep"]["audio_rule"]["hidden"] = 1
    else:
        raw["prep"]["audio_rule"] = rule
    fake = SimpleNamespace(path=m.path, raw=raw)
    with pytest.raises(ValueError, match=error) as exc:
        PrepSettings.from_manifest(fake).resolve_rule("audio")
    assert str(m.path) in str(exc.value) and "\n" not in str(exc.value)


def test_a_generation_without_recordings_builds_none(audio_gen):
    import copy

    from shards import open_generation
    from shards.read.prep_settings import PrepSettings

    m = open_generation(audio_gen[1])
    raw = copy.deepcopy(m.raw)
    del raw["prep"]["audio_rule"]
    assert (
        PrepSettings.from_manifest(SimpleNamespace(path=m.path, raw=raw)).resolve_rule("audio")
        is None
    )


@pytest.mark.parametrize(
    ("rate", "samples"), [(44100, 1), (44100, 2), (44100, 3), (44100, 5), (44100, 441),
                          (11025, 3), (11025, 21), (48000, 7)]
)  # fmt: skip
def test_a_recording_soxr_shortens_is_padded_to_the_length_prep_counted(rate, samples):
    """soxr gives fewer samples than ``ceil(frames * 16000 / 44100)`` for a few-sample
    recording (1 -> 0, 3 -> 1): ``load_audio`` pads them back; so must the collator."""
    from transformers.audio_utils import load_audio

    data = _wav(samples, rate=rate)
    af = AudioFeatures(rule=parse_audio_rule(RULES["padded"]))
    ref = load_audio(
        "data:audio/wav;base64," + __import__("base64").b64encode(data).decode(),
        sampling_rate=16000,
        backend="soundfile",
    )
    got = af.wave(data)
    assert len(got) == len(ref) == -(-samples * 16000 // rate)
    np.testing.assert_array_equal(got, ref)
    assert af(data).shape == (-(-len(ref) // 160), 128)


def test_an_empty_recording_has_no_frames():
    af = AudioFeatures(rule=parse_audio_rule(RULES["padded"]))
    assert af(_wav(0)).shape == (0, 128)


def test_a_short_clip_under_a_long_window_costs_its_own_length(monkeypatch):
    """The extractor pads a 1-s clip under Qwen2.5-Omni's 300-s rule to its frames and n_fft,
    not to the window (what the features equal either way: the speed is the point)."""
    af = AudioFeatures(rule=parse_audio_rule("qwen2_5_omni"))
    seen = []
    real = type(af._fe).__call__
    monkeypatch.setattr(
        type(af._fe),
        "__call__",
        lambda fe, *a, **kw: seen.append(kw["max_length"]) or real(fe, *a, **kw),
    )
    assert af(_wav(16000)).shape == (100, 128)
    assert seen == [100 * 160 + 400]
    assert af(_wav(300 * 16000 + 5)).shape == (30000, 128)  # fills the window: the window
    assert seen[-1] == 300 * 16000


@pytest.mark.filterwarnings("ignore:At least one mel filter")  # 1,024 bins of 201 frequencies
@pytest.mark.parametrize(("mel", "ok"), [(0, False), (1, True), (1024, True), (1025, False)])
def test_the_feature_maker_checks_its_mel_bins(mel, ok):
    """The documented limit, 1..1024 bins, at and past each end."""
    assert MAX_MEL == 1024
    rule = parse_audio_rule(RULES["padded"])
    if ok:
        assert AudioFeatures(rule=rule, mel=mel).mel == mel
    else:
        with pytest.raises(ValueError, match="audio mel bins"):
            AudioFeatures(rule=rule, mel=mel)


def test_the_feature_maker_is_a_frozen_keyword_config():
    rule = parse_audio_rule(RULES["padded"])
    with pytest.raises(TypeError):
        AudioFeatures(rule, 128)  # the fields by name only
    af = AudioFeatures(rule=rule)
    with pytest.raises(AttributeError):
        af.mel = 80


def test_a_recording_past_the_window_is_cut_at_it():
    af = AudioFeatures(rule=parse_audio_rule(RULES["padded"]))
    assert len(af.wave(_wav(40000))) == 32000 and len(af.wave(_wav(8000, rate=8000))) == 16000


@pytest.mark.parametrize("missing", ["transformers", "soxr"])
def test_a_missing_library_names_the_extra(monkeypatch, missing):
    import sys

    rule = parse_audio_rule(RULES["padded"])
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'equishard\[hf\]'"):
        AudioFeatures(rule=rule)(_wav(100, rate=8000))
