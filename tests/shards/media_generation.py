"""A tiny real generation with recordings, and with videos: WAV files of several rates, channel
counts and lengths (one past the rule's window, one of a single feature frame), images beside
some and two recordings in one sample; with a video rule, H.264 clips whose every frame is
painted with its own index (so a test can tell which frames reached the encoder) in samples
alone, beside a recording, and after an image in a second turn. Prepped with the rules, balanced
and written.

Its rules have a 2-s window, so that a recording past the window, at it and below it costs
a CPU milliseconds: ``padded`` (Qwen2-Audio's kind, the whole window run) and ``chunks``
(Qwen2.5-Omni's kind, chunks of 6 frames).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile

from tests.conftest import image_bytes

RULES = {
    "padded": "whisper:chunk_length=2,n_window=0",
    "chunks": "whisper:chunk_length=2,n_window=3",
}
# (file, rate, channels, seconds): one per kind of resampling, one past the 2-s window, one
# of 160 samples at 16 kHz (a single feature frame, no LLM token)
RECORDINGS = [
    ("a16k.wav", 16000, 1, 0.73),
    ("a44k.wav", 44100, 2, 1.37),
    ("a8k.wav", 8000, 1, 2.6),
    ("a22k.wav", 22050, 1, 0.9),
    ("tiny.wav", 16000, 1, 0.01),
]
POLICY = "qwen2vl:min_pixels=3136,max_pixels=12544"  # 4 to 16 patches of 28 px: a CPU's size
# InternVL's videos: frames as 56-px tiles of 14-px patches (16 patches, 4 tokens a tile)
VIDEO_POLICY = "internvl:max_tiles=4,tile_size=56"
VIDEO_RULE = "internvl:num_frames=4,tile_size=56"
# (file, frames, width, height, fps): fewer frames than the rule samples (repeated), more
VIDEOS = [("v5.mp4", 3, 96, 64, 8), ("v19.mp4", 19, 64, 64, 10)]


def frame_level(k: int) -> int:
    """The grey level frame ``k`` of a clip is painted with (30 apart: H.264 keeps them)."""
    return 20 + 30 * (k % 8)


def write_videos(data: Path) -> None:
    import av

    for name, frames, w, h, fps in VIDEOS:
        with av.open(str(data / name), "w") as out:
            s = out.add_stream("libx264", rate=fps)
            s.width, s.height, s.pix_fmt = w, h, "yuv420p"
            s.options = {"crf": "10"}
            for k in range(frames):
                img = np.full((h, w, 3), frame_level(k), np.uint8)
                for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                    out.mux(p)
            for p in s.encode():
                out.mux(p)


def _conv(q: str, a: str = "It says hello.") -> list[dict]:
    return [{"from": "human", "value": q}, {"from": "gpt", "value": a}]


def write_recordings(data: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for name, rate, ch, secs in RECORDINGS:
        n = round(rate * secs)
        t = np.arange(n) / rate
        wave = 0.3 * np.sin(2 * np.pi * 440 * t)[:, None] + 0.05 * rng.standard_normal((n, ch))
        soundfile.write(data / name, wave.astype(np.float32), rate)


def video_records() -> list[dict]:
    return [
        {"id": "v0", "video": "v5.mp4", "conversations": _conv("<video>\nWhat moves?")},
        {
            "id": "va",
            "video": "v19.mp4",
            "audio": "a16k.wav",
            "conversations": _conv("<video> and <audio>: do they match?", "They do."),
        },
        {
            "id": "turns",
            "image": "i2.png",
            "video": "v19.mp4",
            "conversations": [
                {"from": "human", "value": "<image>\nWhat colour?"},
                {"from": "gpt", "value": "Blue, all of it."},
                {"from": "human", "value": "And here? <video>"},
                {"from": "gpt", "value": "Grey frames."},
            ],
        },
    ]


def records() -> list[dict]:
    out = [
        {"id": f"a{k}", "audio": name, "conversations": _conv("<audio>\nWhat is said?")}
        for k, (name, *_) in enumerate(RECORDINGS)
    ]
    out += [
        {
            "id": "both",
            "image": "i1.png",
            "audio": "a44k.wav",
            "conversations": _conv("<image>\nand <audio>\nDescribe both.", "A tone on blue."),
        },
        {
            "id": "two",
            "audios": ["a22k.wav", "a16k.wav"],
            "conversations": _conv("First <audio>, then <audio>: which is longer?", "The first."),
        },
    ]
    out += [
        {"id": f"i{k}", "image": f"i{k}.png", "conversations": _conv("<image>\nWhat colour?")}
        for k in range(4)
    ]
    out += [{"id": f"t{k}", "conversations": _conv(f"Count to {k + 2}.")} for k in range(4)]
    return out


def build_audio_generation(
    root: Path, rule: str, tokenizer: str, dp: int = 2, video_rule: str | None = None
) -> Path:
    """Data, cost table, plan and generation under ``root``; returns the generation. With
    ``video_rule`` (InternVL's), the clips too, under the InternVL policy."""
    import json

    from balancing.plan import BalanceConfig, build_plan, write_plan
    from dataprep import PrepConfig, read_cost_table, run_prep
    from shards.write.writer import WriteConfig, write_generation

    data = root / "data"
    data.mkdir(parents=True)
    write_recordings(data)
    if video_rule:
        write_videos(data)
    for k, (w, h) in enumerate([(64, 48), (90, 120), (200, 60), (56, 56)]):
        (data / f"i{k}.png").write_bytes(image_bytes(w, h, "PNG"))
    jsonl = data / "d.jsonl"
    recs = records() + (video_records() if video_rule else [])
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in recs))
    cost = root / "cost.parquet"
    res = run_prep(
        PrepConfig(
            inputs=(str(jsonl),),
            output=str(cost),
            tokenizer=tokenizer,
            image_root=str(data),
            vision_policy=VIDEO_POLICY if video_rule else POLICY,
            audio_rule=rule,
            video_rule=video_rule,
        )
    )
    assert res.n_rejected == 0, res
    plan = build_plan(read_cost_table(cost), BalanceConfig(dp=dp, nodes=1, seed=0, target_batch=3))
    write_plan(plan, root / "plan")
    write_generation(
        WriteConfig(plan_dir=str(root / "plan"), cost_table=str(cost), out=str(root / "gen"))
    )
    return root / "gen"
