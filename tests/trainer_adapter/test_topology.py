"""``Topology`` worked by hand: which ranks take each phase, and which node a rank is on.

Planted bugs these catch: a pipeline's labels sent to its first stage instead of its last, the
labels of given LLM ranks defaulting to every rank instead of going with the inputs, nodes
numbered round-robin instead of by consecutive ranks."""

from __future__ import annotations

import pytest

from trainer_adapter import Topology


def test_pipeline_ranks_by_hand():
    # rank = replica * pp + stage: dp 2 x pp 3 -> replicas (0, 1, 2) and (3, 4, 5)
    vision, llm, label = Topology.pipeline(dp=2, pp=3).resolve(6)
    assert vision == (0, 1, 2, 3, 4, 5)  # the encoder is replicated on every rank
    assert llm == (0, 3)  # first stage of each replica
    assert label == (2, 5)  # last stage of each replica
    assert Topology.pipeline(dp=3, pp=1).resolve(3) == ((0, 1, 2), (0, 1, 2), (0, 1, 2))


def test_labels_go_with_the_inputs_unless_given():
    assert Topology(llm_ranks=(1, 3)).resolve(4) == ((0, 1, 2, 3), (1, 3), (1, 3))
    assert Topology(llm_ranks=(1, 3), label_ranks=(0, 2)).resolve(4)[2] == (0, 2)
    assert Topology().resolve(2) == ((0, 1), (0, 1), (0, 1))


@pytest.mark.parametrize(
    ("per_node", "nodes"), [(1, [0, 1, 2, 3]), (2, [0, 0, 1, 1]), (4, [0] * 4)]
)
def test_consecutive_ranks_share_a_node(per_node, nodes):
    t = Topology(ranks_per_node=per_node)
    assert [t.node_of(r) for r in range(4)] == nodes


def test_ranks_outside_the_group_are_refused():
    with pytest.raises(ValueError, match="outside a group of 4"):
        Topology(llm_ranks=(0, 4)).resolve(4)
    with pytest.raises(ValueError, match="pair one to one"):
        Topology(llm_ranks=(0, 1), label_ranks=(2,))
