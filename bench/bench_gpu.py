"""Training on a GPU (CUDA only; without one the section says nothing was measured).

1. ``equishard train`` on one GPU (NCCL, DP 1), the ``1b`` VLM with adaptive recomputation, in
   fp32 and in bf16 mixed precision, on a demo generation planned for one rank (4 samples per
   step): step time, tokens/s, model TFLOP/s and MFU (``trainer_adapter.train.flops``: model FLOPs of
   the real tokens over the GPU's dense peak), peak memory, what recomputation chose.
2. The pipeline with one GPU: a PP-stage pipeline needs a GPU per stage, so each stage of the
   ``1b`` LLM (partitioned by the trainer's OmniBal search over layer times measured here) runs
   its real microbatch rows (the trainer's plans of a DP-8 demo plan: samples cut across rows,
   attention carried) forward and backward on this GPU in bf16, each pass timed after a
   synchronize, and the 1F1B order over the step's chains is replayed with those times
   (point-to-point transfers taken as free): step time, tokens/s, MFU, bubble per stage, padding,
   and the peak memory of each stage (weights, gradients and AdamW state in fp32, plus the
   activations of the most rows the order holds at once, measured per row).
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
# dense matrix peak (FLOP/s) by precision: datasheets of the SXM parts; fp32 without TF32
PEAKS = {
    "H100": {"bf16": 989e12, "fp32": 67e12},
    "H200": {"bf16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp32": 19.5e12},
}
STEPS, TRAIN_BATCH = 10, 4
LAYOUTS = [(2, 4), (4, 8)]  # (pp, microbatches), 1F1B
PIPE_STEPS = 4
LAYER_REPEATS = 3  # timed calls of each layer (after a warm-up) for the stage partition


def _peak(precision: str) -> float | None:
    name = torch.cuda.get_device_name()
    return next((p[precision] for k, p in PEAKS.items() if k in name), None)


def _generation(
    root: Path, dp: int, target_batch: int, samples: int = 400, policy: str = "internvl"
):
    from balancing.plan import BalanceConfig, build_plan, write_plan
    from dataprep import PrepConfig, make_demo, read_cost_table, run_prep
    from shards.write.writer import WriteConfig, write_generation

    raw = root / "raw"
    if not (root / "cost.parquet").exists():
        make_demo(raw, samples=samples, seed=0)
        run_prep(
            PrepConfig(
                inputs=(str(raw / "demo.jsonl"),),
                output=str(root / "cost.parquet"),
                tokenizer=str(raw / "tokenizer.json"),
                image_root=str(raw),
                vision_policy=policy,
            )
        )
    table = read_cost_table(root / "cost.parquet")
    plan = build_plan(table, BalanceConfig(dp=dp, target_batch=target_batch, seed=0))
    out = root / f"gen-dp{dp}"
    write_plan(plan, root / f"plan-dp{dp}")
    write_generation(
        WriteConfig(
            plan_dir=str(root / f"plan-dp{dp}"), cost_table=str(root / "cost.parquet"), out=str(out)
        )
    )
    return table, plan.plan, out


def _train(
    gen: Path,
    precision: str,
    log: Path,
    *,
    model: str = "1b",
    backend: str = "nccl",
    steps: int = STEPS,
    recompute: str = "adaptive",
    extra: tuple[str, ...] = (),
    env: dict | None = None,
) -> dict:
    cmd = [
        sys.executable, "-m", "equishard", "train", "--shards", str(gen), "--nproc", "1",
        "--dp", "1", "--steps", str(steps), "--model", model, "--recompute", recompute,
        "--backend", backend, "--precision", precision, "--log", str(log), *extra,
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    print(res.stdout[-3000:], res.stderr[-3000:], flush=True)
    res.check_returncode()
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    # the first steps compile kernels and grow the caching allocator; profiled steps run slower
    warm = [r for r in recs[2:] if not r.get("profiled")] or recs
    secs = np.array([r["seconds"] for r in warm])
    tok = np.array([r["llm_tokens"] for r in warm])
    flops = np.array([r["model_flops"] for r in warm])
    peak = _peak(precision) if torch.cuda.is_available() else None
    found = re.search(r"recompute: (.*)", res.stdout)
    return {
        "precision": precision,
        "steps": len(recs),
        "step_seconds": float(np.median(secs)),
        "tokens_per_step": float(tok.mean()),
        "tokens_per_s": float(tok.sum() / secs.sum()),
        "tflops": float(flops.sum() / secs.sum() / 1e12),
        "mfu": float(flops.sum() / secs.sum() / peak) if peak else None,
        "peak_allocated": max(r["peak_allocated"] or 0 for r in recs),
        "peak_reserved": max(r["peak_reserved"] or 0 for r in recs),
        "step_times": [r["seconds"] for r in recs],
        "loss": (recs[0]["loss"], recs[-1]["loss"]),
        "recompute": found.group(1) if found else "",
        "compiled_blocks": recs[-1].get("compiled_blocks"),
        # CUDA: the caching allocator's frees-and-retries and cudaMallocs over the whole run
        "alloc_retries": recs[-1].get("alloc_retries"),
        "device_allocs": recs[-1].get("device_allocs"),
    }


def replay(order: dict, fwd: dict, bwd: dict) -> tuple[float, dict, dict]:
    """Run a pipeline order with given pass durations: each action starts when its rank is free
    and its input is there (forward of stage s after forward of s-1; backward of s after
    backward of s+1 and its own forward). ``order``: rank -> actions with ``stage_index``,
    ``computation_type`` (F/B) and ``microbatch_index``; ``fwd``/``bwd``: (stage, mb) ->
    seconds. Returns the makespan, busy seconds per rank and the most microbatches each rank
    holds forward-done and backward-pending at once."""
    from torch.distributed.pipelining.schedules import _ComputationType

    F = _ComputationType.FORWARD
    last = max(a.stage_index for ops in order.values() for a in ops)
    done: dict = {}
    clock = dict.fromkeys(order, 0.0)
    busy = dict.fromkeys(order, 0.0)
    held, most = dict.fromkeys(order, 0), dict.fromkeys(order, 0)
    pos = dict.fromkeys(order, 0)
    while any(pos[r] < len(order[r]) for r in order):
        moved = False
        for r, ops in order.items():
            while pos[r] < len(ops):
                a = ops[pos[r]]
                s, m, is_f = a.stage_index, a.microbatch_index, a.computation_type == F
                need = [("F", s - 1, m)] if is_f and s > 0 else []
                if not is_f:
                    need = [("F", s, m)] + ([("B", s + 1, m)] if s < last else [])
                if any(k not in done for k in need):
                    break
                start = max([clock[r]] + [done[k] for k in need])
                dur = (fwd if is_f else bwd)[(s, m)]
                clock[r] = start + dur
                busy[r] += dur
                done[("F" if is_f else "B", s, m)] = clock[r]
                held[r] += 1 if is_f else -1
                most[r] = max(most[r], held[r])
                pos[r] += 1
                moved = True
        if not moved:
            raise RuntimeError("the order deadlocks: an action waits on one never run")
    return max(clock.values()), busy, most


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _allocated(dev) -> int:
    return torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0


def _layer_times(llm, loss_fn, tokens: int, auto, dev) -> np.ndarray:
    """Forward + backward seconds of the embedding, one block (all alike) and the head over a
    row of ``tokens`` tokens (``profile_layers``: synchronized, median of LAYER_REPEATS)."""
    from trainer_adapter.train.partition import profile_layers

    x = torch.randn(tokens, llm.cfg.llm_hidden, device=dev, requires_grad=True)
    ids = torch.randint(0, llm.cfg.vocab_size, (tokens,), device=dev)
    with auto:
        return profile_layers(
            [
                lambda: llm.tok(ids).sum().backward(),
                lambda: llm.blocks[0](x, [tokens]).sum().backward(),
                lambda: loss_fn(llm.norm(x), ids.cpu()).backward(),
            ],
            repeats=LAYER_REPEATS,
        )


def _pipeline(table, plan, dev, model: str = "1b", vocab: int = 151_646) -> list[dict]:
    """Per layout, the mean over PIPE_STEPS steps (the heaviest replica of each) of the replayed
    1F1B pipeline with pass times measured on this GPU."""
    from bench.bench_pipeline import _steps
    from trainer_adapter.train.loss import ChunkedLMLoss, chunk_tokens_for
    from trainer_adapter.train.model import LanguageModel, VLMConfig

    cfg = VLMConfig.preset(model, vocab_size=vocab, patch_dim=588)
    torch.manual_seed(0)
    llm = LanguageModel(cfg).to(dev)
    steps = _steps(table, plan)
    loads = {
        "max_sample_llm_tokens": int(max(x.max() for s in steps for x in s if x.size)),
        "max_group_llm_tokens": int(max(x.sum() for s in steps for x in s)),
    }
    rng = np.random.default_rng(0)
    picked = [steps[i] for i in rng.choice(len(steps) - 1, PIPE_STEPS, replace=False)]
    loss_fn = ChunkedLMLoss(llm.head, chunk_tokens_for(vocab), 1000.0)  # as the trainer's
    auto = torch.autocast(dev.type, dtype=torch.bfloat16)
    out = []
    for pp, n_micro in LAYOUTS:
        try:
            out.append(_layout(pp, n_micro, llm, cfg, loads, picked, loss_fn, auto, dev))
        except torch.OutOfMemoryError as exc:  # reported in the table, not a crash
            out.append({"pp": pp, "microbatches": n_micro, "error": str(exc).split(".")[0]})
        llm.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return out


def _layout(pp, n_micro, llm, cfg, loads, picked, loss_fn, auto, dev) -> dict:
    """One (pp, microbatches) layout: partition, then each picked step measured and replayed."""
    from trainer_adapter.train.flops import training_flops
    from trainer_adapter.train.partition import search_partition, stage_ranges
    from trainer_adapter.train.pipeline import (
        StageModule,
        bucket_ladder,
        device_mark,
        doc_rows,
        interval_seconds,
        plan_step,
    )
    from trainer_adapter.train.pipeline_setup import blocks_of as _blocks_of
    from trainer_adapter.train.split_samples import _single_stage_order, chain_actions
    from trainer_adapter.train.trainer import auto_mb_tokens

    mb_max = auto_mb_tokens(loads, n_micro)
    buckets = bucket_ladder(mb_max, 1.08)
    n_blocks, n_layers = cfg.llm_layers, cfg.llm_layers + 2
    t_emb, t_blk, t_head = _layer_times(llm, loss_fn, mb_max, auto, dev)
    llm.zero_grad(set_to_none=True)
    times = [t_emb] + [t_blk] * n_blocks + [t_head]
    best, _ = search_partition(times, [1.0] * n_layers, pp, top_k=1, comm_weight=0.0)
    ranges = stage_ranges(best.bounds, n_layers)
    stages = []
    for k, (lo, hi) in enumerate(ranges):
        blocks = _blocks_of(lo, hi, n_blocks)
        stages.append(StageModule(llm, blocks.start, blocks.stop, last=k == pp - 1))
    res = {"pp": pp, "microbatches": n_micro, "bounds": list(best.bounds), "steps": []}
    for ranks in picked:
        lens = max(ranks, key=lambda x: x.sum())  # the slowest replica sets the step
        mb, mplan = plan_step(lens, n_micro, buckets, pp, split=True)
        doc = doc_rows(mplan, lens, mb).to(dev)
        tgt = torch.randint(0, cfg.vocab_size, (n_micro, mb))  # on the host, as the trainer's
        tgt[doc.cpu() < 0] = -100
        fwd, bwd, act = {}, {}, dict.fromkeys(range(pp), 0.0)
        starts = np.cumsum([0, *mplan.chains])
        for s, st in enumerate(stages):
            st.carry.reset()
            # chain by chain, as the schedule holds them: its rows forward, then backward
            # last row first (a cut sample's later piece sends gradient to the earlier)
            # each pass between two marks (CUDA: timing events on the compute stream, no host
            # sync between passes, so the host queues ahead as in training), read per chain
            for a, b in itertools.pairwise(starts):
                outs, marks = {}, {}
                base = _allocated(dev)
                for m in range(a, b):
                    h = torch.randn(1, mb, cfg.llm_hidden, device=dev, requires_grad=True)
                    t0 = device_mark(h)
                    with auto:
                        y = st(h, doc[m : m + 1])
                        y = loss_fn(y, tgt[m]) if st.last else y[0]
                    marks[("F", m)] = (t0, device_mark(y))
                    outs[m] = y
                act[s] = max(act[s], (_allocated(dev) - base) / (b - a))
                for m in reversed(range(a, b)):
                    y = outs.pop(m)
                    t0 = device_mark(y)
                    y.backward() if st.last else y.backward(torch.ones_like(y))
                    marks[("B", m)] = (t0, device_mark(y))
                del y
                for (kind, m), pair in marks.items():
                    (fwd if kind == "F" else bwd)[(s, m)] = interval_seconds([pair])
            st.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        order = chain_actions(_single_stage_order("1f1b", pp, len(mplan.chains)), mplan.chains)
        span, busy, most = replay(order, fwd, bwd)
        params = [sum(p.numel() for p in st.parameters()) for st in stages]
        params[0] += sum(p.numel() for p in (*llm.tok.parameters(), *llm.pos.parameters()))
        res["steps"].append(
            {
                "mb_tokens": mb,
                "tokens": int(lens.sum()),
                "padding": mplan.padding,
                "chains": list(mplan.chains),
                "seconds": span,
                "flops": training_flops(cfg, [int(x) for x in lens]),
                "bubble": [1 - busy[s] / span for s in range(pp)],
                "memory": [16 * params[s] + most[s] * act[s] for s in range(pp)],
            }
        )
    return res


def _gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.1f}"


def _md_train(rows: list[dict]) -> list[str]:
    md = [
        "| precision | step time | tokens/step | tokens/s | model TFLOP/s | MFU | peak allocated / reserved | loss first -> last | recomputation |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        md.append(
            f"| {r['precision']} | {r['step_seconds'] * 1000:.0f} ms | {r['tokens_per_step']:,.0f} "
            f"| {r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | {mfu} | "
            f"{_gib(r['peak_allocated'])} / {_gib(r['peak_reserved'])} GiB | "
            f"{r['loss'][0]:.3f} -> {r['loss'][1]:.3f} | {r['recompute']} |"
        )
    return md


def _md_pipeline(rows: list[dict]) -> list[str]:
    peak = _peak("bf16")
    md = [
        "| PP x microbatches | cuts | row tokens | padding | step time | tokens/s | MFU | bubble per stage | peak memory per stage (GiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['pp']} x {r['microbatches']} | {r['error']} |||||||")
            continue
        st = r["steps"]
        secs = sum(s["seconds"] for s in st)
        flops = sum(s["flops"] for s in st)
        mfu = f"{flops / secs / (r['pp'] * peak):.1%}" if peak else "n/a"
        bub = np.mean([s["bubble"] for s in st], axis=0)
        mem = np.max([s["memory"] for s in st], axis=0) / 2**30
        pad = 1 - sum(s["tokens"] for s in st) / sum(s["mb_tokens"] * r["microbatches"] for s in st)
        md.append(
            f"| {r['pp']} x {r['microbatches']} | {tuple(r['bounds'])} | "
            f"{', '.join(str(s['mb_tokens']) for s in st)} | {pad:.1%} | {secs / len(st) * 1000:.0f} ms "
            f"| {sum(s['tokens'] for s in st) / secs:,.0f} | {mfu} | "
            f"{' / '.join(f'{b:.1%}' for b in bub)} | {' / '.join(f'{m:.1f}' for m in mem)} |"
        )
    return md


def run() -> dict:
    if not torch.cuda.is_available():
        return {
            "title": "Training on a GPU",
            "markdown": "Not measured: no CUDA device on the machine that ran `make bench`.",
            "raw": None,
        }
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        _, _, gen1 = _generation(root, dp=1, target_batch=TRAIN_BATCH)
        train = [_train(gen1, p, root / f"train-{p}.jsonl") for p in ("fp32", "bf16")]
        table, plan8, _ = _generation(root, dp=8, target_batch=4)
        pipe = _pipeline(table, plan8, dev)
    md = [
        f"On one {name} (torch {torch.__version__}, CUDA {torch.version.cuda}). MFU = model "
        "FLOPs of the real tokens (`trainer_adapter.train.flops`: matrix products and attention, "
        "causal attention counted half, recomputation not counted) over the dense peak "
        f"({', '.join(f'{k} {v / 1e12:.0f} TFLOP/s' for k, v in (PEAKS.get(next((k for k in PEAKS if k in name), ''), {})).items())}).",
        "",
        "### `equishard train` on one GPU: `1b` VLM, `--recompute adaptive`, NCCL",
        "",
        f"DP 1, {STEPS} steps of about {TRAIN_BATCH} demo samples (448-px InternVL tiles); "
        "medians and rates over the steps after the first two.",
        "",
        *_md_train(train),
        "",
        "### Pipeline, 1F1B, bf16: stages measured on this GPU, order replayed",
        "",
        "One GPU cannot run a PP>1 pipeline (NCCL needs a GPU per rank), so each stage's real "
        "passes are measured one after another on it (CUDA timing events around each pass, no "
        "host sync between passes) and the 1F1B order over the step's chains "
        f"(`ChainSchedule`'s order) is replayed with those times, transfers taken as free. "
        f"{PIPE_STEPS} steps of a DP-8 demo plan (target batch 4), the heaviest replica of "
        "each; the trainer's row ladder with samples cut across rows. MFU over PP GPUs. Peak "
        "memory: fp32 weights, gradients and AdamW state of the stage plus the activations of "
        "the most rows 1F1B holds at once (measured per row), without recomputation.",
        "",
        *_md_pipeline(pipe),
    ]
    return {
        "title": "Training on a GPU",
        "markdown": "\n".join(md),
        "raw": {"train": train, "pipeline": pipe},
    }
