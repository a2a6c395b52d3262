"""Who does what in a redistribution: the node layout and which ranks take each phase.

Ranks are ranks of the process group passed to :func:`trainer_adapter.redistribute`. With plain
data parallelism every rank encodes images and runs the LLM. With pipeline parallelism the
images are still encoded on every rank (the encoder is replicated), the LLM inputs go to the
first pipeline stage of each replica and the labels to its last stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from equishard.common.values import check_count

__all__ = ["Topology"]


def _check_ranks(name: str, ranks: tuple[int, ...] | None) -> None:
    if ranks is None:
        return
    if not isinstance(ranks, tuple | list) or not ranks:
        raise ValueError(
            f"{name} must be a non-empty tuple of ranks, or None for all ranks; got {ranks!r}"
        )
    for r in ranks:
        check_count(f"each of {name}", r)
    if len(set(ranks)) != len(ranks) or min(ranks) < 0:
        raise ValueError(f"{name} must be distinct ranks >= 0, got {ranks}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    """``ranks_per_node``: consecutive group ranks share a node (the fast links).

    ``vision_ranks`` run the encoder, ``llm_ranks`` take the LLM inputs and ``label_ranks[j]``
    takes the labels of ``llm_ranks[j]``'s samples; ``None`` means every rank (labels: with the
    inputs).
    """

    ranks_per_node: int = 1
    vision_ranks: tuple[int, ...] | None = None
    llm_ranks: tuple[int, ...] | None = None
    label_ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_count("ranks_per_node (GPUs per node, e.g. 8)", self.ranks_per_node, 1)
        for name in ("vision_ranks", "llm_ranks", "label_ranks"):
            _check_ranks(name, getattr(self, name))
        if self.label_ranks is not None and len(self.label_ranks) != len(
            self.llm_ranks or self.label_ranks
        ):
            raise ValueError(
                "label_ranks must pair one to one with llm_ranks; give both with the same length"
            )

    @classmethod
    def pipeline(cls, *, dp: int, pp: int, ranks_per_node: int = 1) -> Topology:
        """Rank ``replica * pp + stage``: stage 0 takes the LLM inputs, stage pp-1 the labels."""
        if dp < 1 or pp < 1:
            raise ValueError(f"dp and pp must be >= 1, got dp={dp}, pp={pp}")
        return cls(
            ranks_per_node=ranks_per_node,
            vision_ranks=None,
            llm_ranks=tuple(r * pp for r in range(dp)),
            label_ranks=tuple(r * pp + pp - 1 for r in range(dp)),
        )

    def resolve(self, world: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(vision, llm, label) ranks for a group of ``world`` ranks."""
        if world % self.ranks_per_node:
            raise ValueError(
                f"{world} ranks do not split into nodes of {self.ranks_per_node}; "
                "set ranks_per_node to the number of ranks on each node"
            )
        everyone = tuple(range(world))
        vision = self.vision_ranks or everyone
        llm = self.llm_ranks or everyone
        label = self.label_ranks or llm
        for name, ranks in (("vision_ranks", vision), ("llm_ranks", llm), ("label_ranks", label)):
            if max(ranks) >= world:
                raise ValueError(f"{name} {ranks} name ranks outside a group of {world}")
        return vision, llm, label

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node
