"""Everything equishard measures on a lent GPU, as one command (``tools/gpu_check.sh OUT``).

Steps, in order of value, each in its own process with its own time limit (a hang or a crash in
one is recorded and the next one runs), within one overall budget (``--budget``, 540 s):

1. ``probe`` (the first minute): what CPU and gloo cannot show. Packed attention through the
   varlen flash kernel against the per-sample path (bf16, forward and gradients, time); which
   attention kernel serves a cut sample (lower-right causal bias vs a boolean mask); the chunked
   LM loss against the full-logits loss (value, gradients, peak memory); host syncs in a model
   step counted by ``torch.cuda.set_sync_debug_mode``; a pipeline stage with a cut sample under
   bf16 autocast against fp32, timed by the stage's clock (CUDA timing events).
2. ``hf_dp``: simulated 8-rank DP with a Qwen2-VL-2B-shaped model (random weights, bf16) on the
   real InternVL lengths: random, random + encoder-only greedy (VeOmni), random + equishard
   runtime balancing, ISF shards, ISF + runtime (``bench.bench_hf.simulate``).
3. ``train``: ``equishard train --model 1b --precision bf16`` on one GPU (varlen attention and
   the chunked loss, adaptive recomputation in 55 % of the card), then the same with the blocks
   compiled (``--compile``), compiled without recomputation, and a short compiled run profiled
   (``--profile``: its top kernels and host operators, the device's busy share, the stalling
   runtime calls; the ops table goes to the step's log).
4. ``pytest_gpu``: ``pytest -m gpu``.
5. ``pipeline``: the 1F1B stage replay (``bench.bench_gpu._pipeline``).

``--dry-run`` runs the same code paths on the CPU at tiny sizes (``make test`` does, in
``tests/test_gpu_check.py``). OUT gets ``summary.json`` (every step's result, status and
seconds), ``gpu_check.log`` and one log per step: at most seven files, as the device tool
brings back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# (step, seconds it may take on one H100)
STEPS = [("probe", 75), ("hf_dp", 170), ("train", 420), ("pytest_gpu", 150), ("pipeline", 150)]


def _device(dry: bool):
    import torch

    if dry:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run on a CPU")
    return torch.device("cuda")


def _rel(a, b) -> float:
    """Largest difference over the reference's largest magnitude."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _sync(dev) -> None:
    """The benchmark's device sync (imported here: the driver process never imports torch)."""
    from bench.bench_gpu import _sync as sync

    sync(dev)


def _attention_probe(dev, dry: bool) -> dict:
    import torch

    from bench._timing import best_time
    from trainer_adapter.train import attention as att

    lens = [30, 7, 12, 1] if dry else [1800, 700, 3100, 400, 2048, 1]
    heads, dim = (2, 8) if dry else (16, 128)
    dtype = torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (
        torch.randn(sum(lens), heads, dim, device=dev, dtype=dtype, generator=g).requires_grad_()
        for _ in range(3)
    )
    w = torch.randn(sum(lens), heads, dim, device=dev, dtype=dtype, generator=g)
    out = {"varlen_available": att._varlen() is not None}

    def run(backend):
        o = att.packed_attention(q, k, v, lens, True, backend=backend)
        grads = torch.autograd.grad((o.float() * w.float()).sum(), (q, k, v))
        return o, grads

    o_seg, g_seg = run("segments")
    out["segments_seconds"] = best_time(lambda: run("segments"), 3, dev)
    if att.attention_backend(q) == "varlen":
        o_var, g_var = run("varlen")
        out["varlen_vs_segments_rel_diff"] = {
            "out": _rel(o_var, o_seg),
            **{f"grad_{n}": _rel(a, b) for n, a, b in zip("qkv", g_var, g_seg, strict=True)},
        }
        out["varlen_seconds"] = best_time(lambda: run("varlen"), 3, dev)
    else:
        out["varlen"] = f"not run here ({dev.type}, {dtype}): the flash kernel is CUDA-only"

    # a cut sample: queries are the last n of p + n keys ([heads, tokens, dim], as a block
    # passes them; run 9 passed them batched, which a 5-D call then sent to the math kernel)
    p, n = (9, 5) if dry else (3000, 1000)
    qs = torch.randn(heads, n, dim, device=dev, dtype=dtype)
    ks = torch.randn(heads, p + n, dim, device=dev, dtype=dtype)
    mask = torch.ones(n, p + n, dtype=torch.bool, device=dev).tril(p)

    def kernels(fn) -> list[str]:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            fn()
            _sync(dev)
        names = {e.key for e in prof.key_averages()}
        return sorted(
            x
            for x in names
            if any(s in x.lower() for s in ("flash", "efficient", "fmha", "sdpa", "scaled_dot"))
        )

    out["cut_sample_kernels_lower_right_bias"] = kernels(lambda: att.prefix_attention(qs, ks, ks))
    out["cut_sample_kernels_boolean_mask"] = kernels(
        lambda: torch.nn.functional.scaled_dot_product_attention(
            qs[None], ks[None], ks[None], attn_mask=mask
        )
    )
    ref = torch.nn.functional.scaled_dot_product_attention(
        qs[None].float(), ks[None].float(), ks[None].float(), attn_mask=mask
    )[0]
    out["cut_sample_rel_diff"] = _rel(att.prefix_attention(qs, ks, ks), ref)
    return out


