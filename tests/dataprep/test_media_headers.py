"""Damaged, hostile and odd media files: each measured as a decoder sees it or refused with its
reason, in bounded time (real files, encoded here).

The bugs named: a truncated or zero-length file counted as a video of frames it does not have,
an audio-only container taken for a video, a claimed 100000-px frame accepted (its cost would
overflow the table), a header-less stream scanned without end, a frame count read from the
header where the file holds fewer, audio of a rate or length no model takes.
"""

from __future__ import annotations

import io
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile

import dataprep.video_header as video_header
from dataprep.audio_header import RATES, probe_audio_bytes, probe_audio_path
from dataprep.errors import SampleRejected
from dataprep.video_header import MAX_SIDE, probe_video_bytes, probe_video_path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import make_media


def _video(path: Path, frames=12, suffix_codec="libx264", w=64, h=48, rate=24) -> Path:
    spec = make_media.VideoSpec(
        name=path.name,
        codec=suffix_codec,
        pix_fmt="yuv420p",
        width=w,
        height=h,
        fps=str(Fraction(rate)),
        frames=frames,
    )
    make_media.encode_video(spec, path)
    return path


def _decoded_frames(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


def _reason(fn, *args) -> str:
    with pytest.raises(SampleRejected) as info:
        fn(*args)
    return info.value.reason


def test_a_clean_video_is_read_from_its_header(tmp_path):
    h = probe_video_path(_video(tmp_path / "a.mp4", frames=30, rate=30))
    assert (h.frames, h.width, h.height, h.fps, h.counted) == (30, 64, 48, 30.0, False)
    assert h.duration == pytest.approx(1.0)


def test_a_matroska_stream_without_a_count_is_counted_from_packets(tmp_path):
    path = _video(tmp_path / "a.mkv", frames=37)
    h = probe_video_path(path)
    assert h.counted and h.frames == 37 == _decoded_frames(path)


def test_zero_bytes_and_garbage_are_refused(tmp_path):
    assert _reason(probe_video_bytes, b"", "x.mp4") == "empty_video"
    assert _reason(probe_video_bytes, b"not a video at all" * 50, "x.mp4") == "unreadable_video"
    assert _reason(probe_audio_bytes, b"", "x.wav") == "empty_audio"
    assert _reason(probe_audio_bytes, b"RIFF garbage" * 40, "x.wav") == "unreadable_audio"


def test_a_truncated_mp4_is_refused_and_a_truncated_mkv_counts_what_is_there(tmp_path):
    mp4 = _video(tmp_path / "a.mp4", frames=60).read_bytes()
    # the sample table (moov) is written last: cut it off, and no reader knows the frames
    assert _reason(probe_video_bytes, mp4[: len(mp4) // 2], "cut.mp4") == "unreadable_video"
    mkv = _video(tmp_path / "a.mkv", frames=60).read_bytes()
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(mkv[: len(mkv) * 2 // 3])
    h = probe_video_path(cut)
    assert 0 < h.frames < 60 and h.frames == _decoded_frames(cut)


def test_an_audio_only_container_is_not_a_video(tmp_path):
    path = tmp_path / "voice.mp4"
    with av.open(str(path), "w") as c:
        s = c.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 1024), np.float32), format="fltp", layout="mono"
        )
        frame.sample_rate = 16000
        for k in range(10):
            frame.pts = k * 1024
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    with pytest.raises(SampleRejected, match=r"no video stream .*audio") as info:
        probe_video_path(path)
    assert info.value.reason == "no_video_stream"


@pytest.mark.parametrize(("side", "reason"), [(MAX_SIDE, None), (MAX_SIDE + 2, "video_too_large")])
def test_a_claimed_frame_size_at_and_above_the_limit(tmp_path, side, reason):
    # a raw YUV4MPEG stream's header states its size: one tiny frame claiming a huge one
    header = f"YUV4MPEG2 W{side} H2 F25:1 Ip A1:1 C420jpeg\n".encode()
    data = header + b"FRAME\n" + bytes(side * 2 * 3 // 2)
    if reason is None:
        assert probe_video_bytes(data, "big.y4m").width == side
    else:
        assert _reason(probe_video_bytes, data, "big.y4m") == reason


def test_a_packet_scan_is_bounded(tmp_path, monkeypatch):
    path = _video(tmp_path / "long.mkv", frames=9000 // 100)
    monkeypatch.setattr(video_header, "MAX_SCAN_PACKETS", 10)
    monkeypatch.setattr(video_header, "_CHECK_EVERY", 8)
    with pytest.raises(SampleRejected, match="remux") as info:
        probe_video_path(path)
    assert info.value.reason == "probe_limit"


def _wav(rate=16000, frames=1600, channels=1, subtype="PCM_16") -> bytes:
    buf = io.BytesIO()
    soundfile.write(
        buf, np.zeros((frames, channels), np.float32), rate, format="WAV", subtype=subtype
    )
    return buf.getvalue()


@pytest.mark.parametrize(
    ("rate", "ok"),
    [(RATES[0] - 1, False), (RATES[0], True), (RATES[1], True), (RATES[1] + 1, False)],
)
def test_sample_rates_at_and_beyond_the_limits(rate, ok):
    if ok:
        assert probe_audio_bytes(_wav(rate=rate), "x.wav").sample_rate == rate
    else:
        assert _reason(probe_audio_bytes, _wav(rate=rate), "x.wav") == "audio_out_of_range"


def test_a_truncated_wav_counts_the_samples_it_holds(tmp_path):
    data = _wav(frames=16000)
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: len(data) // 2])
    h = probe_audio_path(cut)
    assert h.frames == len(soundfile.read(str(cut))[0]) < 16000


def test_a_wav_of_no_samples_and_an_m4a_are_refused():
    assert _reason(probe_audio_bytes, _wav(frames=0), "x.wav") == "empty_audio"
    assert _reason(probe_audio_bytes, b"\x00" * 64, "x.m4a", "m4a") == "unsupported_format"


def test_multichannel_audio_keeps_its_length():
    h = probe_audio_bytes(_wav(frames=4410, channels=6, rate=44100), "x.wav")
    assert (h.channels, h.frames, h.duration) == (6, 4410, pytest.approx(0.1))
