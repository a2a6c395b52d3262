"""Attention over packed samples (``trainer_adapter.train.attention``) against a float64 reference
written as an explicit softmax over a block-diagonal (causal) mask of the whole row.

The ``varlen`` path runs torch's flash kernel, which exists on CUDA only: here a reference
kernel with each torch release's signature stands in for it, so the offsets, the lengths and the
causal keyword the module passes are checked on the CPU; the kernel itself is compared with the
per-sample path on the GPU by ``tools/gpu_check.py``.

Planted bugs this catches: samples attending across their boundary, the causal mask off or
aligned to the upper left for a continued sample (its queries are the last ``n`` of ``p + n``
keys), a continued sample's attention that no fused kernel can serve (3-D inputs: the math
kernel then materializes its scores, ~4x slower pipeline rows on an H200), cumulative
offsets off by one sample, the causal keyword not passed on either torch signature, and
``auto`` choosing the CUDA-only kernel on the CPU."""

from __future__ import annotations

import inspect

import pytest
import torch

from trainer_adapter.train import attention as att


def _reference(q, k, v, seg_lens, causal):
    """[total, heads, dim] -> [total, heads, dim], float64, one softmax over the whole row."""
    doc = torch.repeat_interleave(torch.arange(len(seg_lens)), torch.tensor(seg_lens))
    pos = torch.arange(doc.numel())
    allowed = doc[:, None] == doc[None, :]
    if causal:
        allowed &= pos[:, None] >= pos[None, :]
    qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k, v))
    s = qd @ kd.transpose(1, 2) / q.shape[-1] ** 0.5
    s = s.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(s, -1) @ vd).transpose(0, 1)


def _qkv(seed, total, heads=3, dim=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(total, heads, dim, generator=g, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seg_lens", [[5], [1, 1, 1], [7, 1, 12, 3], [30, 2]])
def test_segments_equal_the_whole_row_reference_forward_and_backward(seg_lens, causal):
    q, k, v = _qkv(sum(seg_lens), sum(seg_lens))
    got = att.packed_attention(q, k, v, seg_lens, causal, backend="segments")
    ref = _reference(q, k, v, seg_lens, causal)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)
    w = torch.randn(got.shape, dtype=torch.float64)
    g1 = torch.autograd.grad((got.double() * w).sum(), (q, k, v))
    g2 = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p,n", [(0, 6), (5, 1), (9, 4), (3, 11)])
def test_a_continued_sample_sees_its_earlier_tokens_causally_through_a_fused_kernel(p, n):
    """Queries are the last n of p + n positions of one sample: the reference is the whole
    sample's causal attention, of which the last n rows are taken. Only the flash kernel is
    allowed (the CPU has one; like CUDA's it takes 4-D inputs only): a call that only the math
    kernel can serve, which materializes the n x (p + n) scores, fails here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv(p + n, p + n)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        got = att.prefix_attention(
            *(t[p:].transpose(0, 1) if t is q else t.transpose(0, 1) for t in (q, k, v))
        )
        w = torch.randn(got.shape, dtype=torch.float64)
        grads = torch.autograd.grad((got.double() * w).sum(), (q, k, v))
    ref = _reference(q, k, v, [p + n], True)[p:]
    torch.testing.assert_close(got.transpose(0, 1).double(), ref, rtol=1e-5, atol=1e-6)
    want = torch.autograd.grad((ref.transpose(0, 1) * w).sum(), (q, k, v))
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-5)


def _fake_varlen(style: str, calls: list):
    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, causal):
        calls.append((cu_q.tolist(), max_q, causal))
        assert cu_q is cu_k or torch.equal(cu_q, cu_k)
        assert cu_q.dtype == torch.int32
        lens = (cu_q[1:] - cu_q[:-1]).tolist()
        assert max_q == max_k == max(lens)
        return _reference(q, k, v, lens, causal).to(q.dtype)

    if style == "window_size":  # torch >= 2.12

        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
                        scale=None, window_size=(-1, -1)):  # fmt: skip
            assert window_size in ((-1, -1), (-1, 0))
            return kernel(
                query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size == (-1, 0)
            )

    else:  # torch 2.10 / 2.11

        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False,
                        return_aux=None):  # fmt: skip
            return kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal)

    return varlen_attn


@pytest.mark.parametrize("style", ["window_size", "is_causal"])
@pytest.mark.parametrize("causal", [True, False])
def test_the_varlen_call_passes_offsets_lengths_and_causality_on_either_signature(
    monkeypatch, style, causal
):
    from torch.nn.attention import varlen

    calls: list = []
    monkeypatch.setattr(varlen, "varlen_attn", _fake_varlen(style, calls))
    att._varlen.cache_clear()
    monkeypatch.setattr(att, "attention_backend", lambda q, requested=None: "varlen")
    try:
        seg_lens = [4, 1, 9, 2]
        q, k, v = _qkv(3, sum(seg_lens))
        got = att.packed_attention(q, k, v, seg_lens, causal)
        assert calls == [([0, 4, 5, 14, 16], 9, causal)]
        torch.testing.assert_close(got.double(), _reference(q, k, v, seg_lens, causal))
        assert list(inspect.signature(varlen.varlen_attn).parameters)[:3] == [
            "query",
            "key",
            "value",
        ]
    finally:
        att._varlen.cache_clear()


def test_auto_runs_the_per_sample_path_on_the_cpu_and_refusals_name_the_cause(monkeypatch):
    q = torch.zeros(4, 2, 8)
    assert att.attention_backend(q) == "segments"
    assert att.attention_backend(q.bfloat16(), "auto") == "segments"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        att.attention_backend(q.bfloat16(), "varlen")
    monkeypatch.setenv("EQUISHARD_ATTENTION", "flash3")
    with pytest.raises(ValueError, match="EQUISHARD_ATTENTION='flash3'"):
        att.attention_backend(q)
    monkeypatch.setenv("EQUISHARD_ATTENTION", "segments")
    assert att.attention_backend(q) == "segments"


def test_sdpa_leaves_cudnn_out_on_cuda_and_changes_nothing_elsewhere(monkeypatch):
    """cuDNN's attention builds a graph on the host per new shape (2.5 ms a call on an H200,
    the vision tiles' batch changes every step): on CUDA ``sdpa`` allows flash, memory-efficient
    and math only, unless EQUISHARD_SDPA=torch; elsewhere torch chooses as before."""
    from torch.nn.attention import SDPBackend

    from trainer_adapter.train.attention import sdpa, sdpa_backends

    monkeypatch.delenv("EQUISHARD_SDPA", raising=False)
    allowed = sdpa_backends("cuda")
    assert allowed[0] == SDPBackend.FLASH_ATTENTION and SDPBackend.CUDNN_ATTENTION not in allowed
    assert SDPBackend.EFFICIENT_ATTENTION in allowed and SDPBackend.MATH in allowed
    assert sdpa_backends("cpu") is None and sdpa_backends("cuda", "torch") is None
    monkeypatch.setenv("EQUISHARD_SDPA", "torch")
    assert sdpa_backends("cuda") is None
    monkeypatch.setenv("EQUISHARD_SDPA", "cudnn")
    with pytest.raises(ValueError, match="EQUISHARD_SDPA='cudnn' is not one of fused, torch"):
        sdpa_backends("cuda")
    monkeypatch.delenv("EQUISHARD_SDPA")
    q, k, v = (torch.randn(2, 4, 33, 16) for _ in range(3))
    for causal in (False, True):
        torch.testing.assert_close(
            sdpa(q, k, v, is_causal=causal),
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
            rtol=0,
            atol=0,
        )
