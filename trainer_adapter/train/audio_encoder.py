"""A Whisper-shaped audio encoder in plain PyTorch, for the reference trainer and its benchmarks.

Log-mel frames (``[frames, mel]``, every recording's side by side) go through Whisper's stem
(a width-3 convolution, then a stride-2 one, each with GELU), fixed sine-cosine positions,
pre-norm bidirectional transformer blocks (:class:`~trainer_adapter.train.model.Block`),
stride-2 average pooling, a final norm and a projection into the LLM's width: one output token
per two positions after the stem, ``((frames - 1) // 2 + 1 - 2) // 2 + 1`` per recording
(:func:`dataprep.media_rules.whisper_audio.audio_tokens`, the processors' count). What the
blocks attend over is the encoder's kind (``n_window``):

* **unpadded** (``n_window=N``, Qwen2.5-Omni): each recording in chunks of ``2N`` frames, the
  last one shorter, each chunk its own attention sequence (packed, variable length: cost grows
  with the sum of the chunks' squares; positions restart in each chunk);
* **padded** (``n_window=0``, Qwen2-Audio, Whisper): each recording zero-padded to the window of
  ``window_frames`` and run whole (every recording costs the window: count x longest), the
  padding's keys masked as Qwen2-Audio's model masks them; only the recording's own tokens are
  kept.

Both equal transformers' towers given the same weights (``tests/trainer_adapter/
test_audio_encoder.py``: Qwen2.5-Omni's audio encoder, Qwen2-Audio's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from dataprep.media_rules.whisper_audio import audio_tokens, chunk_positions
from equishard.common.values import check_count
from trainer_adapter.train.attention import sdpa
from trainer_adapter.train.blocks import Block

__all__ = ["AudioConfig", "AudioEncoder", "sinusoids"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AudioConfig:
    """``mel`` bins in, ``hidden`` x ``layers`` blocks of ``heads``, ``out_dim`` out (the LLM's
    width); ``n_window`` half the chunk in frames (0: padded windows of ``window_frames``)."""

    mel: int = 128
    hidden: int = 32
    layers: int = 2
    heads: int = 2
    out_dim: int = 64
    n_window: int = 100
    window_frames: int = 3000
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        for name in ("mel", "hidden", "layers", "heads", "out_dim", "window_frames", "mlp_ratio"):
            check_count(name, getattr(self, name), 1, (1 << 31) - 1)
        check_count("n_window", self.n_window, 0, (1 << 30) - 1)
        if self.hidden % self.heads or self.hidden % 2:
            raise ValueError(
                f"hidden {self.hidden} must be even (a sine and a cosine per position) and a "
                f"multiple of heads {self.heads}"
            )
        if self.n_window == 0 and self.window_frames < 4:
            raise ValueError(
                f"a padded window of {self.window_frames} frames gives no token after the "
                "stem and the pooling; give window_frames >= 4 (Whisper's: 3000)"
            )

    @property
    def padded(self) -> bool:
        return self.n_window == 0


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """[length, channels] Whisper's positions: sines of ``channels // 2`` timescales spaced
    geometrically from 1 to ``max_timescale``, then their cosines."""
    half = channels // 2
    step = math.log(max_timescale) / (half - 1) if half > 1 else 0.0
    inv = torch.exp(-step * torch.arange(half, dtype=torch.float32))
    t = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([t.sin(), t.cos()], dim=1)


class AudioEncoder(nn.Module):
    """See the module doc. ``forward(frames, lengths)`` -> ``[tokens, out_dim]``."""

    def __init__(self, cfg: AudioConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.conv1 = nn.Conv1d(cfg.mel, cfg.hidden, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(cfg.hidden, cfg.hidden, kernel_size=3, stride=2, padding=1)
        self.blocks = nn.ModuleList(
            Block(cfg.hidden, cfg.heads, cfg.mlp_ratio, causal=False) for _ in range(cfg.layers)
        )
        self.norm = nn.LayerNorm(cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.out_dim)

    def sequences(self, frames: int) -> tuple[int, ...]:
        """The attention sequences (positions after the stem) one recording of ``frames`` runs:
        its chunks, or the whole window (the cost the runtime balances)."""
        if self.cfg.padded:
            return ((self.cfg.window_frames - 1) // 2 + 1,)
        return chunk_positions(frames, self.cfg.n_window)

    def _stem(self, segments: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """``[len_i, mel]`` segments, each run through the stem on its own (zero beyond its
        end, as Whisper's padded convolution sees it) -> packed ``[sum, hidden]`` positions
        with their positions added, and each segment's positions."""
        width = max(s.shape[0] for s in segments)
        dtype = self.conv1.weight.dtype
        x = torch.stack([F.pad(s, (0, 0, 0, width - s.shape[0])) for s in segments])
        lens = torch.tensor([s.shape[0] for s in segments], device=x.device)
        keep = (torch.arange(width, device=x.device)[None, :] < lens[:, None]).unsqueeze(1)
        h = F.gelu(self.conv1(x.transpose(1, 2).to(dtype))) * keep
        h = F.gelu(self.conv2(h)).transpose(1, 2)  # [segments, (width - 1) // 2 + 1, hidden]
        h = h + sinusoids(h.shape[1], h.shape[2]).to(h)[None]
        out = [(n - 1) // 2 + 1 for n in lens.tolist()]
        return torch.cat([h[i, :n] for i, n in enumerate(out)]), out

    def encode(self, frames: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """``[sum(lengths), mel]`` -> ``[tokens, hidden]``: the pooled, normed states before
        the projection, ``audio_tokens(n)`` rows per recording, recordings in order."""
        if sum(lengths) != frames.shape[0] or min(lengths, default=1) < 1:
            raise ValueError(
                f"{frames.shape[0]} frames given for recordings of {list(lengths)[:6]} frames "
                "(each >= 1, together all of them)"
            )
        if not lengths:  # no recording: every parameter stays in the (empty) graph
            zero = sum(p.reshape(-1)[:1].sum() for p in self.parameters()) * 0
            return frames.new_zeros(0, self.cfg.hidden) + zero
        recs = frames.split(list(lengths))
        if self.cfg.padded:
            states = self._padded(recs)
        else:
            chunks, owner = [], []
            for i, r in enumerate(recs):
                size = 2 * self.cfg.n_window
                parts = r.split(size)
                chunks += parts
                owner += [i] * len(parts)
            x, seg = self._stem(chunks)
            for blk in self.blocks:
                x = blk(x, seg)
            # back to recordings: each recording's chunks are consecutive
            per_rec = [0] * len(recs)
            for i, n in zip(owner, seg, strict=True):
                per_rec[i] += n
            states = list(x.split(per_rec))
        pooled = []
        for s, n in zip(states, lengths, strict=True):
            k = audio_tokens(int(n))
            pooled.append((s[0 : 2 * k : 2] + s[1 : 2 * k : 2]) / 2)
        return self.norm(torch.cat(pooled))

    def _padded(self, recs) -> list[torch.Tensor]:
        """Each recording padded to the window, run whole; the padding's keys masked."""
        cfg = self.cfg
        too_long = [r.shape[0] for r in recs if r.shape[0] > cfg.window_frames]
        if too_long:
            raise ValueError(
                f"a recording of {too_long[0]} frames is longer than the padded window of "
                f"{cfg.window_frames}; the feature extractor cuts recordings to its chunk_length"
            )
        full = [F.pad(r, (0, 0, 0, cfg.window_frames - r.shape[0])) for r in recs]
        x, seg = self._stem(full)
        n, s = len(recs), seg[0]
        y = x.view(n, s, -1)
        valid = torch.tensor([(r.shape[0] - 1) // 2 + 1 for r in recs], device=x.device)
        mask = (torch.arange(s, device=x.device)[None, :] < valid[:, None])[:, None, None, :]
        for blk in self.blocks:
            flat = y.reshape(n * s, -1)
            q, k, v = (t.view(n, s, blk.heads, -1).transpose(1, 2) for t in blk._qkv(flat))
            o = sdpa(q, k, v, attn_mask=mask).transpose(1, 2).reshape(n * s, -1)
            y = blk._post(flat, o).view(n, s, -1)
        return list(y)

    def forward(self, frames: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """``[sum(lengths), mel]`` -> ``[tokens, out_dim]`` (see :meth:`encode`)."""
        return self.proj(self.encode(frames, lengths))
