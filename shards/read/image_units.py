"""An image as the encoder sequences of equishard's own vision encoder: cut per the vision
policy (InternVL tiles + thumbnail, a fixed square, or Qwen2-VL's smart resize) into row-major
patch vectors (3 x patch x patch values each, CLIP-normalized; with ``raw`` the uint8 pixels,
a quarter of the bytes to move between ranks, normalized on the device by
:func:`normalize_patches`). A video's frames are tiled the same way
(:mod:`shards.read.video_frames`)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from dataprep.policies import FixedPolicy, InternVLPolicy, Qwen2VLPolicy, internvl_grid

__all__ = ["image_units", "normalize_patches", "patches"]

_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def patches(
    img: Image.Image, size: tuple[int, int], p: int, raw: bool
) -> tuple[np.ndarray, tuple[int, int]]:
    """Resize to (width, height) and cut into row-major p x p patches -> ([n, 3*p*p], (rows, cols));
    ``raw``: the uint8 pixels, else CLIP-normalized float32."""
    a = np.asarray(img.resize(size, Image.Resampling.BICUBIC))
    if not raw:
        a = (a.astype(np.float32) / 255.0 - _MEAN) / _STD
    h, w = size[1] // p, size[0] // p
    return a.reshape(h, p, w, p, 3).transpose(0, 2, 1, 3, 4).reshape(h * w, p * p * 3), (h, w)


def normalize_patches(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 patch rows ([n, p*p*3], channels last, as ``pixels="uint8"`` collates them) ->
    CLIP-normalized rows in ``dtype``, computed where ``x`` is (float32, then cast); float rows
    (already normalized) are only cast."""
    if x.dtype != torch.uint8:
        return x.to(dtype)
    mean = torch.as_tensor(_MEAN, device=x.device)
    std = torch.as_tensor(_STD, device=x.device)
    y = (x.view(x.shape[0], x.shape[1] // 3, 3).to(torch.float32) / 255.0 - mean) / std
    return y.view(x.shape).to(dtype)


def image_units(pol, img: Image.Image, raw: bool) -> list[tuple[np.ndarray, tuple[int, int]]]:
    """Encoder sequences (patch vectors, patch grid) of one image under the policy ``pol``."""
    w, h = img.size
    if isinstance(pol, FixedPolicy):
        return [patches(img, (pol.image_size, pol.image_size), pol.patch_size, raw)]
    if isinstance(pol, InternVLPolicy):
        cols, rows = internvl_grid(w, h, pol.min_tiles, pol.max_tiles, pol.tile_size)
        s = pol.tile_size
        big = img.resize((cols * s, rows * s), Image.Resampling.BICUBIC)
        tiles = [
            big.crop((c * s, r * s, (c + 1) * s, (r + 1) * s))
            for r in range(rows)
            for c in range(cols)
        ]
        if pol.thumbnail and len(tiles) != 1:
            tiles.append(img)
        return [patches(t, (s, s), pol.patch_size, raw) for t in tiles]
    assert isinstance(pol, Qwen2VLPolicy)
    hh, ww = pol.resized(w, h)
    return [patches(img, (ww, hh), pol.patch_size, raw)]
