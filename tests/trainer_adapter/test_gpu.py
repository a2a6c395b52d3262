"""On a CUDA device (skipped without one): the trainer's step over NCCL on the GPU gives the
gradient of the same step over gloo on the CPU; bf16 mixed precision stays close to it; the
model-FLOPs count's attention term matches torch's counter of the GPU attention kernels."""

from __future__ import annotations

import pytest
import torch

from tests.dist_helper import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _step(rank, world, gen, precisions):
    """One trainer step (DP1, PP1) on this process group's device, per precision: loss and
    every parameter's gradient, on the CPU."""
    from shards import open_generation, read_group
    from trainer_adapter import TrainConfig, Trainer, VLMConfig
    from trainer_adapter.train.loop import build_collator

    manifest = open_generation(gen)
    index = manifest.group_index()
    samples = []
    for key in [(0, 0), (1, 0), (2, 0)]:
        shard, g = index[key]
        samples += read_group(manifest.path, shard, g)[0]
    out = {}
    for precision in precisions:
        cfg = TrainConfig(shards=gen, dp=1, seed=3, precision=precision)
        collate = build_collator(cfg, manifest)
        mcfg = VLMConfig.preset("tiny", vocab_size=collate.vocab_size, patch_dim=588, merge=2)
        trainer = Trainer(cfg, mcfg, mb_tokens=0)
        res = trainer.forward_backward(collate(samples))
        assert res["autocast"] == (precision == "bf16"), (precision, res["autocast"])
        out[precision] = (
            res["loss"],
            str(trainer.device),
            {n: p.grad.detach().cpu() for n, p in trainer.model.named_parameters()},
        )
    return out


def test_a_gpu_step_over_nccl_equals_the_cpu_step_over_gloo(train_generation):
    cpu = run_ranks(_step, 1, str(train_generation), ["fp32"])[0]["fp32"]
    gpu = run_ranks(_step, 1, str(train_generation), ["fp32", "bf16"], backend="nccl")[0]
    loss, device, grads = gpu["fp32"]
    assert device.startswith("cuda") and cpu[1] == "cpu"
    assert loss == pytest.approx(cpu[0], rel=1e-5)
    assert grads.keys() == cpu[2].keys()
    for name, g in grads.items():
        ref = cpu[2][name]
        assert float(ref.abs().max()) > 0, f"{name}: no gradient"
        torch.testing.assert_close(g, ref, rtol=0, atol=1e-4 * float(ref.abs().max()), msg=name)
    # bf16 autocast: fp32 weights and loss, bf16 products; close to fp32, not equal
    b_loss, _, b_grads = gpu["bf16"]
    # (a random-init tiny model's loss sits near log(vocab), where bf16 may not move it by one
    # fp32 step, as seen on an H200; its gradients always move)
    assert b_loss == pytest.approx(loss, rel=2e-2)
    assert any(not torch.equal(b_grads[n], grads[n]) for n in grads), "bf16 changed nothing"
    for name, g in b_grads.items():
        ref = grads[name].flatten().double()
        cos = float(torch.nn.functional.cosine_similarity(g.flatten().double(), ref, dim=0))
        assert cos > 0.98, f"{name}: bf16 gradient cosine {cos:.4f} with fp32"


def test_attention_flops_match_torchs_count_of_the_gpu_kernels():
    """The CUDA attention kernels are known to torch's FlopCounterMode. It counts the full
    score matrix, causal or not (we count the causal half), and in the fused backward five
    products where the forward has two: the scores are recomputed there, which model FLOPs
    leave out as they leave out activation recomputation (backward = 2 x forward)."""
    from torch.utils.flop_counter import FlopCounterMode

    from trainer_adapter.train.flops import block_forward_flops
    from trainer_adapter.train.model import Block

    torch.manual_seed(0)
    lens = [64, 200, 17]
    for causal in (False, True):
        blk = Block(64, 4, 4, causal=causal).cuda()
        x = torch.randn(sum(lens), 64, device="cuda", requires_grad=True)
        with FlopCounterMode(display=False) as fc:
            blk(x, lens).sum().backward()
        attn = sum(v for op, v in fc.get_flop_counts()["Global"].items() if "scaled_dot" in str(op))
        ours = 3 * block_forward_flops(0, sum(n * n for n in lens), 64, 4, causal=causal)
        fused_backward = (1 + 2.5) / 3  # torch's count over ours, per score computed
        assert attn == pytest.approx(ours * fused_backward * (2 if causal else 1), rel=1e-9)


