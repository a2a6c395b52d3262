"""The real InternVL length statistics (``bench/data/internvl_lengths``: the per-sample lengths of
two InternVL-Chat SFT subsets published with the OmniBal paper's code, Apache-2.0) as a cost
table."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa

# in the repository (gzipped JSON lists); $EQUISHARD_INTERNVL_LENGTHS names another copy
DATA = Path(
    os.environ.get("EQUISHARD_INTERNVL_LENGTHS")
    or Path(__file__).resolve().parent / "data" / "internvl_lengths"
)
FILES = ("ai2d_train_12k_wh_token_lengths.json.gz", "chartqa_train_18k_wh_token_lengths.json.gz")


def available() -> bool:
    return all((DATA / name).is_file() for name in FILES)


def synthetic_lengths(n: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Stand-in lengths of the same shape (1-12 tiles, 256 LLM tokens each plus text) for dry
    runs on machines without the statistics; never used for a reported figure."""
    rng = np.random.default_rng(seed)
    tiles = np.minimum(12, 1 + rng.poisson(3.0, n))
    return tiles, tiles * 256 + rng.integers(20, 400, n)


def read_entries(path: Path) -> list[dict]:
    """One subset's entries (``vit_num``, ``token_num``, ``image_flags`` per sample)."""
    return json.loads(gzip.decompress(path.read_bytes()))


def load_lengths() -> tuple[np.ndarray, np.ndarray]:
    """(tiles, llm_tokens) per sample: one tile = 1024 encoder patches and 256 LLM tokens."""
    rows = []
    for name in FILES:
        rows += read_entries(DATA / name)
    return np.array([r["vit_num"] for r in rows]), np.array([r["token_num"] for r in rows])


def cost_table(tiles: np.ndarray, llm: np.ndarray) -> pa.Table:
    n = tiles.size
    offsets = np.concatenate([[0], np.cumsum(tiles)]).astype(np.int32)
    seq = pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(np.full(offsets[-1], 1024, np.int32))
    )
    empty = pa.array([[]] * n, pa.list_(pa.int32()))
    return pa.table(
        {
            "sample_id": pa.array(np.arange(n)).cast(pa.string()),
            "source": pa.array(["internvl"] * n),
            "num_images": pa.array(tiles.astype(np.int32)),
            "vit_tokens": pa.array((tiles * 1024).astype(np.int64)),
            "vit_seq_lens": seq,
            "llm_tokens": pa.array(llm.astype(np.int64)),
            "text_tokens": pa.array((llm - 256 * tiles).astype(np.int64)),
            "modality": pa.array(["image"] * n),
            "image_widths": empty,
            "image_heights": empty,
            "location": pa.array([""] * n),
            "fingerprint": pa.array([""] * n),
        }
    )


def resampled(n: int, seed: int = 0) -> pa.Table:
    tiles, llm = load_lengths()
    idx = np.random.default_rng(seed).integers(0, tiles.size, n)
    return cost_table(tiles[idx], llm[idx])
