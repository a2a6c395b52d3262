"""``compile_blocks`` (``equishard train --compile``): the blocks' work around attention compiled
by torch.compile gives the eager model's outputs and gradients, on every path a block runs: the
vision encoder's batched rows, packed causal samples, a sample cut across two chunks (the later
chunk attending to the kept keys and values of the earlier), a block recomputed in backward,
and shapes that change from call to call. Reference: the same model run eagerly (whose paths are
anchored to per-sample and per-unit references in test_model.py and test_split_samples.py).
On a GPU, test_gpu.py runs the same comparison in bf16."""

from __future__ import annotations

import copy

import pytest
import torch

from trainer_adapter.train.model import VisionLanguageModel, VLMConfig, compile_blocks


def _run(model, seed: int, tokens: int, device, autocast: bool):
    """Image embeddings of units of two grid shapes, packed LLM samples, a sample cut across
    two chunks of block 0; a weighted sum of every output, and its gradients."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.cfg
    hw = torch.tensor([[4, 4], [2, 6], [4, 4]])
    patches = torch.randn(int(hw.prod(1).sum()), cfg.patch_dim, generator=g).to(device)
    x = torch.randn(tokens, cfg.llm_hidden, generator=g).to(device).requires_grad_()
    segs = [tokens // 3, tokens // 2, tokens - tokens // 3 - tokens // 2]
    cut = segs[0] + segs[1] // 2  # the second sample goes on in the next chunk
    blk = model.llm.blocks[0]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        emb = model.encode_images(patches, hw)
        h = model.llm.forward_blocks(x, segs)
        first, kept = blk.forward_chunk(x[:cut], [segs[0], cut - segs[0]], keep=1)
        rest, _ = blk.forward_chunk(
            x[cut:], [segs[0] + segs[1] - cut, segs[2]], prefix=kept, keep=None
        )
    outs = [emb, h, first, rest]
    w = [torch.randn(o.shape, generator=g).to(device) for o in outs]
    loss = sum((o.float() * wi).sum() for o, wi in zip(outs, w, strict=True))
    params = [p for _, p in sorted(model.named_parameters())]
    grads = torch.autograd.grad(loss, [x, *params], allow_unused=True)
    return [o.detach().float() for o in outs], [
        torch.zeros_like(p) if gr is None else gr for gr, p in zip(grads, [x, *params], strict=True)
    ]


def compare_compiled(device, autocast: bool, rel: float) -> None:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    cfg = VLMConfig.preset("tiny", vocab_size=300, patch_dim=48, merge=2)
    eager = VisionLanguageModel(cfg).to(device)
    compiled = copy.deepcopy(eager)
    assert compile_blocks(compiled) == cfg.vit_layers + cfg.llm_layers
    for m in (eager, compiled):  # one recomputed block in each tower
        m.vision.blocks[1].recompute = m.llm.blocks[2].recompute = True
    before = counters["stats"]["unique_graphs"]
    for seed, tokens in ((0, 40), (1, 67), (2, 52)):  # token counts change: no per-shape code
        want, want_g = _run(eager, seed, tokens, device, autocast)
        got, got_g = _run(compiled, seed, tokens, device, autocast)
        for a, b in zip([*got, *got_g], [*want, *want_g], strict=True):
            scale = float(b.abs().max().clamp_min(1e-6))
            torch.testing.assert_close(a, b, rtol=0, atol=rel * scale)
    assert counters["stats"]["unique_graphs"] > before, "nothing was compiled"


# make test-slow (CI): inductor's C++ build, 25-45 s of CPU; test_gpu.py runs the comparison in
# bf16 on a GPU
@pytest.mark.slow
def test_compiled_blocks_equal_the_eager_model_in_fp32():
    compare_compiled(torch.device("cpu"), autocast=False, rel=1e-5)


def test_compile_blocks_switches_exactly_the_transformer_blocks_and_back():
    cfg = VLMConfig.preset("tiny", vocab_size=300, patch_dim=48, merge=2)
    model = VisionLanguageModel(cfg)
    assert compile_blocks(model) == cfg.vit_layers + cfg.llm_layers
    assert all(b.compiled for b in [*model.vision.blocks, *model.llm.blocks])
    assert compile_blocks(model, enabled=False) == cfg.vit_layers + cfg.llm_layers
    assert not any(b.compiled for b in [*model.vision.blocks, *model.llm.blocks])
