"""A mixed image + audio + video cost table for the multi-phase balancing benchmark (OrchMLLM's
setting: a vision tower, an audio encoder and the LLM, each phase its own load).

* images: the real InternVL lengths (``bench._internvl``), resampled;
* audio: a LibriSpeech-like duration distribution (1 to 35 s, most 10 to 16 s) at 16 kHz, each
  recording costed by the Qwen2-Audio rule (``dataprep.media_rules``: one padded 30-second
  window of 1,500 encoder positions; the pooled frames in the LLM) or Qwen2.5-Omni's (chunks);
* videos: LLaVA-Video-like clips (10 s to 3 min, 24-30 fps, 480p to 1080p landscape and
  portrait), costed by the Qwen2.5-VL video rule (qwen-vl-utils at 2 fps), which the vision
  tower runs: the table records it so (``video_rule.tower``), and balancing folds the videos
  into the vision phase as it does for a prepped table.

Every cost comes from the product's own rules over synthetic headers, so the table is what prep
writes for such files.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from bench import _internvl
from dataprep.audio_header import AudioHeader
from dataprep.media_rules.registry import parse_audio_rule, parse_video_rule
from dataprep.video_header import VideoHeader
from equishard.contracts.cost_table import METADATA_KEY, cost_schema
from equishard.contracts.phases import AUDIO, VIDEO, VISION

MIX = {"image": 0.6, "audio": 0.25, "video": 0.15}  # shares of the samples
VIDEO_RULE = "qwen2vl:source=qwen-vl-utils,fps=2,max_pixels=151200,total_pixels=16056320"  # 360x420, 20480 x 28x28
AUDIO_RULES = {"padded": "qwen2audio", "unpadded": "qwen2_5_omni"}
SIZES = ((854, 480), (1280, 720), (1920, 1080), (720, 1280), (640, 360))


def _lists(rows: list[tuple[int, ...]]) -> pa.Array:
    return pa.array([list(r) for r in rows], pa.list_(pa.int32()))


def mixed_cost_table(n: int, *, seed: int = 0, audio: str = "padded", mix=MIX) -> pa.Table:
    """``n`` samples in the shares of ``mix``, costed as prep costs them; see the module."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(list(mix), n, p=np.array(list(mix.values())) / sum(mix.values()))
    if _internvl.available():
        tiles_all, llm_all = _internvl.load_lengths()
    else:
        tiles_all, llm_all = _internvl.synthetic_lengths(20_000, seed)
    pick = rng.integers(0, tiles_all.size, n)
    video_rule = parse_video_rule(VIDEO_RULE)
    audio_rule = parse_audio_rule(AUDIO_RULES[audio])
    cols = {k: [] for k in ("vit", "vseq", "vid", "vidseq", "aud", "audseq", "llm", "kind")}
    for i, kind in enumerate(kinds.tolist()):
        text = int(rng.integers(20, 300))
        vit, vseq, vid, vidseq, aud, audseq, llm = 0, (), 0, (), 0, (), text
        if kind == "image":
            tiles = int(tiles_all[pick[i]])
            vit, vseq, llm = tiles * 1024, (1024,) * tiles, int(llm_all[pick[i]])
        elif kind == "audio":  # LibriSpeech: 1-35 s, mostly 10-16 s
            seconds = float(np.clip(rng.gamma(9.0, 1.4), 1.0, 35.0))
            header = AudioHeader(
                nbytes=1,
                sample_rate=16000,
                frames=round(seconds * 16000),
                channels=1,
                format="FLAC",
            )
            cost = audio_rule.cost(header)
            aud, audseq, llm = cost.tokens, cost.seq_lens, text + cost.llm_tokens
        else:  # LLaVA-Video: 10 s - 3 min
            seconds = float(rng.uniform(10.0, 180.0))
            fps = float(rng.choice([24.0, 25.0, 30.0]))
            w, h = SIZES[int(rng.integers(0, len(SIZES)))]
            header = VideoHeader(
                nbytes=1,
                width=w,
                height=h,
                frames=round(seconds * fps),
                fps=fps,
                duration=seconds,
                codec="h264",
                container="mp4",
            )
            cost = video_rule.cost(header)
            vid, vidseq, llm = cost.tokens, cost.seq_lens, text + cost.llm_tokens
        for key, val in zip(cols, (vit, vseq, vid, vidseq, aud, audseq, llm, kind), strict=True):
            cols[key].append(val)
    empty = pa.array([[]] * n, pa.list_(pa.int32()))
    data = {
        "sample_id": pa.array([f"{k}-{i}" for i, k in enumerate(cols["kind"])]),
        "source": pa.array(cols["kind"]),
        "num_images": pa.array([len(s) for s in cols["vseq"]], pa.int32()),
        "vit_tokens": pa.array(cols["vit"], pa.int64()),
        "vit_seq_lens": _lists(cols["vseq"]),
        "llm_tokens": pa.array(cols["llm"], pa.int64()),
        "text_tokens": pa.array(cols["llm"], pa.int64()),
        "modality": pa.array(cols["kind"]),
        "image_widths": empty,
        "image_heights": empty,
        "location": pa.array([""] * n),
        "fingerprint": pa.array([""] * n),
        "cache_key": pa.array([""] * n),
        "num_videos": pa.array([int(s != ()) for s in cols["vidseq"]], pa.int32()),
        "video_tokens": pa.array(cols["vid"], pa.int64()),
        "video_seq_lens": _lists(cols["vidseq"]),
        "num_audios": pa.array([int(s != ()) for s in cols["audseq"]], pa.int32()),
        "audio_tokens": pa.array(cols["aud"], pa.int64()),
        "audio_seq_lens": _lists(cols["audseq"]),
    }
    schema = cost_schema((VISION, VIDEO, AUDIO))
    table = pa.table({f.name: data[f.name] for f in schema}).cast(schema)
    meta = {
        "phases": ["vision", "video", "audio", "llm"],
        "video_rule": video_rule.describe(),
        "audio_rule": audio_rule.describe(),
    }
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(meta)})
