"""The training loop behind ``equishard train``; one process per rank, started by torchrun.

``python -m torch.distributed.run --standalone --nproc-per-node N -m trainer_adapter.train.loop
--config '<TrainConfig as JSON>'``. Logs one line per step on rank 0 (and JSON lines to
``TrainConfig.log``): step time, tokens/s, per-rank loads before/after redistribution (max/mean
per phase), bytes moved inside and across nodes, and the measured bubble fraction per stage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from balancing.step_report import assess_step
from equishard.contracts.columns import LLM_TOKENS, VIT_TOKENS
from equishard.contracts.phase_times import parse_step_times
from trainer_adapter.phase_timer import gather_phase_times
from trainer_adapter.train.config import TrainConfig
from trainer_adapter.train.model import VLMConfig, merge_for_policy
from trainer_adapter.train.profile import StepProfiler, parse_steps
from trainer_adapter.train.run_setup import (  # re-exported: what a run takes from its generation
    build_collator,
    plan_cost_note,
    set_recompute,
    target_share,
    with_audio,
)
from trainer_adapter.train.trainer import Trainer, auto_mb_tokens, empty_batch

__all__ = ["build_collator", "group_batches", "main", "plan_cost_note", "run", "target_share"]


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _loads(lm: dict, phase: str, methods: dict) -> str:
    """A phase's max/mean before -> after; a dry run's (the baseline): what it had and, in
    brackets, what balancing would have made of it."""
    if methods.get(phase, "").startswith("dry run"):
        return f"{lm[f'{phase}_before']:.3f} (balanced: {lm[f'{phase}_planned']:.3f})"
    return f"{lm[f'{phase}_before']:.3f}->{lm[f'{phase}_after']:.3f}"


def _predicted(out: dict, cfg: TrainConfig) -> dict:
    """The plan's per-rank load of each phase this step (what ran: the balanced plan, or the
    batches as read under a dry run); the LLM's per replica, given to each of its stages."""
    when = "after" if cfg.redistribute else "before"
    loads = out["loads"]
    llm = loads[f"llm_{when}"]
    return {
        "vision": loads[f"vision_{when}"],
        "llm": [llm[r // cfg.pp] for r in range(cfg.world_size)],
    }


def _hardware(device, world: int) -> str:
    """What the run measures, in words (a calibration records it)."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} x {world} ranks"
    from balancing.calibration_file import describe_machine

    return f"{describe_machine()}, {world} CPU ranks of {torch.get_num_threads()} threads"


def group_batches(ds, workers: int, timeout: float):
    """This rank's collated groups, epoch after epoch, read by ``workers`` DataLoader workers
    (0: in this process). A worker that takes more than ``timeout`` seconds for one group (a
    read stuck on a hung mount) ends the run with a :class:`TimeoutError` naming the
    generation, instead of holding this rank, and every rank waiting on it, forever."""
    from torch.utils.data import DataLoader

    loader = DataLoader(ds, batch_size=None, num_workers=workers, timeout=timeout if workers else 0)
    epoch = 0
    while True:
        ds.set_epoch(epoch)
        try:
            yield from loader
        except RuntimeError as exc:
            if "timed out" not in str(exc):
                raise
            raise TimeoutError(
                f"{ds.manifest.path}: a DataLoader worker of rank {ds.rank.rank} took more than "
                f"{timeout:g} s for one group (a read stuck on a hung mount or a slow store?); "
                "raise --loader-timeout if groups are that slow to read"
            ) from exc
        epoch += 1


# the LLM's learned position table: at least this long, longer when the generation's longest
# sample needs it, refused past the largest (a table of that many rows is memory, not a model)
POSITIONS, MAX_POSITIONS = 32768, 1 << 22


def position_table_size(manifest) -> int:
    """The position table's rows for ``manifest``'s generation: its longest sample checked at the
    start, not found mid-run when the step that holds it comes."""
    longest = (manifest.raw.get("loads") or {}).get("max_sample_llm_tokens", 0)
    if longest > MAX_POSITIONS:
        raise ValueError(
            f"{manifest.path}: the generation's longest sample has {longest} LLM tokens; the "
            f"reference trainer's position table holds at most {MAX_POSITIONS}: split or drop "
            "such samples before prep"
        )
    return max(POSITIONS, longest)


def run(cfg: TrainConfig) -> list[dict]:
    """Train on an initialized default process group; returns rank 0's step records."""
    from shards import GroupDataset, RankInfo, open_generation

    rank = dist.get_rank()
    manifest = open_generation(cfg.shards, cache_dir=cfg.shards_cache)
    collate = build_collator(cfg, manifest)
    loads = manifest.raw.get("loads")
    mb_tokens = cfg.mb_tokens
    if cfg.pp > 1 and mb_tokens is None:
        if not loads:
            raise ValueError(f"{manifest.path}: no load summary in the manifest; pass --mb-tokens")
        mb_tokens = auto_mb_tokens(loads, cfg.n_microbatches)
    model_cfg = VLMConfig.preset(
        cfg.model,
        vocab_size=collate.vocab_size,
        patch_dim=3 * collate._policy.patch_size**2,
        merge=merge_for_policy(collate._policy),
        max_positions=position_table_size(manifest),
    )
    model_cfg = with_audio(model_cfg, collate)  # where prep measured recordings
    if rank == 0 and (note := plan_cost_note(manifest, model_cfg, cfg.calibration)):
        print(note, flush=True)
    rpn = cfg.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", cfg.world_size))
    # rank 0 searches the pipeline partition: it times the LM head over the share of tokens
    # that carry a target in this generation (its first groups, as the collator labels them)
    share = target_share(manifest, collate) if cfg.pp > 1 and rank == 0 else 1.0
    trainer = Trainer(
        cfg, model_cfg, mb_tokens=mb_tokens or 0, ranks_per_node=rpn, target_share=share
    )
    replica, stage = trainer.replica, trainer.stage
    batches = iter(())
    if stage == 0:
        ds = GroupDataset(
            manifest,
            RankInfo(rank=replica, world_size=cfg.dp, node=rank // rpn),
            seed=cfg.seed,
            transform=collate,
        )
        batches = group_batches(ds, cfg.workers, cfg.loader_timeout)
    a = model_cfg.audio
    empty = empty_batch(
        model_cfg.patch_dim, collate.image_token_id, audio=a and (a.mel, collate.audio_token_id)
    )
    first = next(batches) if stage == 0 else None
    set_recompute(cfg, trainer, first["samples"] if first is not None else empty, loads)
    log = open(cfg.log, "a") if cfg.log and rank == 0 else None  # noqa: SIM115
    records = []
    if rank == 0 and trainer.partition is not None:
        print(
            f"pipeline partition (embedding, {model_cfg.llm_layers} blocks, head over "
            f"{cfg.pp * cfg.stages_per_rank} stages): cuts {trainer.partition['bounds']}, "
            f"microbatches {cfg.n_microbatches} x up to {mb_tokens} tokens "
            f"({len(trainer.buckets)} row sizes)",
            flush=True,
        )
    prof = None
    if cfg.profile:
        a, b = parse_steps(cfg.profile_steps)
        prof = StepProfiler(cfg.profile, a, b, rank=rank, device=trainer.device,
                            trace=cfg.profile_trace)  # fmt: skip
    hardware = _hardware(trainer.device, dist.get_world_size())
    for step in range(cfg.steps):
        t_load = time.perf_counter()
        item = (first if step == 0 else next(batches)) if stage == 0 else None
        t_load = time.perf_counter() - t_load
        batch = item["samples"] if item is not None else empty
        if prof:
            prof.before(step)
        out = trainer.step(batch)
        if prof:
            prof.after(step, out["seconds"])
        times = trainer.timer.collect()  # a GPU step synchronized at its end: events are ready
        times["waits"]["loader"] = t_load
        mine = {
            "phase_times": times,
            "rank": rank,
            "stage": stage,
            "busy": out["stage_busy"],
            "flops": out["model_flops"],
            "peak": (out.get("peak_allocated"), out.get("peak_reserved")),
            "sample_ids": list(batch["sample_ids"]),
            "epoch": item["epoch"] if item else None,
            "step": item["step"] if item else None,
        }
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        if rank != 0:
            continue
        r = out["route"]
        moved = r["bytes"]
        intra = sum(v["intra_node"] for v in moved.values())
        inter = sum(v["inter_node"] for v in moved.values())
        flops = sum(e["flops"] for e in every)
        bubbles = {}
        if cfg.pp > 1:
            for s in range(cfg.pp):
                busy = [e["busy"] for e in every if e["stage"] == s]
                bubbles[s] = float(1.0 - np.mean(busy) / out["llm_seconds"]) if busy else 0.0
        rec = {
            "step": step,
            "seconds": out["seconds"],
            "loss": out["loss"],
            "tokens_per_second": out[LLM_TOKENS] / out["seconds"],
            LLM_TOKENS: out[LLM_TOKENS],
            VIT_TOKENS: out[VIT_TOKENS],
            "loads_max_over_mean": {
                k[: -len("_max_over_mean")]: v for k, v in r.items() if k.endswith("_max_over_mean")
            },
            "methods": r["methods"],
            "bytes_intra_node": intra,
            "bytes_inter_node": inter,
            "redistribute_seconds": out["redistribute_seconds"],
            "bubble_per_stage": bubbles,
            # model FLOPs of the step over all ranks (trainer_adapter.train.flops), per GPU per second
            "model_flops": flops,
            "tflops_per_rank": flops / out["seconds"] / len(every) / 1e12,
            "precision": cfg.precision,
            "compiled_blocks": trainer.compiled_blocks,
            # CUDA only: the largest rank's peak allocated and reserved bytes in the step
            "peak_allocated": max((e["peak"][0] or 0) for e in every) or None,
            "peak_reserved": max((e["peak"][1] or 0) for e in every) or None,
            # CUDA only, rank 0, cumulative: the caching allocator's retries and cudaMallocs
            "alloc_retries": out.get("alloc_retries"),
            "device_allocs": out.get("device_allocs"),
            "profiled": bool(prof and prof.active(step)),
            "mb_tokens": out["pipeline"].get("mb_tokens"),
            "padding": out["pipeline"].get("padding"),
            "empty_microbatches": out["pipeline"].get("empty_microbatches"),
            "cut_samples": out["pipeline"].get("cut_samples"),
            "longest_chain": out["pipeline"].get("longest_chain"),
            # PP: the share of tokens the partition search timed the LM head over
            "partition_target_share": trainer.target_share if cfg.pp > 1 else None,
            "samples": {e["rank"]: e["sample_ids"] for e in every if e["stage"] == 0},
            "loader_position": [[e["epoch"], e["step"]] for e in every if e["stage"] == 0],
        }
        rec["hardware"] = hardware
        rec["generation"] = manifest.generation
        rec["model"] = f"equishard train --model {cfg.model} ({cfg.precision})"
        rec.update(gather_phase_times([e["phase_times"] for e in every], _predicted(out, cfg)))
        rec["step_report"] = assess_step(parse_step_times(rec, "this run"))
        records.append(rec)
        lm = rec["loads_max_over_mean"]
        print(
            f"step {step:4d}  {out['seconds']:6.2f} s  loss {out['loss']:.4f}  "
            f"{rec['tokens_per_second']:,.0f} tok/s  {rec['tflops_per_rank']:.3g} TFLOP/s/rank  "
            + (f"peak {rec['peak_reserved'] / 2**30:.1f} GiB  " if rec["peak_reserved"] else "")
            + f"max/mean vision {_loads(lm, 'vision', r['methods'])}  "
            + (f"audio {_loads(lm, 'audio', r['methods'])}  " if "audio" in r["methods"] else "")
            + f"llm {_loads(lm, 'llm', r['methods'])}  measured efficiency "
            f"{rec['step_report']['efficiency']:.3f}  moved intra "
            f"{_fmt_bytes(intra)} / inter {_fmt_bytes(inter)}"
            + (f"  bubble {' '.join(f'{b:.2f}' for b in bubbles.values())}" if bubbles else "")
            + (
                f"  rows {'/'.join(map(str, rec['mb_tokens']))} tok, padding {rec['padding']:.1%}, "
                f"{rec['empty_microbatches']} empty, {rec['cut_samples']} cut"
                if rec["mb_tokens"]
                else ""
            ),
            flush=True,
        )
        if log:
            log.write(json.dumps(rec) + "\n")
            log.flush()
    if prof:
        prof.close()  # a window the loop did not finish
        if rank == 0 and prof.summary:
            share = prof.summary["device_busy_share"]
            print(
                f"profile: steps {cfg.profile_steps} in {cfg.profile}"
                + (f", device busy {share:.0%} of the wall" if share is not None else ""),
                flush=True,
            )
    if log:
        log.close()
    if rank == 0 and records:
        first, last = records[0]["loss"], records[-1]["loss"]
        seen = sum(len(v) for r in records for v in r["samples"].values())
        print(
            f"train: {len(records)} steps, loss {first:.4f} -> {last:.4f}, {seen} samples "
            f"read, mean step {np.mean([r['seconds'] for r in records]):.2f} s",
            flush=True,
        )
    return records


def resolve_backend(
    requested: str, local_rank: int, local_world: int, cuda: bool, gpus: int
) -> str:
    """The process group backend: NCCL needs its own GPU for every rank of a node."""
    if requested == "gloo" or (requested == "auto" and not cuda):
        return "gloo"
    if not cuda:
        raise ValueError("--backend nccl needs CUDA, and this machine has no CUDA device")
    if max(local_world, local_rank + 1) > gpus:
        raise ValueError(
            f"{local_world} processes on this node but {gpus} GPU(s): NCCL needs one GPU per "
            "process; start at most that many (--nproc) or use --backend gloo (CPU training)"
        )
    return "nccl"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one rank of equishard train (started by torchrun)")
    ap.add_argument("--config", required=True, help="TrainConfig as JSON")
    args = ap.parse_args(argv)
    cfg = TrainConfig(**json.loads(args.config))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    backend = resolve_backend(
        cfg.backend,
        local_rank,
        int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        cuda,
        torch.cuda.device_count() if cuda else 0,
    )
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, timeout=timedelta(minutes=10))
    try:
        run(cfg)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
