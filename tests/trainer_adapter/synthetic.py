"""Collated batches with chosen lengths (same layout as shards.Collator's), for exact checks."""

from __future__ import annotations

import numpy as np
import torch

IMAGE_TOKEN = 7
PATCH_DIM = 12  # 3 x 2 x 2


def synthetic_batch(rank: int, n: int, seed: int = 0, big: bool = False) -> dict:
    """``n`` samples of rank ``rank``: 0-3 images of 2x2-patch units (1 token each after a 2x2
    merge), 5-60 text tokens (300-400 when ``big``). Values encode (rank, sample) so tests can
    tell where every row came from."""
    rng = np.random.default_rng([seed, rank])
    specs = []
    for _ in range(n):
        k = int(rng.integers(0, 4))
        specs.append((k, int(rng.integers(300, 400) if big else rng.integers(5, 60))))
    return batch_of(rank, specs)


def batch_of(rank: int, specs: list[tuple[int, int]]) -> dict:
    """A batch of samples given as (image units, text tokens) each."""
    ids, labels, pos, cu = [], [], [], [0]
    patches, units, num_units, vit, llm = [], [], [], [], []
    for i, (k, text) in enumerate(specs):
        tag = rank * 1000 + i
        s_ids = [IMAGE_TOKEN] * k + [100 + (tag + j) % 50 for j in range(text)]
        s_lab = [-100] * (k + 1) + s_ids[k + 1 :]
        ids += s_ids
        labels += s_lab
        pos += range(len(s_ids))
        cu.append(len(ids))
        for _ in range(k):
            patches.append(np.full((4, PATCH_DIM), float(tag), dtype=np.float32))
            units.append((2, 2))
        num_units.append(k)
        vit.append(4 * k)
        llm.append(len(s_ids))
    return {
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "labels": torch.tensor(labels, dtype=torch.long),
        "position_ids": torch.tensor(pos, dtype=torch.long),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "patches": torch.from_numpy(np.concatenate(patches))
        if patches
        else torch.zeros(0, PATCH_DIM),
        "llm_lens": torch.tensor(llm, dtype=torch.long),
        "vit_lens": torch.tensor(vit, dtype=torch.long),
        "units_hw": torch.tensor(units, dtype=torch.long).reshape(-1, 2),
        "num_units": torch.tensor(num_units, dtype=torch.long),
        "image_token_id": IMAGE_TOKEN,
        "sample_ids": [f"r{rank}-{i}" for i in range(len(specs))],
    }


def per_sample(batch: dict) -> list[dict]:
    """The batch cut into samples (token ids, labels, patch values)."""
    cu = batch["cu_seqlens"].tolist()
    vit = np.concatenate([[0], np.cumsum(batch["vit_lens"].numpy())])
    return [
        {
            "ids": batch["input_ids"][cu[i] : cu[i + 1]].tolist(),
            "labels": batch["labels"][cu[i] : cu[i + 1]].tolist(),
            "patches": batch["patches"][vit[i] : vit[i + 1]].clone(),
        }
        for i in range(len(cu) - 1)
    ]
