"""A generation's streams: one per DP rank of the plan ((node, local rank) = rank), each a list
of shards, each shard a list of groups (one per step: the byte range of its members in the tar).

The dataclasses both write (``to_json``: the manifest's form) and read (``from_json``: checked,
naming the manifest and the field); :func:`structure_problem` checks what the loader's
exactly-once promise rests on.
"""

from __future__ import annotations

from dataclasses import dataclass

from equishard.contracts.generation_names import (
    ManifestError,
    check_digest,
    check_member_path,
    need_count,
    need_field,
)

__all__ = ["Group", "Shard", "Stream", "structure_problem"]


@dataclass(frozen=True, slots=True)
class Group:
    """One step's samples of one rank: ``length`` bytes from ``offset`` in its shard."""

    step: int
    samples: int
    offset: int
    length: int

    def to_json(self) -> list[int]:
        return [self.step, self.samples, self.offset, self.length]

    @classmethod
    def from_json(cls, raw, where: str) -> Group:
        if not (isinstance(raw, list) and len(raw) == 4 and all(isinstance(x, int) for x in raw)):
            raise ManifestError(
                f"{where}: a group must be [step, samples, offset, length], got {raw!r}"
            )
        return cls(*raw)


@dataclass(frozen=True, slots=True)
class Shard:
    """One tar file of a stream, its size, digest, samples and groups."""

    file: str
    bytes: int
    sha256: str
    samples: int
    groups: tuple[Group, ...]

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "samples": self.samples,
            "groups": [g.to_json() for g in self.groups],
        }

    @classmethod
    def from_json(cls, raw, where: str) -> Shard:
        if not isinstance(raw, dict):
            raise ManifestError(f"{where}: expected an object, got {type(raw).__name__}")
        groups = tuple(Group.from_json(g, where) for g in need_field(raw, "groups", list, where))
        shard = cls(
            file=check_member_path(need_field(raw, "file", str, where), where),
            bytes=need_count(raw, "bytes", where),
            sha256=check_digest(need_field(raw, "sha256", str, where), where),
            samples=need_count(raw, "samples", where),
            groups=groups,
        )
        if sum(g.samples for g in groups) != shard.samples:
            raise ManifestError(
                f"{where} ({shard.file}): group sample counts add to "
                f"{sum(g.samples for g in groups)}, the shard says {shard.samples}"
            )
        return shard


@dataclass(frozen=True, slots=True)
class Stream:
    """The shards of one DP rank, in the order the loader reads them."""

    node: int
    local_rank: int
    rank: int
    shards: tuple[Shard, ...]

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "local_rank": self.local_rank,
            "rank": self.rank,
            "shards": [s.to_json() for s in self.shards],
        }

    @classmethod
    def from_json(cls, raw, where: str) -> Stream:
        if not isinstance(raw, dict):
            raise ManifestError(f"{where}: expected an object, got {type(raw).__name__}")
        shards = tuple(
            Shard.from_json(sh, f"{where} shard {j}")
            for j, sh in enumerate(need_field(raw, "shards", list, where))
        )
        return cls(
            node=need_field(raw, "node", int, where),
            local_rank=need_field(raw, "local_rank", int, where),
            rank=need_field(raw, "rank", int, where),
            shards=shards,
        )


def structure_problem(
    path, streams: list[Stream], steps: int, nodes: int, per: int, totals: dict, report: dict
) -> str | None:
    """Why the streams break what the loader's exactly-once promise rests on (None: they do
    not): ranks 0..D-1 each once at their (node, local rank); every stream has exactly one
    group per step (only the short last step may lack some, as many as the plan says); group
    byte ranges lie inside their shard in order; shard files are distinct; totals and the plan
    report agree with the groups."""
    if steps < 1:
        return f"{path}: layout.steps is {steps}; a generation has at least one step"
    ranks = sorted(st.rank for st in streams)
    if ranks != list(range(nodes * per)):
        return f"{path}: stream ranks {ranks} are not 0..{nodes * per - 1} once each"
    files: set[str] = set()
    short = bool(report.get("last_step", {}).get("short"))
    lacking_last = 0
    n_groups = n_bytes = 0
    for st in streams:
        where = f"{path} stream of rank {st.rank}"
        if (st.node, st.local_rank) != divmod(st.rank, per):
            return (
                f"{where}: node {st.node}, local rank {st.local_rank} do not match rank {st.rank} "
                f"with {per} ranks per node"
            )
        seen: list[int] = []
        for sh in st.shards:
            if sh.file in files:
                return f"{where}: shard {sh.file} is listed twice"
            files.add(sh.file)
            n_bytes += sh.bytes
            end = 0
            for g in sh.groups:
                if (
                    g.samples < 0
                    or g.offset < end
                    or g.length <= 0
                    or g.offset + g.length > sh.bytes
                ):
                    return (
                        f"{where}: group of step {g.step} in {sh.file} has byte range "
                        f"{g.offset}+{g.length} (samples {g.samples}), outside the shard's "
                        f"{sh.bytes} bytes or overlapping the group before it"
                    )
                end = g.offset + g.length
                seen.append(g.step)
        n_groups += len(seen)
        if seen != sorted(set(seen)):
            return f"{where}: steps {seen} are not one group per step in order"
        if seen and not 0 <= seen[0] <= seen[-1] < steps:
            return f"{where}: a group's step is outside 0..{steps - 1} (layout.steps)"
        # seen is sorted and distinct: it is 0..steps-1 exactly when it has ``steps`` entries
        # (never a list of ``steps`` items: that number comes from the manifest)
        if len(seen) != steps:
            if short and len(seen) == steps - 1 and (not seen or seen[-1] == steps - 2):
                lacking_last += 1
            else:
                have = set(seen)
                missing = [s for s in range(min(steps, len(seen) + 10)) if s not in have]
                return (
                    f"{where}: no group for step(s) {missing[:10]}; every rank needs exactly one "
                    "group per step"
                )
    empty = report.get("last_step", {}).get("empty_ranks", 0)
    if lacking_last and lacking_last > empty:
        return (
            f"{path}: {lacking_last} ranks lack a group in the last step, the plan left "
            f"{empty} empty"
        )
    for key, value in (("groups", n_groups), ("shards", len(files)), ("bytes", n_bytes)):
        if key in totals and totals[key] != value:
            return f"{path}: totals.{key} is {totals[key]}, the streams hold {value}"
    counts = report.get("counts") or {}
    for key, value in (("out", totals.get("samples")), ("groups", n_groups), ("steps", steps)):
        if key in counts and counts[key] != value:
            return f"{path}: the plan report says {counts[key]} {key}, the manifest has {value}"
    return None
