"""One training step over DP x PP ranks: redistribute, encode, exchange, pipeline, all-reduce.

Rank ``replica * pp + stage``. Stage-0 ranks read the shards (one loader rank per replica). Each
step, on every rank:

1. :func:`redistribute` over all ranks: the vision plan spreads encoder work over every rank (the
   encoder is replicated), the LLM plan gives each replica an even share (its stage 0 gets token
   ids, its last stage the labels);
2. the encoder runs on this rank's images; :meth:`Route.send_image_embeddings` sends the image
   tokens straight to their replica's stage 0 (one exchange);
3. with pp == 1 the LLM runs in-process; otherwise stage 0 packs its samples into fixed-shape
   microbatches (ordered for 1F1B by MMScale's reordering) and the schedule runs them; the
   gradient of stage 0's input goes back through the exchange into the encoder on every rank;
4. gradients are summed over the ranks that hold each parameter (the loss is already divided by
   the global number of target tokens, so the result is the same with or without step 1).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.distributed as dist

from balancing import CostModel
from balancing.first_call import prewarm
from equishard.contracts.columns import LLM_TOKENS, VIT_TOKENS
from shards.read.collate import normalize_patches
from trainer_adapter.encoder_phases import audio_phase
from trainer_adapter.phase_timer import PhaseTimer
from trainer_adapter.redistribute import RedistributePolicy, redistribute
from trainer_adapter.topology import Topology
from trainer_adapter.train.audio_pass import audio_backward, encode_audio
from trainer_adapter.train.config import TrainConfig
from trainer_adapter.train.flops import training_flops
from trainer_adapter.train.loss import ChunkedLMLoss, chunk_tokens_for, chunked_lm_loss
from trainer_adapter.train.model import (
    VisionLanguageModel,
    VLMConfig,
    compile_blocks,
    shifted_labels,
)
from trainer_adapter.train.pipeline import (
    StageModule,
    doc_rows,
    pack_rows,
    row_layouts,
)
from trainer_adapter.train.pipeline_setup import PipelineSetup

__all__ = ["Trainer", "auto_mb_tokens", "empty_batch"]

_LLM, _TGT = 0, 4


def empty_batch(
    patch_dim: int, image_token_id: int, patch_dtype=torch.uint8, audio: tuple | None = None
) -> dict:
    """A collated batch with no samples (ranks that read no data still join the collectives;
    ``patch_dtype`` as the other ranks' collator gives, uint8 from ``build_collator``);
    ``audio``: (mel bins, audio token id) of a model with an audio encoder, whose phase every
    rank joins."""
    z = torch.zeros(0, dtype=torch.long)
    heard = {}
    if audio is not None:
        heard = {
            "audio_features": torch.zeros(0, audio[0]),
            "audio_frames": z,
            "audio_lens": torch.zeros(0, 1, dtype=torch.long),
            "num_audios": z,
            "audio_token_id": audio[1],
        }
    return {
        **heard,
        "input_ids": z,
        "labels": z,
        "position_ids": z,
        "cu_seqlens": torch.zeros(1, dtype=torch.int32),
        "patches": torch.zeros(0, patch_dim, dtype=patch_dtype),
        "patch_cu_seqlens": torch.zeros(1, dtype=torch.int32),
        "llm_lens": z,
        "vit_lens": z,
        "units_hw": torch.zeros(0, 2, dtype=torch.long),
        "num_units": z,
        "image_token_id": image_token_id,
        "sample_ids": [],
    }


def auto_mb_tokens(loads: dict, n_microbatches: int) -> int:
    """Microbatch size that fits the largest sample and, with slack for packing, the largest
    group (each replica reads one group per step; redistribution evens replicas towards the
    step's mean, which is at most that)."""
    per_replica = loads["max_group_llm_tokens"]
    need = max(loads["max_sample_llm_tokens"], math.ceil(1.5 * per_replica / n_microbatches))
    return int(math.ceil(need / 64) * 64)


class Trainer(PipelineSetup):
    def __init__(
        self,
        cfg: TrainConfig,
        model_cfg: VLMConfig,
        *,
        mb_tokens: int,
        ranks_per_node: int = 1,
        target_share: float = 1.0,
    ) -> None:
        if not 0.0 < target_share <= 1.0:
            raise ValueError(
                f"target_share must be in (0, 1] (the share of LLM tokens with a next-token "
                f"target), got {target_share}"
            )
        prewarm()  # the runtime kernels load (or start compiling) while the trainer builds
        self.cfg, self.mb_tokens = cfg, mb_tokens
        # the pipeline partition times the LM head and loss over this share of a row's tokens:
        # training runs them at the target positions only (image tokens and prompts have none)
        self.target_share = target_share
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world != cfg.world_size:
            raise ValueError(f"{self.world} processes, but dp x pp = {cfg.world_size}")
        self.pp, self.replica, self.stage = cfg.pp, self.rank // cfg.pp, self.rank % cfg.pp
        self.device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.topology = Topology.pipeline(dp=cfg.dp, pp=cfg.pp, ranks_per_node=ranks_per_node)
        if cfg.calibration:  # measured costs (equishard calibrate) instead of the dimensions'
            cm = CostModel.from_calibration(cfg.calibration)
        else:
            audio = model_cfg.audio
            dims = {"audio_hidden": audio.hidden, "audio_layers": audio.layers} if audio else {}
            cm = CostModel.from_dims(
                vit_hidden=model_cfg.vit_hidden,
                vit_layers=model_cfg.vit_layers,
                llm_hidden=model_cfg.llm_hidden,
                llm_layers=model_cfg.llm_layers,
                **dims,
            )
        self.cost_model = cm
        # the encoder phases beyond vision: an audio encoder's, planned with its own cost
        a = model_cfg.audio
        self.phases = (
            (audio_phase(n_window=a.n_window, window_frames=a.window_frames),) if a else ()
        )
        # each phase's own time on this rank and the items it ran (equishard calibrate's input)
        self.timer = PhaseTimer(self.device)
        # image-token embeddings as they travel: bf16 under autocast (the projector's output)
        self._embedding_bytes = model_cfg.llm_hidden * (2 if cfg.precision == "bf16" else 4)
        self.set_redistribution(cfg.redistribute)
        # every rank creates every group, in the same order
        pp_groups = [dist.new_group([r * cfg.pp + s for s in range(cfg.pp)]) for r in range(cfg.dp)]
        self.stage_groups = [
            dist.new_group([r * cfg.pp + s for r in range(cfg.dp)]) for s in range(cfg.pp)
        ]
        self.partition = None
        self.stages: list[StageModule] = []
        keep = None
        if cfg.pp > 1 and torch.torch_version.TorchVersion(torch.__version__) < (2, 13):
            raise RuntimeError(
                f"pipeline parallelism (pp={cfg.pp}) needs torch >= 2.13, found "
                f"{torch.__version__}: older torch.distributed.pipelining marks the integer "
                "sample-layout input of a stage as requiring grad and fails; upgrade torch or "
                "train with pp=1"
            )
        if cfg.pp > 1:  # the partition first: a rank then builds only its own LLM layers
            keep = self._choose_partition(model_cfg, pp_groups[self.replica])
        torch.manual_seed(cfg.seed)
        # every rank draws the whole model's random numbers from one seed, so its parts are
        # exactly the single-process model's; the layers of other stages are dropped as they
        # are built, so neither host nor device memory ever holds the whole LLM
        self.model = VisionLanguageModel(model_cfg, keep_llm=keep).to(self.device)
        compile_blocks(self.model, cfg.compile)
        # the blocks that run compiled (each step's log record carries the count)
        self.compiled_blocks = sum(getattr(m, "compiled", False) for m in self.model.modules())
        self.loss_chunk_tokens = chunk_tokens_for(model_cfg.vocab_size)
        # the pipeline's last stage: head + loss chunked (on other PP ranks the head is an
        # Identity stand-in and the loss is never called)
        self.loss_fn = ChunkedLMLoss(self.model.llm.head, self.loss_chunk_tokens)
        if cfg.pp > 1:
            self._build_stages()
        owned = [*self.model.vision.parameters(), *self.model.projector.parameters()]
        if self.model.audio is not None:  # the audio encoder is replicated as the vision one
            owned += list(self.model.audio.parameters())
        self._reduce = [(owned, None)]  # (params, group): None is the world
        llm = self.model.llm
        if cfg.pp == 1:
            self._reduce.append((list(llm.parameters()), None))
        else:
            mine = [p for st in self.stages for p in st.parameters()]
            if self.stage == 0:
                mine += [*llm.tok.parameters(), *llm.pos.parameters()]
            self._reduce.append((list(dict.fromkeys(mine)), self.stage_groups[self.stage]))
        self.params = [p for ps, _ in self._reduce for p in ps]
        # on CUDA one fused kernel updates every parameter (foreach kernels took 26 ms of a
        # 0.68 s `1b` step on an H200)
        fused = True if self.device.type == "cuda" else None
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, fused=fused)
        # no set-up gradient may reach the first optimizer step (the partition search profiles
        # a probe apart from the model; forward_backward clears what trials or callers leave)
        self.model.zero_grad(set_to_none=True)

    def set_redistribution(self, enabled: bool) -> None:
        """Balance each step's phases, or (``enabled=False``, the baseline) move nothing and
        record what balancing would have given: a dry run of the same plan."""
        self.policy = RedistributePolicy(
            dry_run=not enabled,
            method=self.cfg.method,
            placement=self.cfg.placement,
            cost_model=self.cost_model,
            llm_memory_cap=self.cfg.n_microbatches * self.mb_tokens if self.cfg.pp > 1 else None,
            embedding_bytes=self._embedding_bytes,
        )

    # ------------------------------------------------------------------ one step
    def forward_backward(self, batch: dict) -> dict:
        """Gradients of this step's loss, summed over ranks (any gradient left from before —
        profiling, recomputation trials, a caller's own backward — is dropped first, since the
        gradients are all-reduced in place); returns the step's measurements."""
        self.model.zero_grad(set_to_none=True)
        self.timer.reset()
        t0 = time.perf_counter()
        local, route = redistribute(batch, None, self.topology, self.policy, self.phases)
        t_redis = time.perf_counter() - t0
        self.timer.wait("exchange", t_redis)
        with self._autocast():
            return self._forward_backward(local, route, t_redis)

    def _autocast(self):
        """bf16 mixed precision: matrix products in bf16 under autocast, weights, gradients and
        optimizer state in fp32 (the loss is computed in fp32, ``chunked_lm_loss``)."""
        return torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16"
        )

    def _forward_backward(self, local, route, t_redis: float) -> dict:
        model = self.model
        dtype = next(model.vision.parameters()).dtype  # the model may run in another precision
        # uint8 pixels (a quarter of fp32's bytes) reach this rank's device, normalized there
        patches = normalize_patches(local.patches.to(self.device), dtype)
        # the token inputs too (stage 0 embeds them), while the device is idle: a blocking copy
        # after the encoder's kernels are queued would hold the host until they ran
        if self.stage == 0:
            ids = local.input_ids.to(self.device)
            pos = local.position_ids.to(self.device)
        timer = self.timer
        units = local.units_hw.prod(dim=1).tolist() if local.units_hw.numel() else []
        with timer.phase("vision", items=units):
            emb = model.encode_images(patches, local.units_hw)
        # the encoder's backward runs apart, after the LLM's (the same gradients), so that each
        # phase's time is its own work, not a wait on other ranks in the exchange
        emb_leaf = emb.detach().requires_grad_(emb.requires_grad)
        t_x = time.perf_counter()
        img = route.send_image_embeddings(emb_leaf)
        timer.wait("exchange", time.perf_counter() - t_x)
        img_in = img.detach().requires_grad_(img.requires_grad)
        audio = encode_audio(model.audio, local, route, self.device, dtype, timer)
        extra = [(audio.here, audio.token)] if audio else []
        normalizer = float(max(route.table[:, _TGT].sum(), 1))
        self.loss_fn.normalizer = normalizer
        lens = route.table[local.llm_index, _LLM]
        loss_sum = torch.zeros((), device=self.device)
        for st in self.stages:
            st.timer.reset()
            st.carry.reset()
        t_llm = time.perf_counter()
        pipeline = {}
        if self.stage == 0:  # on the host, before the copy (no device sync in the step)
            model.llm.check_inputs(
                local.input_ids, local.position_ids, img.shape[0], local.image_token_id
            )
            for emb_a, token in extra:
                model.llm.check_inputs(
                    local.input_ids, local.position_ids, emb_a.shape[0], token, "audio"
                )
        if self.pp == 1:
            with timer.phase("llm", items=lens.tolist()):
                x = model.llm.embed(ids, pos, img_in, local.image_token_id, extra)
                h = model.llm.forward_blocks(x, lens.tolist())
                # the head and the loss chunk by chunk at the target positions (no full logits)
                loss = chunked_lm_loss(
                    h,
                    shifted_labels(local.labels, local.label_cu_seqlens),
                    model.llm.logits,
                    normalizer=normalizer,
                    chunk_tokens=self.loss_chunk_tokens,
                )
                loss.backward()
            loss_sum = loss.detach()
        else:
            mine = route.llm_samples(self.replica * self.pp)  # the replica's stage 0
            rlens = route.table[mine, _LLM]
            cu = np.concatenate([[0], np.cumsum(rlens)])
            plans = self.microbatch_plans(route)
            mb, plan = plans[self.replica]
            schedule = self._schedule(mb, plan.chains)
            slots = sum(m * self.cfg.n_microbatches for m, _ in plans)
            pipeline = {
                "mb_tokens": [m for m, _ in plans],
                "padding": 1.0 - float(route.table[:, _LLM].sum()) / slots if slots else 0.0,
                "empty_microbatches": sum(sum(1 for r in p.rows if not r) for _, p in plans),
                "cut_samples": sum(p.n_cut for _, p in plans),
                "longest_chain": max(max(p.chains) for _, p in plans),
            }
            doc = doc_rows(plan, rlens, mb)  # on the host: every stage reads its rows' layout
            for st in self.stages:
                st.host_rows = row_layouts(doc)
            if self.stage == 0:
                x = model.llm.embed(ids, pos, img_in, local.image_token_id, extra)
                packed = pack_rows(x, cu, plan, mb, 0.0)
                leaf = packed.detach().requires_grad_()
                schedule.step(leaf, doc.to(self.device))
                packed.backward(leaf.grad)
            elif self.stage == self.pp - 1:
                # targets stay on the host: the loss finds their positions without a device sync
                tgt = shifted_labels(local.labels, local.label_cu_seqlens)
                losses: list = []
                schedule.step(target=pack_rows(tgt, cu, plan, mb, -100), losses=losses)
                loss_sum = torch.stack(losses).sum().detach()
            else:
                schedule.step()
            for st in self.stages:  # every row's layout was read, by its own forward
                assert not st.host_rows, f"{len(st.host_rows)} row layouts left unread"
                st.host_rows = None
        t_llm = time.perf_counter() - t_llm
        if self.pp > 1:  # each stage's own compute: its busy time, over its replica's samples
            timer.add("llm", sum(st.timer.busy for st in self.stages), rlens.tolist())
        # the exchange's backward (the image tokens' gradients to the ranks that encoded them;
        # zeros from the pipeline's other stages), then the encoder's backward
        t_x = time.perf_counter()
        grad = img_in.grad if img_in.grad is not None else torch.zeros_like(img)
        if img.requires_grad:
            img.backward(grad)
        timer.wait("exchange", time.perf_counter() - t_x)
        if emb.requires_grad:
            with timer.phase("vision"):
                g = emb_leaf.grad if emb_leaf.grad is not None else torch.zeros_like(emb)
                emb.backward(g)
        if audio:  # the same for the audio encoder: its tokens' gradients home, then its own
            audio_backward(audio, timer)
        # model FLOPs of the work this rank did: its images, and its (replica's) LLM samples
        rows = local.llm_index if self.pp == 1 else mine if self.stage == 0 else []
        llm_lens = route.table[rows, _LLM].tolist()
        # the LM head runs at the target positions only (the chunked loss picks them)
        targets = int(route.table[rows, _TGT].sum())
        heard = local.encoders["audio"].units[:, 0].tolist() if audio else []
        flops = training_flops(model.cfg, llm_lens, units, targets=targets, audio_frames=heard)
        self._all_reduce_grads()
        dist.all_reduce(loss_sum)
        summary = route.summary()
        return {
            "loss": float(loss_sum),
            "autocast": torch.is_autocast_enabled(self.device.type),
            "targets": normalizer,
            LLM_TOKENS: int(route.table[:, _LLM].sum()),
            VIT_TOKENS: int(route.table[:, 1].sum()),
            "redistribute_seconds": t_redis,
            "llm_seconds": t_llm,
            "stage_busy": sum(st.timer.busy for st in self.stages),
            "model_flops": flops,
            "route": summary,
            "loads": {k: np.asarray(v).tolist() for k, v in route.loads.items()},
            # row size per replica, padding share of all microbatch slots, empty microbatches
            "pipeline": pipeline,
        }

    def _all_reduce_grads(self) -> None:
        for params, group in self._reduce:
            if not params:
                continue
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=group)
            off = 0
            for p in params:
                n = p.numel()
                p.grad = flat[off : off + n].view_as(p).clone()
                off += n

    def step(self, batch: dict) -> dict:
        t0 = time.perf_counter()
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        out = self.forward_backward(batch)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(self.device)
            out["peak_allocated"] = torch.cuda.max_memory_allocated(self.device)
            out["peak_reserved"] = torch.cuda.max_memory_reserved(self.device)
            stats = torch.cuda.memory_stats(self.device)
            # cumulative: the allocator's frees-and-retries (each one stalls the step) and its
            # device allocations (cudaMalloc calls) since the start
            out["alloc_retries"] = stats.get("num_alloc_retries", 0)
            out["device_allocs"] = stats.get("num_device_alloc", 0)
        out["seconds"] = time.perf_counter() - t0
        return out
