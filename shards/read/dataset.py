"""The streaming loader: one balanced group per training step, exactly once, resumable.

The plan has S steps x D ranks of groups. Each epoch orders the plan's steps by a seeded
permutation (the short last step, if any, stays last) and lays the groups out as slots
``(step, plan rank)``. Trainer rank w of W takes slot ``t * W + w`` at its step t, so:

* W == D: rank w reads its own stream, one group per step, with the plan's balance;
* W != D: the streams are re-split deterministically; every slot is still delivered once, but
  a step mixes groups of neighbouring plan steps, so the runtime balancer
  (``trainer_adapter``/``balancing.post_balance``) must even out what remains.

Every rank runs ``ceil(S * D / W)`` steps (a slot past the end is an empty group), so no rank
waits for another at a collective. DataLoader worker k of K takes steps ``start + k, +K, ...``,
which is the order a DataLoader's round-robin returns them in. Resumption is by the number of
slots consumed, so it works with any number of workers, any number of times, and across a change
of W (elastic): the remaining slots are exactly the uninterrupted remainder.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from equishard.common.values import check_count, check_flag, is_count
from shards.read.reader import ShardError, read_group
from shards.store.manifest import Manifest, open_generation

__all__ = ["MAX_EPOCH", "GroupDataset", "RankInfo", "merge_states", "open_generation"]

# the largest epoch (and consumed slot count) a loader takes: the shared [epoch, slot] pair is
# int64, and an epoch past it failed later as an overflow inside torch or numpy
MAX_EPOCH = 1 << 62


@dataclass(frozen=True, kw_only=True, slots=True)
class RankInfo:
    """Who is reading: DP rank and size, plus the node layout for locality and the workers."""

    rank: int
    world_size: int
    node: int = 0
    local_rank: int | None = None
    worker_id: int | None = None  # None: taken from the DataLoader worker (0 in the main process)
    num_workers: int | None = None

    def __post_init__(self) -> None:
        # each value decides which slots this reader takes: one out of range reads nothing, or
        # another reader's slots, silently (a sample then trained twice or never)
        for name in ("rank", "world_size", "node", "local_rank", "worker_id", "num_workers"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                raise ValueError(f"RankInfo.{name} must be a whole number, got {v!r}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank must be in [0, world_size), got {self.rank} of {self.world_size}"
            )
        if self.node < 0 or (self.local_rank is not None and self.local_rank < 0):
            raise ValueError(
                f"node and local_rank must be >= 0, got {self.node}, {self.local_rank}"
            )
        if (self.worker_id is None) != (self.num_workers is None):
            raise ValueError(
                "give worker_id and num_workers together (or neither: the DataLoader's are used)"
            )
        if self.worker_id is not None and not 0 <= self.worker_id < self.num_workers:
            raise ValueError(
                f"worker_id must be in [0, num_workers), got {self.worker_id} of {self.num_workers}"
            )

    def worker(self) -> tuple[int, int]:
        if self.worker_id is not None:
            return self.worker_id, self.num_workers
        info = get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)


def _as_is(item):
    """The loader's collate function: a group goes to the training loop as the dataset gave it."""
    return item


def merge_states(states: list[dict]) -> dict:
    """One resumable state from every rank's ``state_dict()``; rejects incomplete or mixed sets."""
    if not states:
        raise ValueError("no states given")
    if not all(isinstance(s, dict) for s in states):
        raise ValueError("every state must be a dict, as state_dict() returns")
    world = states[0].get("world_size")
    # read back from a checkpoint: compared before any list of that size is made
    if not is_count(world, 1) or len(states) != world:
        raise ValueError(
            f"{len(states)} states given for a world_size of {world!r}; need exactly one per rank"
        )
    if not all(is_count(s.get("rank")) for s in states):
        raise ValueError("every state's rank must be a whole number >= 0")
    ranks = sorted(s.get("rank") for s in states)
    if ranks != list(range(world)):
        raise ValueError(f"states of ranks {ranks} given; need exactly one per rank 0..{world - 1}")
    keys = ("generation", "seed", "shuffle", "epoch", "consumed_slots", "world_size")
    first = {k: states[0].get(k) for k in keys}
    for s in states[1:]:
        if {k: s.get(k) for k in keys} != first:
            raise ValueError(
                f"rank {s.get('rank')} is at {s} but rank 0 at {states[0]}: ranks disagree"
            )
    return first


def _dp_mismatch(manifest: Manifest, world: int) -> str:
    """What reading a plan for DP ``manifest.dp`` with ``world`` ranks does (warned once per
    process, generation and sizes: :mod:`warnings` shows a message once where it is raised)."""
    d, steps = manifest.dp, manifest.steps
    empty = manifest.report.get("last_step", {}).get("empty_ranks", 0)
    empty_text = (
        f"; the plan's short last step leaves {empty} of its {d} groups empty, which this "
        "job reads as empty steps"
        if is_count(empty, 1)
        else ""
    )
    return (
        f"{manifest.path}: the plan was balanced for DP {d} and this job reads it with world "
        f"size {world}: every group is still read exactly once ({steps * d} per epoch, "
        f"{math.ceil(steps * d / world)} steps a rank), but a step now mixes groups of "
        f"neighbouring plan steps, so only a runtime balancer evens its ranks{empty_text}. "
        f"For the plan's balance, balance and write again with --dp {world}"
    )


