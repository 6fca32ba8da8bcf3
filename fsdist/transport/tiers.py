"""A group's two tiers over files: its node's ranks in a node-local directory, its leaders in the
shared one (the TieredChannel that collectives/hierarchical.py runs over).

Each tier is a GroupTransport of its own (its own state records, doorbells, messages, desync
checks), entered only for the operations that run in two tiers: the node tier by every rank of a
node, the leaders' tier by the lowest rank of each node. Node-local directories live on the
node's own filesystem (FSDIST_LOCAL_DIR, default /dev/shm): ranks of one node never make the
shared filesystem's server carry what they say to each other.

A failure in one tier must end the waits in the others: ``abort`` marks every tier this rank
is in, and a rank that fails on seeing a peer's abort aborts its own tiers in turn (the
adapter aborts on any failure), so an error on one node reaches every rank of every node
through its leader.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..job.io_choice import Choice
from ..job.liveness import PeerWatch
from ..job.nodes import Nodes
from .group import GroupTransport
from .locality import Locality

__all__ = ["NodeTiers"]


class NodeTiers:
    """This rank's node tier and, on a leader, the leaders' tier (None where a tier would hold
    this rank alone)."""

    def __init__(
        self,
        nodes: Nodes,
        rank: int,
        node_directory: str,
        leaders_directory: str,
        watch_of: Callable[[Sequence[int]], PeerWatch],
        timeout: float,
        flat: GroupTransport,
        records: Choice | None = None,
    ) -> None:
        """``watch_of(ranks)``: a PeerWatch over those group ranks; ``flat``: the group's own
        transport, whose point-to-point messages go on beside the tiers; ``records``: how the
        job's records in its shared directory are read and written (the leaders' tier is there)."""
        self.nodes = nodes
        self._flat = flat
        self.rank = rank
        self.size = nodes.size
        node = nodes.node_of[rank]
        here = nodes.members[node]
        leaders = [nodes.leader(n) for n in range(len(nodes.members))]
        self.local: GroupTransport | None = None
        self.cross: GroupTransport | None = None
        if len(here) > 1:
            self.local = GroupTransport(  # node-local: one client, by construction
                node_directory, here.index(rank), len(here), watch_of(here), timeout, here, f"node {node}'s tier",
                Locality.of(node_directory, one_client=True),
            )  # fmt: skip
        if len(leaders) > 1 and rank == leaders[node]:
            self.cross = GroupTransport(
                leaders_directory, node, len(leaders), watch_of(leaders), timeout, leaders, "leaders' tier",
                Locality.of(leaders_directory, one_client=False, records=records),
            )  # fmt: skip

    def tiers(self) -> list[GroupTransport]:
        return [t for t in (self.local, self.cross) if t is not None]

    def enter(self, seq: int, description: str) -> None:
        """Start operation ``seq`` in every tier this rank is in. The counts of point-to-point
        messages this rank held back go out first, as the flat transport's ``enter`` sends them:
        a sender blocked on its cap may be needed in this operation."""
        self._flat.pairs.flush_acknowledgements()
        for tier in self.tiers():
            tier.enter(seq, description)

    def abort(self, reason: str) -> None:
        for tier in self.tiers():
            tier.abort(reason)

    def close(self) -> None:
        """Leave both tiers (the last rank out of each removes its directory)."""
        for tier in (self.cross, self.local):
            if tier is not None:
                tier.close()
