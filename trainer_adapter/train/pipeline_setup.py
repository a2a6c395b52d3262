"""The pipeline set-up of a :class:`~trainer_adapter.train.trainer.Trainer` (``pp > 1``):
OmniBal's partition search over timed layers on rank 0 (which LLM layers each stage holds),
this rank's stage modules, the ``torch.distributed.pipelining`` schedules (one per row size,
built on first use with their shapes given up front) and every replica's microbatch plans.

The layers are timed on a probe of one block built apart from the model, in the step's
precision, with the head and loss run as training runs them (chunked, at the target positions
only), so the search balances what the stages will really do."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from trainer_adapter.train.loss import chunk_tokens_for, chunked_lm_loss
from trainer_adapter.train.model import VLMConfig, compile_blocks
from trainer_adapter.train.partition import profile_layers, search_partition, stage_ranges
from trainer_adapter.train.pipeline import StageModule, bucket_ladder, make_schedule, plan_step
from trainer_adapter.train.split_samples import ChainSchedule

__all__ = ["PipelineSetup", "blocks_of"]

_LLM = 0  # the route table's column of LLM tokens


def blocks_of(lo: int, hi: int, n_blocks: int) -> range:
    """LLM blocks of pipelined layers [lo, hi) (layer 0 is the embedding, n_blocks + 1 the head)."""
    return range(max(lo - 1, 0), min(hi - 1, n_blocks))


class PipelineSetup:
    """What a Trainer with ``pp > 1`` builds before its first step, and the schedule and
    microbatch plans each step takes (a mixin: it reads the Trainer's ``cfg``, ``rank``,
    ``stage``, ``pp``, ``device``, ``model``, ``mb_tokens``, ``cost_model``, ``loss_fn``,
    ``target_share`` and ``_autocast``)."""

    def _layer_fns(self, model_cfg: VLMConfig):
        """Callables running each pipelined layer (embedding, blocks, head) on a typical row, on
        a probe of one block (the LLM's blocks are alike) built apart from the model, and the
        probe modules each layer range uses."""
        from dataclasses import replace

        from trainer_adapter.train.model import LanguageModel

        n_blocks, t = model_cfg.llm_layers, self.mb_tokens
        probe = LanguageModel(replace(model_cfg, llm_layers=1))
        compile_blocks(probe, self.cfg.compile)  # timed as the stages will run it
        seg = [min(512, t)] * (t // min(512, t)) + ([t % min(512, t)] if t % min(512, t) else [])
        ids = torch.randint(0, model_cfg.vocab_size, (t,))
        pos = torch.cat([torch.arange(s) for s in seg]).to(self.device)
        x = probe.tok(ids).detach().to(self.device)
        # the head and loss as training runs them: chunked, at the target positions only (the
        # row's first target_share of tokens here), the chunks' head recomputed in backward
        target = ids.clone()
        target[max(1, round(self.target_share * t)) :] = -100
        chunk = chunk_tokens_for(model_cfg.vocab_size)
        block = probe.blocks[0]

        def layers(lo, hi):
            mods = [probe.pos] if lo == 0 else []
            mods += [block] if len(blocks_of(lo, hi, n_blocks)) else []
            return mods + ([probe.norm, probe.head] if hi > n_blocks + 1 else [])

        def run(lo, hi):
            def fn():
                h = x.detach().requires_grad_()
                y = h
                for i in range(lo, hi):
                    if i == 0:
                        y = y + probe.pos(pos)
                    elif i <= n_blocks:
                        y = block(y, seg)
                    else:
                        y = chunked_lm_loss(
                            y, target, probe.logits, normalizer=1.0, chunk_tokens=chunk
                        )
                y.sum().backward()

            return fn

        return run, layers

    def _choose_partition(self, model_cfg: VLMConfig, pp_group):
        """OmniBal's partition search on rank 0 (shared with every rank); returns which LLM
        parts this rank keeps."""
        cfg = self.cfg
        n_blocks = model_cfg.llm_layers
        n_stages = cfg.pp * cfg.stages_per_rank
        n_layers = n_blocks + 2
        if n_stages > n_layers:
            raise ValueError(f"{n_stages} pipeline stages for {n_layers} layers; use fewer stages")
        bounds = [None]
        if self.rank == 0:  # profile and search on one rank, then share the choice
            run, layers = self._layer_fns(model_cfg)

            def timed(lo, hi, repeats):
                """Seconds of layers [lo, hi); the probe visits the device for the measurement
                only."""
                mods = layers(lo, hi)
                for m in mods:
                    m.to(self.device)
                try:  # in the step's precision: bf16 layers time as they will run
                    with self._autocast():
                        return profile_layers([run(lo, hi)], repeats=repeats)[0]
                finally:
                    for m in mods:
                        m.cpu()

            times = np.array([timed(i, i + 1, 2) for i in range(n_layers)])
            acts = [float(self.mb_tokens * model_cfg.llm_hidden)] * n_layers

            def trial(b):
                return max(timed(lo, hi, 1) for lo, hi in stage_ranges(b, n_layers))

            best, ranked = search_partition(
                times,
                acts,
                n_stages,
                radius=cfg.partition_radius,
                top_k=cfg.partition_top_k,
                comm_weight=0.0,
                trial=trial,
            )
            bounds = [
                {
                    "bounds": best.bounds,
                    "layer_seconds": times.tolist(),
                    "candidates": [(p.bounds, p.variance, p.trial_seconds) for p in ranked],
                }
            ]
        dist.broadcast_object_list(bounds, src=0)
        self.partition = bounds[0]
        ranges = stage_ranges(self.partition["bounds"], n_layers)
        self._pp_group, self._n_stages, self._n_blocks = pp_group, n_stages, n_blocks
        self._ranges = ranges
        mine = list(range(self.stage, n_stages, cfg.pp))
        own = set()
        for k in mine:
            lo, hi = ranges[k]
            own |= {f"block{i}" for i in blocks_of(lo, hi, n_blocks)}
        if 0 in mine:
            own |= {"tok", "pos"}
        if n_stages - 1 in mine:
            own |= {"norm", "head"}
        return own.__contains__

    def _build_stages(self) -> None:
        """This rank's stage modules over the layers it kept."""
        cfg, llm = self.cfg, self.model.llm
        for k in range(self.stage, self._n_stages, cfg.pp):
            blocks = blocks_of(*self._ranges[k], self._n_blocks)
            last = k == self._n_stages - 1
            self.stages.append(StageModule(llm, blocks.start, blocks.stop, last=last))
            if last:  # the schedule runs the LM head and the loss after this stage's forward
                self.loss_fn.timer = self.stages[-1].timer
        self.buckets = bucket_ladder(self.mb_tokens, cfg.bucket_ratio)
        self._schedules: dict[int, object] = {}

    def _stage_shapes(self, stage: StageModule, mb_tokens: int) -> dict:
        """A stage's input and output shapes, given up front (meta tensors): without them
        ``torch.distributed.pipelining`` infers them by running the stage forward and backward
        on uninitialised receive buffers inside the first step, and our stages' forward reads
        its sample layout from that input (segments, cut samples), so a run over garbage is
        both slow and unsafe (observed: a later microbatch's loss and every gradient off by up
        to 15 %, intermittently, with gloo)."""
        llm = self.model.llm.cfg
        dtype = next(self.model.vision.parameters()).dtype

        def hidden(width, dt=dtype):
            return torch.empty(1, mb_tokens, width, dtype=dt, device="meta", requires_grad=True)

        doc = torch.empty(1, mb_tokens, dtype=torch.int64, device="meta")
        # the last stage hands its loss the final norm's output: fp32 also under bf16 autocast
        # (layer norm runs in fp32 there), the LM head runs inside the loss
        out = hidden(llm.llm_hidden) if stage.last else (hidden(llm.llm_hidden), doc)
        return {"input_args": (hidden(llm.llm_hidden), doc), "output_args": out}

    def _schedule(self, mb_tokens: int, chains: tuple[int, ...]):
        """The schedule for microbatch rows of ``mb_tokens`` (built on first use, then reused:
        a pipeline schedule runs one fixed shape); where samples are cut across rows, the
        chain schedule (a chain's backwards in reverse), set to this step's chains."""
        from torch.distributed.pipelining import PipelineStage

        chained = any(c > 1 for c in chains)
        key = (mb_tokens, chained)
        if key not in self._schedules:
            cfg, n_stages = self.cfg, self._n_stages
            pipe = [
                PipelineStage(
                    m,
                    k,
                    n_stages,
                    self.device,
                    group=self._pp_group,
                    **self._stage_shapes(m, mb_tokens),
                )
                for m, k in zip(self.stages, range(self.stage, n_stages, cfg.pp), strict=True)
            ]
            make = ChainSchedule if chained else make_schedule
            self._schedules[key] = make(cfg.schedule, pipe, cfg.n_microbatches, self.loss_fn)
        schedule = self._schedules[key]
        if chained:
            schedule.set_chains(chains)
        return schedule

    def microbatch_plans(self, route) -> list[tuple[int, object]]:
        """(row size, plan) of every replica's samples this step (each rank of a replica computes
        the same, from the shared route table)."""
        out = []
        for r in range(self.cfg.dp):
            lens = route.table[route.llm_samples(r * self.pp), _LLM]
            out.append(
                plan_step(
                    lens,
                    self.cfg.n_microbatches,
                    self.buckets,
                    self.pp,
                    alpha=self.cost_model.llm.alpha,
                    beta=self.cost_model.llm.beta,
                    gamma=self.cost_model.llm.gamma,
                    split=self.cfg.split_samples,
                )
            )
        return out