def _loss_probe(dev, dry: bool) -> dict:
    import torch
    from torch import nn

    from trainer_adapter.train.loss import chunk_tokens_for, chunked_lm_loss
    from trainer_adapter.train.pipeline import LMLoss

    tokens, width, vocab = (64, 32, 500) if dry else (4096, 2048, 151_646)
    torch.manual_seed(0)
    norm, head = nn.LayerNorm(width).to(dev), nn.Linear(width, vocab).to(dev)
    hidden = torch.randn(tokens, width, device=dev, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,))
    target[: tokens // 3] = -100  # image tokens and the prompt
    auto = torch.autocast(dev.type, dtype=torch.bfloat16)
    res = {}
    for name in ("full", "chunked"):
        for p in (hidden, *norm.parameters(), *head.parameters()):
            p.grad = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
        t0 = time.perf_counter()
        with auto:
            if name == "full":
                loss = LMLoss(1.0)(head(norm(hidden)), target.to(dev))
            else:
                loss = chunked_lm_loss(
                    hidden, target, lambda h: head(norm(h)), normalizer=1.0,
                    chunk_tokens=chunk_tokens_for(vocab),
                )  # fmt: skip
        loss.backward()
        _sync(dev)
        res[name] = {
            "loss": float(loss.detach()),
            "seconds": time.perf_counter() - t0,
            "grads": [hidden.grad.clone(), head.weight.grad.clone(), norm.weight.grad.clone()],
            "peak_bytes": (torch.cuda.max_memory_allocated(dev) - base)
            if dev.type == "cuda"
            else None,
        }
    return {
        "loss_full": res["full"]["loss"],
        "loss_chunked": res["chunked"]["loss"],
        "grad_rel_diff": [
            _rel(a, b) for a, b in zip(res["chunked"]["grads"], res["full"]["grads"], strict=True)
        ],
        "peak_bytes_full": res["full"]["peak_bytes"],
        "peak_bytes_chunked": res["chunked"]["peak_bytes"],
        "seconds_full": res["full"]["seconds"],
        "seconds_chunked": res["chunked"]["seconds"],
    }


def _sync_probe(dev, dry: bool) -> dict:
    """Host syncs in one model step of the trainer's PP=1 path (embed, packed blocks, chunked
    loss, backward), counted by CUDA's sync debug mode."""
    import torch

    from trainer_adapter.train.loss import chunked_lm_loss
    from trainer_adapter.train.model import VisionLanguageModel, VLMConfig, shifted_labels

    if dev.type != "cuda":
        return {"host_syncs": "not counted on the CPU"}
    cfg = VLMConfig.preset("small", vocab_size=4096, patch_dim=588)
    model = VisionLanguageModel(cfg).to(dev)
    lens = [700, 300, 1200]
    ids = torch.randint(0, 4000, (sum(lens),))
    pos = torch.cat([torch.arange(n) for n in lens])
    labels = ids.clone()
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    img = torch.zeros(0, cfg.llm_hidden, device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = model.llm.embed(
                ids.to(dev, non_blocking=True), pos.to(dev, non_blocking=True), img, 4095
            )
            h = model.llm.forward_blocks(x, lens)
            loss = chunked_lm_loss(
                h, shifted_labels(labels, cu), model.llm.logits, normalizer=1.0, chunk_tokens=512
            )
        loss.backward()

    losses = {}
    for enabled in (False, True):
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=enabled):
            x = model.llm.embed(ids.to(dev), pos.to(dev), img, 4095)
            h = model.llm.forward_blocks(x, lens)
            losses["bf16" if enabled else "fp32"] = float(
                chunked_lm_loss(
                    h,
                    shifted_labels(labels, cu),
                    model.llm.logits,
                    normalizer=1.0,
                    chunk_tokens=512,
                )
            )
    step()
    _sync(dev)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [
        str(w.message).splitlines()[0][:160]
        for w in seen
        if "synchroniz" in str(w.message) and "prototype feature" not in str(w.message)
    ]
    return {
        "host_syncs": len(syncs),
        "sync_messages": sorted(set(syncs))[:10],
        "model_loss": losses,
    }


def _stage_probe(dev, dry: bool) -> dict:
    """A pipeline stage (cut sample carried across rows) under bf16 autocast vs fp32, on this
    device, timed by the stage's clock (CUDA timing events); rows backward last to first."""
    import numpy as np
    import torch

    from trainer_adapter.train.microbatches import doc_rows, pack_rows, plan_microbatches
    from trainer_adapter.train.model import LanguageModel, VLMConfig
    from trainer_adapter.train.pipeline import StageModule

    size, lengths, rows, row = (
        ("tiny", [30, 7, 5, 12, 3], 3, 20)
        if dry
        else ("small", [3000, 700, 500, 1200, 300], 3, 2048)
    )
    lengths = np.array(lengths)
    plan = plan_microbatches(lengths, rows, row, 1, split=True)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    out = {"cut_samples": plan.n_cut, "chains": list(plan.chains)}
    grads = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        llm = LanguageModel(VLMConfig.preset(size, vocab_size=512)).to(dev)
        stage = StageModule(llm, 0, len(llm.blocks), last=False)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(int(lengths.sum()), llm.cfg.llm_hidden, generator=g).to(dev)
        packed = pack_rows(x, cu, plan, row, 0.0)
        leaf = packed.detach().requires_grad_()
        docs = doc_rows(plan, lengths, row).to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            outs = [stage(leaf[k][None], docs[k][None])[0][0] for k in range(rows)]
        for k in reversed(range(rows)):
            outs[k].float().square().mean().backward()
        _sync(dev)
        grads[precision] = torch.cat(
            [p.grad.flatten() for p in llm.parameters() if p.grad is not None]
        )
        out[f"{precision}_forward_seconds"] = stage.timer.forward
        out[f"{precision}_backward_seconds"] = stage.timer.backward
    a, b = grads["bf16"].double(), grads["fp32"].double()
    out["bf16_vs_fp32_grad_cosine"] = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    return out


def step_probe(dry: bool, work: Path) -> dict:
    import torch

    dev = _device(dry)
    out = {
        "device": torch.cuda.get_device_name()
        if dev.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    for name, fn in (
        ("attention", _attention_probe),
        ("loss", _loss_probe),
        ("host_syncs", _sync_probe),
        ("pipeline_stage", _stage_probe),
    ):
        try:
            out[name] = fn(dev, dry)
        except Exception as exc:  # one probe's failure is a finding; the others still run
            out[name] = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-2000:],
            }
        print(name, json.dumps(out[name], default=str)[:2000], flush=True)
    return out


