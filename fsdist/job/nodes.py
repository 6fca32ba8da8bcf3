"""Which ranks of a group share a node: the placement two-tier collectives are built on.

A rank's node is the ``node`` of its rendezvous entry (``liveness.node_id``: FSDIST_NODE_ID, else
the kernel's boot id and pid namespace), so every rank, and ``fsdist status``, derives the same
placement from the same record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Nodes"]


@dataclass(frozen=True)
class Nodes:
    """Which ranks of a group share a node, as every rank computes it from the same node ids.

    Nodes are numbered in the order of their lowest rank, and a node's ranks in rank order: a
    node's *leader* is its lowest rank, and node ``k``'s leader is rank ``k`` of the leaders.
    """

    members: tuple[tuple[int, ...], ...]
    node_of: tuple[int, ...]

    @classmethod
    def of(cls, node_ids: Sequence[str]) -> Nodes:
        by_node: dict[str, list[int]] = {}
        for rank, node in enumerate(node_ids):
            by_node.setdefault(node, []).append(rank)
        members = tuple(tuple(ranks) for ranks in by_node.values())
        node_of = [0] * len(node_ids)
        for index, ranks in enumerate(members):
            for rank in ranks:
                node_of[rank] = index
        return cls(members, tuple(node_of))

    @property
    def size(self) -> int:
        return len(self.node_of)

    def local_rank(self, rank: int) -> int:
        return self.members[self.node_of[rank]].index(rank)

    def leader(self, node: int) -> int:
        return self.members[node][0]

    def tiers_help(self) -> bool:
        """Whether two tiers save shared-directory traffic: ≥ 2 nodes, and some node with ≥ 2 ranks."""
        return len(self.members) >= 2 and any(len(ranks) >= 2 for ranks in self.members)
