"""What runtime redistribution decided, and how data follows it: :class:`Route` holds the plan
every rank computed (each sample's encoder rank and LLM rank, per-rank loads before and after)
and moves rows, image embeddings (to the LLM rank, gradients back) and per-sample values;
:class:`LocalBatch` is a rank's share after it. Planned by :func:`trainer_adapter.redistribute`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from trainer_adapter.exchange import all_to_all_rows, collective_device
from trainer_adapter.topology import Topology

__all__ = ["EncoderBatch", "LocalBatch", "Route"]

# per-sample columns gathered from every rank
_LLM, _VIT, _UNITS, _IMG, _TGT = range(5)
_TOKEN_BYTES = 24  # an LLM token travels as its id, label and position (int64 each)


@dataclass(slots=True)
class EncoderBatch:
    """This rank's share of an encoder phase beyond vision (an audio encoder's): the global
    indices of the samples whose items it encodes, their payload rows (the phase's
    ``payload``, e.g. feature frames), their unit rows (e.g. each recording's frames) and the
    token id the outputs fill in ``input_ids``."""

    index: np.ndarray
    payload: torch.Tensor
    units: torch.Tensor
    token_id: int


@dataclass(slots=True)
class LocalBatch:
    """This rank's share after redistribution. ``*_index`` are global sample indices (source
    rank order, then position) in the order the rows are laid out. ``encoders``: the phases
    beyond vision, by name (:class:`EncoderBatch`)."""

    vision_index: np.ndarray
    patches: torch.Tensor
    units_hw: torch.Tensor
    llm_index: np.ndarray
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    label_index: np.ndarray
    labels: torch.Tensor
    label_cu_seqlens: torch.Tensor
    image_token_id: int
    encoders: dict = field(default_factory=dict)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for each pair."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offs = np.cumsum(counts) - counts
    return np.repeat(np.asarray(starts, dtype=np.int64) - offs, counts) + np.arange(total)


def _cu(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


@dataclass(slots=True)
class Route:
    """The plan every rank computed, and the exchanges that follow it.

    ``src``/``vit_dest``/``llm_dest``/``label_dest`` are per global sample (-1: no encoder work).
    ``encoders``: each phase beyond vision by name, ``(dest, rows, units, tokens)``: its
    destination per sample (-1: no item) and its columns of ``table`` (payload rows, units,
    output tokens). ``loads`` holds per-rank loads before/after per phase; ``bytes`` the bytes
    each exchange moved inside nodes and across them (a rank keeping its own sample moves
    nothing).
    """

    rank: int
    world: int
    group: dist.ProcessGroup | None
    topology: Topology
    table: np.ndarray
    src: np.ndarray
    vit_dest: np.ndarray
    llm_dest: np.ndarray
    label_dest: np.ndarray
    loads: dict = field(default_factory=dict)
    bytes: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    methods: dict = field(default_factory=dict)
    encoders: dict = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return int(self.src.size)

    def _count_bytes(self, name: str, rows: np.ndarray, s: np.ndarray, d: np.ndarray, row_bytes):
        moved = s != d
        node_s, node_d = s // self.topology.ranks_per_node, d // self.topology.ranks_per_node
        w = rows * float(row_bytes)
        entry = self.bytes.setdefault(name, {"intra_node": 0.0, "inter_node": 0.0})
        entry["intra_node"] += float(w[moved & (node_s == node_d)].sum())
        entry["inter_node"] += float(w[moved & (node_s != node_d)].sum())

    def move(
        self,
        x: torch.Tensor,
        rows: np.ndarray,
        at: np.ndarray,
        to: np.ndarray,
        name: str,
        *,
        stay: bool = False,
        copy_of: np.ndarray | None = None,
    ):
        """Move per-sample row blocks from rank ``at[i]`` to rank ``to[i]`` (global arrays; -1
        skips a sample). ``x`` holds this rank's blocks in global order; the result, the blocks
        this rank receives, in global order too: on ``x``'s device, or with ``stay`` on the
        collective's device (the GPU under NCCL), where the receiver uses it. ``copy_of``: per
        entry, the entry whose block it sends (itself, or for a copy an earlier entry of the
        same rank: a block sent to two ranks); ``x`` holds the blocks of the originals only."""
        keep = (at >= 0) & (to >= 0)
        n = at.size
        mine = np.flatnonzero(keep & (at == self.rank))
        perm = mine[np.argsort(to[mine], kind="stable")]
        pos = np.empty(n, dtype=np.int64)
        if copy_of is None:
            real = mine
            pos[mine] = _cu(rows[mine])[:-1]
        else:
            real = mine[copy_of[mine] == mine]
            pos[real] = _cu(rows[real])[:-1]
            pos[mine] = pos[copy_of[mine]]
        idx = _ranges(pos[perm], rows[perm])
        send = np.bincount(to[perm], weights=rows[perm], minlength=self.world).astype(np.int64)
        inc = np.flatnonzero(keep & (to == self.rank))
        recv = np.bincount(at[inc], weights=rows[inc], minlength=self.world).astype(np.int64)
        if x.shape[0] != int(rows[real].sum()):
            raise ValueError(
                f"{name}: {x.shape[0]} rows given, the plan expects {rows[real].sum()}"
            )
        out = x if np.array_equal(idx, np.arange(idx.size)) else x[torch.from_numpy(idx)]
        row_bytes = int(np.prod(x.shape[1:], dtype=np.int64)) * x.element_size()
        self._count_bytes(name, rows[keep], at[keep], to[keep], row_bytes)
        dev = collective_device(self.group)
        if (at[keep] == to[keep]).all():  # nothing changes rank (the same plan on every
            # rank, so every rank skips the exchange): no collective; a tensor of its own, as
            # the exchange gives, so that nothing done to it reaches the caller's
            got = out.to(dev, copy=out is x)
        else:
            got = all_to_all_rows(out.to(dev), send.tolist(), recv.tolist(), self.group)
        # rows arrive by source rank; put them in global order
        order = inc[np.argsort(at[inc], kind="stable")]
        home = dev if stay else x.device
        if np.array_equal(order, inc):
            return got.to(home)
        start = np.empty(n, dtype=np.int64)
        start[order] = _cu(rows[order])[:-1]
        back = _ranges(start[inc], rows[inc])
        return got[torch.from_numpy(back).to(got.device)].to(home)

    def vision_samples(self, rank: int | None = None) -> np.ndarray:
        return np.flatnonzero(self.vit_dest == (self.rank if rank is None else rank))

    def llm_samples(self, rank: int | None = None) -> np.ndarray:
        return np.flatnonzero(self.llm_dest == (self.rank if rank is None else rank))

    def label_samples(self, rank: int | None = None) -> np.ndarray:
        return np.flatnonzero(self.label_dest == (self.rank if rank is None else rank))

    def send_image_embeddings(self, embeds: torch.Tensor) -> torch.Tensor:
        """Image-token embeddings of this rank's encoder samples (global order, each sample's
        tokens in image order) -> those of its LLM samples, in the order their image tokens
        appear in ``input_ids``. Differentiable; every rank must call it (collective)."""
        return self._send_tokens(embeds, self.table[:, _IMG], self.vit_dest, "image_embeddings")

    def _send_tokens(self, embeds, tokens: np.ndarray, dest: np.ndarray, name: str):
        """Each sample's ``tokens`` output rows from its encoder rank ``dest`` to its LLM
        rank (samples without any stay out), timed as ``name``."""
        has = tokens > 0
        t0 = time.perf_counter()
        at, to = np.where(has, dest, -1), np.where(has, self.llm_dest, -1)
        out = self.move(embeds, tokens, at, to, name)
        self.seconds[name] = time.perf_counter() - t0
        return out

    def encoder_samples(self, name: str, rank: int | None = None) -> np.ndarray:
        """Global indices of the samples whose items of phase ``name`` this rank (or
        ``rank``) encodes."""
        return np.flatnonzero(self.encoders[name][0] == (self.rank if rank is None else rank))

    def send_embeddings(self, name: str, embeds: torch.Tensor) -> torch.Tensor:
        """:meth:`send_image_embeddings` for the phase ``name`` beyond vision (an audio
        encoder's output tokens: those of this rank's encoder samples, global order -> those
        of its LLM samples, in the order their tokens appear). Differentiable; collective."""
        dest, _, _, col = self.encoders[name]
        return self._send_tokens(embeds, self.table[:, col], dest, f"{name}_embeddings")

    def to_source(self, values: torch.Tensor) -> torch.Tensor:
        """One row per LLM sample of this rank (global order) -> one row per sample this rank
        held before redistribution, in its original order (e.g. per-sample losses)."""
        return self.move(
            values, np.ones(self.num_samples, dtype=np.int64), self.llm_dest, self.src, "results"
        )

    def summary(self) -> dict:
        def imb(x):
            x = np.asarray(x, dtype=np.float64)
            return float(x.max() / x.mean()) if x.size and x.mean() > 0 else 1.0

        return {
            "samples": self.num_samples,
            "methods": dict(self.methods),
            **{f"{k}_max_over_mean": imb(v) for k, v in self.loads.items()},
            "bytes": {k: dict(v) for k, v in self.bytes.items()},
            "seconds": dict(self.seconds),
        }