def step_hf_dp(dry: bool, work: Path) -> dict:
    from bench import _internvl
    from bench.bench_hf import simulate

    dev = _device(dry)
    lengths = None
    if not _internvl.available():
        if not dry:
            raise SystemExit(f"the InternVL length statistics are not at {_internvl.DATA}")
        lengths = _internvl.synthetic_lengths()
    if dry:
        rows = simulate(size="tiny", device="cpu", scale=16, steps=1, lengths=lengths)
    else:
        rows = simulate(size="2b", device=dev.type, scale=1)
    return {
        "model": "tiny" if dry else "Qwen2-VL-2B shapes, bf16",
        "real_lengths": lengths is None,
        "rows": rows,
    }


def _demo(dry: bool) -> dict:
    """The demo set the training steps use: 400 samples with InternVL's tiling on the GPU; a
    few samples of one tile per image in a dry run (a CPU trains 12k-token steps for minutes)."""
    return dict(samples=48, policy="internvl:max_tiles=1,thumbnail=0") if dry else {}


# the training runs on a GPU: the default path (eager, adaptive recomputation in 55 % of the
# card), the same compiled, compiled with recomputation planned in 70 % (the best inside the
# 60 %-of-the-card target on an H200), compiled without recomputation (with and without the
# allocator's expandable segments, 20 steps so that their growth settles), and a shorter
# compiled run profiled (its ops table goes to the log)
TRAIN_VARIANTS = {
    "auto": ({}, ()),
    "auto, compiled": ({}, ("--compile",)),
    "compiled, adaptive in 70 %": ({}, ("--compile", "--memory-fraction", "0.70")),
    "compiled, no recompute": ({}, ("--compile", "--recompute", "off")),
    "compiled, no recompute, expandable segments": (
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        ("--compile", "--recompute", "off", "--steps", "20"),
    ),
    "auto, compiled, profiled": ({}, ("--compile", "--steps", "6", "--profile-steps", "3:5")),
}


