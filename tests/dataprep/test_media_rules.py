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
from dataprep.media_rules import OneVisionVideoRule, WhisperAudioRule, audio_tokens
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
    assert QWEN2AUDIO.samples(_header(n, rate)) == len(got)


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


@pytest.mark.parametrize("total", [1, 7, 8, 9, 31, 32, 33, 64, 65, 300])
@pytest.mark.parametrize(
    ("kw", "ref"),
    [
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
