"""What a training run takes from the generation it reads, before its first step: the collator
of the settings prep recorded (:func:`build_collator`), the share of tokens with a target that
the partition search times the LM head over (:func:`target_share`), the audio encoder of its
recordings (:func:`with_audio`), the note when the plan was
balanced for another model's costs (:func:`plan_cost_note`), and adaptive recomputation sized
for the generation's heaviest step (:func:`set_recompute`)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from trainer_adapter.train.config import TrainConfig
from trainer_adapter.train.model import VLMConfig
from trainer_adapter.train.trainer import Trainer

__all__ = [
    "build_collator",
    "heaviest_ratio",
    "plan_cost_note",
    "set_recompute",
    "target_share",
    "with_audio",
]


def build_collator(cfg: TrainConfig, manifest):
    """The collator of what the generation was measured with (``cfg`` may name the same
    settings elsewhere; a different one is refused, naming both)."""
    from shards import Collator

    # images travel between ranks as uint8 pixels; the trainer normalizes them on the device
    return Collator.from_generation(
        manifest,
        tokenizer=cfg.tokenizer,
        template=cfg.template,
        vision_policy=cfg.vision_policy,
        pixels="uint8",
    )


def with_audio(model_cfg: VLMConfig, collate) -> VLMConfig:
    """``model_cfg`` with the audio encoder of the generation's recordings, where prep measured
    any: the rule's kind (``n_window``: chunks; 0: the padded window of ``window_frames``), the
    collator's mel bins, the vision encoder's width and depth, the LLM's width out."""
    from dataclasses import replace

    from trainer_adapter.train.audio_encoder import AudioConfig

    feats = collate.audio
    if feats is None:
        return model_cfg
    rule = feats.rule
    audio = AudioConfig(
        mel=feats.mel,
        hidden=model_cfg.vit_hidden,
        layers=model_cfg.vit_layers,
        heads=model_cfg.vit_heads,
        out_dim=model_cfg.llm_hidden,
        n_window=rule.n_window,
        window_frames=rule.window_frames,
    )
    return replace(model_cfg, audio=audio)


def heaviest_ratio(loads: dict | None, batch: dict) -> float:
    """How much heavier the generation's largest group is than ``batch`` (the larger of the
    LLM and the encoder ratio; 1 where unknown or the batch is empty)."""
    ratios = [1.0]
    for key, lens in (("max_group_llm_tokens", "llm_lens"), ("max_group_vit_tokens", "vit_lens")):
        have = float(batch[lens].sum()) if len(batch[lens]) else 0.0
        if loads and loads.get(key) and have > 0:
            ratios.append(float(loads[key]) / have)
    return max(ratios)


def set_recompute(cfg: TrainConfig, trainer: Trainer, batch: dict, loads: dict | None) -> None:
    """Recompute nothing, everything, or what memory requires (OmniBal A.1.1, GPU only), planned
    for the generation's heaviest group although the trials run on ``batch``."""
    from trainer_adapter.train.recompute import (
        adaptive_recompute,
        cuda_peak,
        prime_optimizer_state,
        scaled_peak,
        set_recompute,
    )

    vit = list(trainer.model.vision.blocks)
    llm = [b for st in trainer.stages for b in st.blocks] or list(trainer.model.llm.blocks)
    if cfg.recompute != "adaptive":
        set_recompute(vit, 0 if cfg.recompute == "all" else len(vit))
        set_recompute(llm, 0 if cfg.recompute == "all" else len(llm))
        return
    if trainer.device.type != "cuda":
        raise ValueError("--recompute adaptive measures GPU memory; use off or all on a CPU")
    prime_optimizer_state(trainer.optimizer)  # its state is memory every step holds

    def agree(oom: bool) -> bool:
        flag = torch.tensor([int(oom)], device=trainer.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def step():
        trainer.forward_backward(batch)
        trainer.optimizer.zero_grad(set_to_none=True)

    budget = torch.cuda.get_device_properties(trainer.device).total_memory * cfg.memory_fraction
    torch.cuda.synchronize(trainer.device)
    torch.cuda.empty_cache()
    static = float(torch.cuda.memory_reserved(trainer.device))  # weights, optimizer state
    # every rank plans for the heaviest step any replica may see (a PP stage past the first
    # reads no batch of its own)
    heaviest = torch.tensor([heaviest_ratio(loads, batch)], device=trainer.device)
    dist.all_reduce(heaviest, op=dist.ReduceOp.MAX)
    ratio = float(heaviest.item())
    r = adaptive_recompute(
        step, vit, llm, budget, agree=agree, measure=scaled_peak(cuda_peak, static, ratio)
    )
    if dist.get_rank() == 0:
        print(
            f"recompute: {len(vit) - r.vit_plain}/{len(vit)} ViT and "
            f"{len(llm) - r.llm_plain}/{len(llm)} LLM blocks recomputed on rank 0 "
            f"(saves {r.saving_vit / 2**20:.1f} / {r.saving_llm / 2**20:.1f} MiB per block; "
            f"peak {r.peak / 2**30:.2f} GiB of {budget / 2**30:.2f} for the heaviest group, "
            f"{ratio:.2f}x the trial batch; {r.trials} trial steps)",
            flush=True,
        )


def target_share(manifest, collate, groups: int = 8) -> float:
    """The share of LLM tokens with a next-token target in the generation's first ``groups``
    groups (image tokens, prompts and the template's own tokens have none); 1.0 for none."""
    from shards import read_group

    index = manifest.group_index()
    tokens = targets = 0
    for key in sorted(index)[:groups]:
        shard, g = index[key]
        labels = collate(read_group(manifest.storage, shard, g)[0])["labels"]
        tokens += labels.numel()
        targets += int((labels != -100).sum())
    return targets / tokens if targets else 1.0


def plan_cost_note(manifest, model_cfg: VLMConfig, calibration: str | None = None) -> str | None:
    """What to tell the user when the generation's plan was balanced for another model's
    costs than the one being trained (the plan report records its cost model): its steps are
    even for that model's mix of linear and quadratic work, not this one's. None when alike."""
    from balancing import BalanceConfig, CostModel

    params = manifest.report.get("parameters")
    try:
        plan = BalanceConfig.from_report(params, str(manifest.path)).cost_model
    except ValueError:
        return None  # a report without parameters: nothing recorded to compare
    here = (
        CostModel.from_calibration(calibration)
        if calibration
        else CostModel.from_dims(
            vit_hidden=model_cfg.vit_hidden,
            vit_layers=model_cfg.vit_layers,
            llm_hidden=model_cfg.llm_hidden,
            llm_layers=model_cfg.llm_layers,
        )
    )
    # only the ratio of quadratic to linear work decides which groups are alike
    alike = all(
        abs(a.beta / a.alpha - b.beta / b.alpha) <= 0.01 * (b.beta / b.alpha)
        for a, b in ((plan.vision, here.vision), (plan.llm, here.llm))
        if a.alpha and b.alpha
    )
    if alike:
        return None
    return (
        f"note: the plan was balanced for {plan.source}; this run's costs are {here.source}"
        ": its steps are even for the other model's costs (runtime balancing evens each step "
        "anyway). Balance with this model's --vit-hidden/--vit-layers/--llm-hidden/"
        "--llm-layers (or --calibration) for steps even for it"
    )