class GroupDataset(IterableDataset):
    """Yields ``{"epoch", "step", "rank", "samples", "skipped"}`` per step; ``samples`` are
    decoded by ``transform`` (default: :class:`shards.read.reader.ShardSample` as read).

    ``generation`` may be an fsspec URL (``s3://bucket/root``): each group is then one ranged
    GET, ``storage_options`` go to fsspec, and ``cache_dir`` keeps what was read on local disk
    (:mod:`shards.store.storage`); checks, schedule and state are the same as on local disk."""

    def __init__(
        self,
        generation: str | os.PathLike | Manifest,
        rank: RankInfo,
        *,
        seed: int = 0,
        shuffle: bool = True,
        verify: bool = False,
        on_error: str = "raise",
        max_consecutive_errors: int = 16,
        transform: Callable | None = None,
        storage_options: dict | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if not isinstance(rank, RankInfo):  # its checks decide which slots this reader takes
            raise ValueError(
                f"rank must be a RankInfo(rank=..., world_size=...), got {type(rank).__name__}"
            )
        seed = check_count("seed", seed)
        check_flag("shuffle", shuffle)
        check_flag("verify", verify)
        check_count("max_consecutive_errors", max_consecutive_errors)
        self.manifest = (
            generation
            if isinstance(generation, Manifest)
            else open_generation(generation, storage_options=storage_options, cache_dir=cache_dir)
        )
        self._files = self.manifest.storage
        if rank.world_size != self.manifest.dp:
            warnings.warn(_dp_mismatch(self.manifest, rank.world_size), stacklevel=2)
        self.rank = rank
        self.seed = seed
        self.shuffle = shuffle
        self.verify = verify
        self.on_error = on_error
        self.max_consecutive_errors = max_consecutive_errors
        self.transform = transform
        # [epoch, start slot] in shared memory: persistent DataLoader workers keep their own copy
        # of this object, but see set_epoch / load_state_dict made in the main process.
        self._pos = torch.zeros(2, dtype=torch.int64).share_memory_()
        self._index = self.manifest.group_index()

    @property
    def epoch(self) -> int:
        return int(self._pos[0])

    @property
    def _start_slot(self) -> int:
        return int(self._pos[1])

    # ------------------------------------------------------------------ schedule
    @property
    def slots_per_epoch(self) -> int:
        return self.manifest.steps * self.manifest.dp

    def __len__(self) -> int:
        """Steps this rank runs in the current epoch from where it starts."""
        return math.ceil((self.slots_per_epoch - self._start_slot) / self.rank.world_size)

    def step_order(self, epoch: int) -> np.ndarray:
        s = self.manifest.steps
        short = bool(self.manifest.report.get("last_step", {}).get("short"))
        n_full = s - 1 if short else s
        order = np.arange(s)
        if self.shuffle:
            order[:n_full] = np.random.default_rng([self.seed, epoch]).permutation(n_full)
        return order

    def slot(self, epoch: int, index: int) -> tuple[int, int] | None:
        """(plan rank, plan step) of global slot ``index`` (None past the end)."""
        if index >= self.slots_per_epoch:
            return None
        d = self.manifest.dp
        return index % d, int(self.step_order(epoch)[index // d])

    def my_slots(self, epoch: int) -> list[int]:
        w = self.rank.world_size
        return [self._start_slot + t * w + self.rank.rank for t in range(len(self))]

    # ------------------------------------------------------------------ state
    def loader(self, **kwargs) -> DataLoader:
        """A ``DataLoader`` over this dataset as it is meant to be read: one group per step
        (``batch_size=None``) handed over as the transform made it. A plain
        ``DataLoader(ds, batch_size=None)`` walks every group's nested data to convert it
        (``default_convert``), a third of the loop for groups of raw bytes. ``kwargs`` go to
        the ``DataLoader`` (``num_workers``, ``persistent_workers``, ``pin_memory``, ...)."""
        for fixed in ("batch_size", "collate_fn", "sampler", "batch_sampler", "shuffle"):
            if fixed in kwargs:
                raise ValueError(
                    f"loader() sets {fixed} itself (one whole group per step, in the plan's "
                    f"order); build a DataLoader yourself to change it"
                )
        return DataLoader(self, batch_size=None, collate_fn=_as_is, **kwargs)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (call before iterating each epoch)."""
        if (
            not isinstance(epoch, (int, np.integer))
            or isinstance(epoch, bool)
            or not 0 <= epoch <= MAX_EPOCH
        ):
            raise ValueError(f"epoch must be a whole number in [0, 2**62], got {epoch!r}")
        if epoch != self.epoch:
            self._pos[0] = epoch
            self._pos[1] = 0

    def state_dict(self, steps_done: int) -> dict:
        """State after this rank has consumed ``steps_done`` steps of the current iteration."""
        consumed = min(self._start_slot + steps_done * self.rank.world_size, self.slots_per_epoch)
        return {
            "generation": self.manifest.generation,
            "seed": self.seed,
            "shuffle": self.shuffle,  # with the seed, it decides the order of the steps
            "epoch": self.epoch,
            "consumed_slots": consumed,
            "world_size": self.rank.world_size,
            "rank": self.rank.rank,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume where ``state`` left off (any DP size: slots are global)."""
        missing = {"generation", "seed", "epoch", "consumed_slots"} - set(state)
        if missing:
            raise ValueError(f"incomplete loader state, missing {sorted(missing)}")
        if state["generation"] != self.manifest.generation:
            raise ValueError(
                f"state is for generation {state['generation']}, this loader reads {self.manifest.generation}"
            )
        if state["seed"] != self.seed:
            raise ValueError(
                f"state was saved with seed {state['seed']}, this loader has seed {self.seed}"
            )
        if state.get("shuffle") is not None and state["shuffle"] is not self.shuffle:
            raise ValueError(
                f"state was saved with shuffle={state['shuffle']!r}, this loader has "
                f"shuffle={self.shuffle}: the steps come in another order, so resuming would "
                "repeat some and skip others; build the loader as the state was saved"
            )
        for key in ("epoch", "consumed_slots"):  # a checkpoint is read back from outside
            v = state[key]
            if (
                not isinstance(v, (int, np.integer))
                or isinstance(v, bool)
                or not 0 <= v <= MAX_EPOCH
            ):
                raise ValueError(
                    f"loader state {key} is {v!r}; it must be a whole number in [0, 2**62]"
                )
        if not 0 <= state["consumed_slots"] <= self.slots_per_epoch:
            raise ValueError(
                f"consumed_slots {state['consumed_slots']} outside [0, {self.slots_per_epoch}]"
            )
        self._pos[0] = int(state["epoch"])
        self._pos[1] = int(state["consumed_slots"])

    # ------------------------------------------------------------------ reading
    def _read(self, plan_rank: int, plan_step: int) -> tuple[list, list[str]]:
        where = self._index.get((plan_rank, plan_step))
        if where is None:
            return [], []  # an empty slot of the short last step
        shard, group = where
        if self.verify and not self._files.checked(shard.sha256):
            # hashed once per process, with its groups' ranges: every group read from it later
            # is compared with the bytes that matched (read_group fails on a changed one)
            try:
                digest = self._files.sha256(
                    shard.file,
                    expected=shard.sha256,
                    ranges=[(g.offset, g.length) for g in shard.groups],
                    size=shard.bytes,
                )
            except OSError as exc:  # missing, unreadable, or replaced while being read
                raise ShardError(
                    f"{self._files.where(shard.file)}: cannot read for its checksum "
                    f"({type(exc).__name__}: {exc})"
                ) from None
            if digest != shard.sha256:
                raise ShardError(
                    f"{self._files.where(shard.file)}: sha256 {digest} does not match the "
                    f"manifest's {shard.sha256}"
                )
        return read_group(self._files, shard, group, keep_going=self.on_error == "skip")

    def _transform(self, samples: list) -> tuple[object, list[str]]:
        """``transform(samples)``; in skip mode a sample it cannot take (an image that does not
        decode, say) is left out whole and reported, and the rest of the group still goes."""
        try:
            return self.transform(samples), []
        except Exception:
            if self.on_error != "skip":
                raise
        good, bad = [], []
        for s in samples:
            try:
                self.transform([s])
                good.append(s)
            except Exception as exc:
                key = getattr(s, "key", "?")
                sid = getattr(s, "meta", {}).get("sample_id")
                bad.append(
                    f"sample {sid!r} (key {key!r}): transform failed: {type(exc).__name__}: {exc}"
                )
        return self.transform(good), bad

    def __iter__(self) -> Iterator[dict]:
        worker, workers = self.rank.worker()
        epoch = self.epoch  # read once: the schedule of this pass is fixed
        consecutive = 0
        for t, index in enumerate(self.my_slots(epoch)):
            if t % workers != worker:
                continue
            where = self.slot(epoch, index)
            samples, errors = self._read(*where) if where is not None else ([], [])
            good = len(samples)
            if self.transform is not None:
                samples, undecodable = self._transform(samples)
                errors += undecodable
                good -= len(undecodable)
            consecutive = 0 if good else consecutive + len(errors)
            if consecutive > self.max_consecutive_errors:
                raise ShardError(
                    f"{consecutive} consecutive unreadable samples; last: {errors[-1]}"
                )
            yield {
                "epoch": epoch,
                "step": t,
                "rank": self.rank.rank,
                "samples": samples,
                "skipped": errors,
            }