def test_the_vision_encoders_attention_runs_no_cudnn_kernel_and_keeps_its_values():
    """The vision blocks attend over a batch of tiles whose count changes every step; cuDNN's
    attention builds a graph on the host for each new shape (2.5 ms a call on an H200), so
    ``sdpa`` leaves it out. The bf16 output and input gradient stay those of fp32 on the CPU."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from trainer_adapter.train.model import Block

    torch.manual_seed(0)
    blk = Block(256, 4, 4, causal=False)
    x = torch.randn(3, 1024, 256, requires_grad=True)
    ref = blk(x)
    ref.square().sum().backward()
    blk_gpu = blk.cuda()
    xg = x.detach().cuda().requires_grad_()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = blk_gpu(xg)
        y.float().square().sum().backward()
        torch.cuda.synchronize()
    kernels = [e.key for e in prof.key_averages() if e.device_type == DeviceType.CUDA]
    assert any("flash" in k.lower() for k in kernels), kernels
    assert not any("cudnn" in k.lower() for k in kernels), kernels
    torch.testing.assert_close(y.float().cpu(), ref.detach(), rtol=0, atol=0.05)
    g, gref = xg.grad.cpu().flatten().double(), x.grad.flatten().double()
    assert float(torch.nn.functional.cosine_similarity(g, gref, dim=0)) > 0.99


def test_compiled_blocks_equal_the_eager_model_on_the_gpu():
    """``--compile`` on CUDA (Triton kernels): fp32 equal to rounding; bf16 autocast within
    bf16's rounding (the fused kernels keep some intermediates in fp32 that eager rounds)."""
    from tests.trainer_adapter.test_compiled_blocks import compare_compiled

    compare_compiled(torch.device("cuda"), autocast=False, rel=1e-4)
    compare_compiled(torch.device("cuda"), autocast=True, rel=3e-2)


def test_a_pipeline_stage_step_takes_no_host_sync_and_still_times_its_passes():
    """The stage's clock on CUDA: timing events on the compute stream, no synchronize per
    microbatch (CUDA's sync debug mode raises on any); the busy times are read after the step."""
    import numpy as np

    from trainer_adapter.train.model import LanguageModel, VLMConfig
    from trainer_adapter.train.pipeline import (
        StageModule,
        doc_rows,
        plan_microbatches,
        row_layouts,
    )

    dev = torch.device("cuda")
    llm = LanguageModel(VLMConfig.preset("small", vocab_size=512)).to(dev)
    stage = StageModule(llm, 0, len(llm.blocks), last=False)
    lengths = np.array([700, 300, 1200, 500])
    plan = plan_microbatches(lengths, 2, 1536, 1, split=True)
    doc = doc_rows(plan, lengths, 1536)
    hs = [
        torch.randn(1, 1536, llm.cfg.llm_hidden, device=dev, requires_grad=True) for _ in range(2)
    ]
    docs = doc.to(dev)
    stage.host_rows = row_layouts(doc)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outs = [stage(h, docs[k : k + 1])[0] for k, h in enumerate(hs)]
        for out in reversed(outs):
            out.backward(torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert stage.timer.forward > 0 and stage.timer.backward > 0
    assert len(stage.timer._forward) == 2 and len(stage.timer._backward) == 2