def step_train(dry: bool, work: Path) -> dict:
    from bench.bench_gpu import _generation, _train

    _device(dry)
    _, _, gen = _generation(work, dp=1, target_batch=1 if dry else 4, **_demo(dry))
    kw = (
        dict(model="tiny", backend="gloo", steps=2, recompute="off")
        if dry
        else dict(model="1b", backend="nccl", steps=10)
    )
    out = {}
    partial = work / "train.partial.json"
    # the dry run takes one path, --compile and profiled (on the CPU every attention choice is
    # per-sample), with torch.compile itself off (TORCH_COMPILE_DISABLE, torch's own switch):
    # the flag's path to the blocks is what it checks; inductor's C++ build of the blocks took
    # most of the dry run's time, and the compiled blocks' equality with the eager ones is
    # tests/trainer_adapter/test_compiled_blocks.py's (test_gpu.py's on a GPU)
    dry_path = ({"TORCH_COMPILE_DISABLE": "1"}, ("--compile", "--profile-steps", "1:2"))
    variants = {"auto": dry_path} if dry else TRAIN_VARIANTS
    for name, (env_extra, args) in variants.items():
        env = {**os.environ, "EQUISHARD_ATTENTION": "auto", **env_extra}
        prof = work / f"profile-{len(out)}"
        extra = ("--memory-fraction", "0.55", *args) if not dry else args
        if "--profile-steps" in args:
            extra = (*extra, "--profile", str(prof))
        try:
            res = _train(gen, "bf16", work / f"train-{len(out)}.jsonl", env=env, extra=extra, **kw)
            if (prof / "rank0-summary.json").exists():
                res["profile"] = json.loads((prof / "rank0-summary.json").read_text())
                print((prof / "rank0-ops.txt").read_text(), flush=True)
            out[name] = res
        except Exception as exc:  # recorded; the other runs still go on
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        partial.write_text(json.dumps(out))
    if all("error" in r for r in out.values()):
        raise SystemExit("every training run failed: " + json.dumps(out)[:3000])
    out["calibration"] = _calibrate(work, len(variants))
    return out


