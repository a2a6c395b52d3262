"""Attention over packed samples: one fused kernel for a whole row where the device has one.

A packed row holds several samples back to back (``seg_lens``); each attends only inside itself.
Two ways compute the same thing:

* ``varlen``: one call of torch's flash-attention over the whole row with cumulative sequence
  offsets (``torch.nn.attention.varlen.varlen_attn``); CUDA only, half precision only.
* ``segments``: one ``scaled_dot_product_attention`` call per sample (``is_causal``), which runs
  anywhere; the fused kernels still serve each call on a GPU, at one launch per sample.

A sample cut across microbatches attends to its earlier tokens' keys and values (``prefix``): the
queries are the last ``n`` of ``p + n`` positions, so the causal mask is aligned to the lower right
(``torch.nn.attention.bias.causal_lower_right``), which the flash and memory-efficient kernels take
as they are; a boolean mask would rule the flash kernel out.

``EQUISHARD_ATTENTION`` (``auto``, ``varlen`` or ``segments``) picks the way; ``auto`` takes
varlen where it can run.

Every ``scaled_dot_product_attention`` call here (the vision encoder's batched tiles, the
segments, a cut sample's prefix) goes through ``sdpa``, which on CUDA leaves cuDNN's attention out
of torch's choice: torch 2.11 prefers it on Hopper, and each call with a shape it has not seen
builds a cuDNN graph on the host, 2.5 ms of CPU a call on an H200 (170 ms of a 0.68 s `1b` step,
with the GPU waiting; ``equishard train --profile``). The vision encoder's batch of tiles changes
every step, so the graphs are never reused. ``EQUISHARD_SDPA=torch`` gives torch the choice back.
"""

from __future__ import annotations

import inspect
import os
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["attention_backend", "packed_attention", "prefix_attention", "sdpa", "sdpa_backends"]

_BACKENDS = ("auto", "varlen", "segments")
_SDPA_CHOICES = ("fused", "torch")


def sdpa_backends(device_type: str, requested: str | None = None) -> list[SDPBackend] | None:
    """The kernels ``scaled_dot_product_attention`` may pick on ``device_type``: on CUDA flash,
    memory-efficient, then math (not cuDNN, see the module's note); None: torch's own choice
    (elsewhere, or ``EQUISHARD_SDPA=torch``)."""
    requested = requested or os.environ.get("EQUISHARD_SDPA", "fused")
    if requested not in _SDPA_CHOICES:
        raise ValueError(
            f"EQUISHARD_SDPA={requested!r} is not one of {', '.join(_SDPA_CHOICES)}; unset it "
            "(fused: flash or memory-efficient kernels, no cuDNN) or choose torch (its own pick)"
        )
    if device_type != "cuda" or requested == "torch":
        return None
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` over the kernels ``sdpa_backends`` allows."""
    backends = sdpa_backends(q.device.type)
    if backends is None:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with sdpa_kernel(backends):
        return F.scaled_dot_product_attention(q, k, v, **kw)


@lru_cache(maxsize=1)
def _varlen():
    """torch's varlen flash-attention and the keyword that asks it for a causal mask (its
    signature changed between releases: ``is_causal`` in 2.10-2.11, ``window_size`` later)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        return varlen_attn, {True: {"window_size": (-1, 0)}, False: {}}
    if "is_causal" in params:
        return varlen_attn, {True: {"is_causal": True}, False: {}}
    return None


def attention_backend(q: torch.Tensor, requested: str | None = None) -> str:
    """``varlen`` or ``segments`` for queries ``q`` [total, heads, dim]."""
    requested = requested or os.environ.get("EQUISHARD_ATTENTION", "auto")
    if requested not in _BACKENDS:
        raise ValueError(
            f"EQUISHARD_ATTENTION={requested!r} is not one of {', '.join(_BACKENDS)}; unset it "
            "or choose one"
        )
    fits = (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[-1] <= 256
        and _varlen() is not None
    )
    if requested == "varlen" and not fits:
        raise ValueError(
            "EQUISHARD_ATTENTION=varlen needs a CUDA device, fp16/bf16 queries (e.g. --precision "
            "bf16), a head size <= 256 and torch.nn.attention.varlen (torch >= 2.10); got "
            f"{q.device.type}, {q.dtype}, head size {q.shape[-1]}, torch {torch.__version__}"
        )
    return "varlen" if requested == "varlen" or (requested == "auto" and fits) else "segments"


def _cu_seqlens(seg_lens: list[int], device) -> torch.Tensor:
    """Cumulative offsets built on the host and copied without a host sync."""
    cu = torch.zeros(len(seg_lens) + 1, dtype=torch.int32)
    if seg_lens:
        cu[1:] = torch.tensor(seg_lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    return cu.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else cu


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seg_lens: list[int],
    causal: bool,
    backend: str | None = None,
) -> torch.Tensor:
    """``q``, ``k``, ``v``: [total, heads, dim] of samples packed back to back (``seg_lens``,
    summing to ``total``); each sample attends inside itself. Returns [total, heads, dim]."""
    assert sum(seg_lens) == q.shape[0], (sum(seg_lens), q.shape)
    if not seg_lens:
        return q.new_zeros(q.shape)
    if attention_backend(q, backend) == "varlen":
        fn, kw = _varlen()
        cu = _cu_seqlens(seg_lens, q.device)
        n = max(seg_lens)
        return fn(q, k, v, cu, cu, n, n, **kw[causal])
    outs = []
    for qs, ks, vs in zip(*(torch.split(t, seg_lens) for t in (q, k, v)), strict=True):
        o = sdpa(
            qs.transpose(0, 1)[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None],
            is_causal=causal,
        )  # fmt: skip
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of ``n`` queries [heads, n, dim] that are the last ``n`` of the
    ``p + n`` keys and values [heads, p + n, dim] (a sample continued from an earlier chunk):
    query ``i`` sees keys ``0 .. p + i``."""
    from torch.nn.attention.bias import causal_lower_right

    assert q.dim() == k.dim() == v.dim() == 3, (q.shape, k.shape, v.shape)
    n, m = q.shape[-2], k.shape[-2]
    # a batch dimension: every fused kernel (flash, memory-efficient, also the CPU's flash)
    # takes 4-D inputs only, and 3-D ones fall to the math kernel, which materializes the
    # n x (p + n) scores (on an H200 the pipeline's rows then ran ~4x slower)
    return sdpa(q[None], k[None], v[None], attn_mask=causal_lower_right(n, m))[0]
