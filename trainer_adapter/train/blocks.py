"""The transformer block of the reference trainer's encoders and LLM: pre-norm, attention
inside each segment of a packed sequence (bidirectional for the encoders, causal for the LLM;
``trainer_adapter.train.attention``), with optional recomputation and the element-wise work
compiled (:func:`compile_blocks`)."""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer_adapter.train.attention import packed_attention, prefix_attention, sdpa

__all__ = ["Block", "compile_blocks"]


def _pre(block: Block, x: torch.Tensor) -> torch.Tensor:
    """A block's first norm and query/key/value projection: [total, hidden] -> [total, 3 hidden]."""
    return block.qkv(block.norm1(x))


def _post(block: Block, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """A block's output projection, residuals and MLP, around the attention's output ``o``."""
    x = x + block.proj(o)
    return x + block.mlp(block.norm2(x))


@functools.cache
def _compiled(fn):
    """``fn`` compiled once per process, shared by every block (parameters are graph inputs, so
    blocks of any width reuse the same code; token counts are symbolic, no recompile per step)."""
    return torch.compile(fn, dynamic=True)


def compile_blocks(model: nn.Module, enabled: bool = True) -> int:
    """Run the element-wise work of ``model``'s transformer blocks compiled (``torch.compile``:
    norms, bias, GELU and residual adds fused around the matrix products; attention stays the
    eager flash path, whose sample layout changes every step). Returns the blocks switched."""
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for blk in blocks:
        blk.compiled = enabled
    return len(blocks)


class Block(nn.Module):
    """Pre-norm transformer block; attention runs inside each segment of the packed sequence."""

    def __init__(self, hidden: int, heads: int, mlp_ratio: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        # recompute activations in backward (trainer_adapter.train.recompute)
        self.recompute = False
        # run the work around attention (norms, projections, MLP, residuals) compiled by
        # torch.compile (``compile_blocks``): fused element-wise kernels, and cheap activations
        # recomputed in backward instead of kept
        self.compiled = False
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, mlp_ratio * hidden), nn.GELU(), nn.Linear(mlp_ratio * hidden, hidden)
        )

    def _part(self, fn):
        return _compiled(fn) if self.compiled else fn

    def _qkv(self, x: torch.Tensor):
        """Packed ``x`` [total, hidden] -> queries, keys, values, each [total, heads, dim]."""
        n, h = x.shape
        return self._part(_pre)(self, x).view(n, 3, self.heads, h // self.heads).unbind(1)

    def _post(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The block's output from its input ``x`` [total, hidden] and the attention's output
        ``o`` [total, heads, dim]."""
        return self._part(_post)(self, x, o.reshape(o.shape[0], -1))

    def forward_chunk(self, x: torch.Tensor, seg_lens: list[int], prefix=None, keep=None):
        """Packed ``x`` [total, hidden] whose first segment may continue a sample cut in an
        earlier chunk (``prefix``: that sample's keys and values here) and whose segment number
        ``keep`` may go on in a later one; returns the output and that segment's keys and
        values (None without ``keep``)."""
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._forward_chunk, x, seg_lens, prefix, keep, use_reentrant=False)
        return self._forward_chunk(x, seg_lens, prefix, keep)

    def _forward_chunk(self, x, seg_lens, prefix, keep):
        assert self.causal, "samples are cut across chunks in causal blocks only"
        q, k, v = self._qkv(x)
        offsets = [0]
        for n in seg_lens:
            offsets.append(offsets[-1] + n)
        own = {keep} - {None} | ({0} if prefix is not None else set())
        outs, kept, run = [], None, []  # run: segments in a row that attend only inside

        def flush():
            if run:
                part = slice(offsets[run[0]], offsets[run[-1] + 1])
                outs.append(
                    packed_attention(
                        q[part], k[part], v[part], [seg_lens[j] for j in run], self.causal
                    )
                )
                run.clear()

        for i in range(len(seg_lens)):
            if i not in own:
                run.append(i)
                continue
            flush()
            part = slice(offsets[i], offsets[i + 1])
            # these very tensors feed the attention, so the carry's gradient hooks on them fire
            ki, vi = k[part].transpose(0, 1), v[part].transpose(0, 1)
            kk, vv = ki, vi
            if i == 0 and prefix is not None:  # continues a sample cut in an earlier chunk
                kk, vv = torch.cat([prefix[0], ki], 1), torch.cat([prefix[1], vi], 1)
            outs.append(prefix_attention(q[part].transpose(0, 1), kk, vv).transpose(0, 1))
            if i == keep:  # this segment goes on in a later chunk: its own keys and values
                kept = (ki, vi)
        flush()
        return self._post(x, torch.cat(outs)), kept

    def forward(self, x: torch.Tensor, seg_lens: list[int] | None = None) -> torch.Tensor:
        """``x``: [batch, len, hidden] (one segment per row), or [total, hidden] packed with
        ``seg_lens`` summing to ``total``."""
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, seg_lens, use_reentrant=False)
        return self._forward(x, seg_lens)

    def _forward(self, x: torch.Tensor, seg_lens: list[int] | None) -> torch.Tensor:
        if seg_lens is None:  # [batch, len, hidden]: attention within each row
            b, n, h = x.shape
            flat = x.reshape(b * n, h)
            q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self._qkv(flat))
            o = sdpa(q, k, v, is_causal=self.causal).transpose(1, 2).reshape(b * n, h)
            return self._post(flat, o).view(b, n, h)
        if not seg_lens:  # no tokens: every parameter stays in the (empty) graph, eagerly
            return _post(self, x, _pre(self, x)[:, : x.shape[1]])
        return self._post(x, packed_attention(*self._qkv(x), seg_lens, self.causal))
