"""What a Hugging Face processor really produces for one image: the public anchor of the
policies' counts (never a processor's private helpers, whose meaning changes between
releases: ``PixtralProcessor._get_num_multimodal_tokens`` stopped counting the row breaks
and the end token in transformers 5.25 while the processor's output stayed the same)."""

from __future__ import annotations

import random

import numpy as np


def image_tokens(proc, prompt: str, token_id: int, w: int, h: int):
    """(how many ``token_id`` the processor writes for ``prompt`` with one blank ``w`` x ``h``
    RGB image, its whole output); a ``ValueError`` of the processor (an image it refuses)
    propagates."""
    from PIL import Image

    out = proc(text=[prompt], images=[Image.new("RGB", (w, h))], return_tensors="np")
    return int(np.count_nonzero(out["input_ids"][0] == token_id)), out


def sizes(seed: int, *, regular: int, side: int, thin: int, long_side: int, big=()):
    """Image sizes (w, h) to hold a policy against its processor: ``regular`` drawn up to
    ``side`` a side, ``thin`` with one side of 1-60 px and the other up to ``long_side`` (either
    way round), the sizes in ``big``, and squares and near-squares of a tile's common sides."""
    rng = random.Random(seed)
    out = [(rng.randint(1, side), rng.randint(1, side)) for _ in range(regular)]
    for _ in range(thin):
        a, b = rng.randint(1, 60), rng.randint(1, long_side)
        out.append((a, b) if rng.random() < 0.5 else (b, a))
    out += [(n, n) for n in (1, 2, 3, 14, 336, 384, 448)]
    out += [(n, n + 1) for n in (335, 383)] + [(n + 1, n) for n in (335, 383)]
    return out + list(big)