def _calibrate(work: Path, runs: int) -> dict | None:
    """``equishard calibrate`` on the longest run's log (CUDA-event phase times of one rank):
    the fit's coefficients and its error on the held-out last quarter of the steps. None where
    no run has the points a fit needs (a dry run's two steps)."""
    logs = [work / f"train-{k}.jsonl" for k in range(runs)]
    logs = [p for p in logs if p.exists()]
    best = max(logs, key=lambda p: len(p.read_text().splitlines()), default=None)
    if best is None or len(best.read_text().splitlines()) < 16:
        return None
    r = subprocess.run(
        [sys.executable, "-m", "equishard", "calibrate", str(best), "-o",
         str(work / "calibration.json"), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if r.returncode:
        return {"log": best.name, "refused": r.stderr.strip()[-500:]}
    return {"log": best.name, **json.loads(r.stdout)}


def step_pytest_gpu(dry: bool, work: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/trainer_adapter/test_gpu.py",
    ]
    if dry:
        cmd.append("--collect-only")
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(res.stdout[-6000:], res.stderr[-3000:], flush=True)
    tail = [x for x in res.stdout.splitlines() if x.strip()][-1:] or [""]
    return {"returncode": res.returncode, "summary": tail[0]}


def step_pipeline(dry: bool, work: Path) -> dict:
    import bench.bench_gpu as bg

    dev = _device(dry)
    if dry:
        bg.PIPE_STEPS, bg.LAYOUTS, bg.LAYER_REPEATS = 1, [(2, 4)], 1
    table, plan8, _ = bg._generation(work, dp=8, target_batch=4, **_demo(dry))
    if dry:
        return {"layouts": bg._pipeline(table, plan8, dev, model="tiny", vocab=1000)}
    return {"layouts": bg._pipeline(table, plan8, dev)}


STEP_FUNCS = {
    "probe": step_probe,
    "hf_dp": step_hf_dp,
    "train": step_train,
    "pytest_gpu": step_pytest_gpu,
    "pipeline": step_pipeline,
}


def _run_one(name: str, dry: bool, out: Path, work: Path) -> int:
    result = STEP_FUNCS[name](dry, work)
    (work / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, help="folder for summary.json and the logs")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (make test)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for all steps together")
    ap.add_argument("--only", default="", help="comma-separated steps (default: all, in order)")
    ap.add_argument("--step", help=argparse.SUPPRESS)  # one step, in this process
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.step:
        return _run_one(args.step, args.dry_run, out, Path(args.work))
    names = [n for n, _ in STEPS]
    wanted = [n for n in args.only.split(",") if n] or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        ap.error(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    work = Path(tempfile.mkdtemp(prefix="equishard-gpu-check-"))
    deadline = time.monotonic() + args.budget
    summary = {
        "dry_run": args.dry_run,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "steps": {},
    }
    failed = False
    for name, limit in STEPS:
        if name not in wanted:
            continue
        left = deadline - time.monotonic()
        if left < 15:
            summary["steps"][name] = {
                "status": "skipped",
                "reason": f"budget spent ({args.budget:.0f} s)",
            }
            failed = True
            continue
        cmd = [sys.executable, __file__, "--out", str(out), "--step", name, "--work", str(work)]
        if args.dry_run:
            cmd.append("--dry-run")
        t0 = time.monotonic()
        with open(out / f"{name}.log", "w") as step_log:
            try:
                rc = subprocess.run(
                    cmd,
                    stdout=step_log,
                    stderr=subprocess.STDOUT,
                    timeout=min(limit, left) if not args.dry_run else left,
                    cwd=ROOT,
                ).returncode
                status = "ok" if rc == 0 else f"failed (exit {rc})"
            except subprocess.TimeoutExpired:
                status = f"timed out after {min(limit, left):.0f} s"
        entry = {"status": status, "seconds": round(time.monotonic() - t0, 1)}
        res = work / f"{name}.json"
        partial = work / f"{name}.partial.json"
        if res.exists():
            entry["result"] = json.loads(res.read_text())
        elif partial.exists():
            entry["partial"] = json.loads(partial.read_text())
        summary["steps"][name] = entry
        failed |= status != "ok"
        line = f"{name}: {status} in {entry['seconds']} s"
        print(line, flush=True)
        with open(out / "gpu_check.log", "a") as log:
            log.write(line + "\n")
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    summary["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
