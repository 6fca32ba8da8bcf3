"""Where a group's collectives run: flat, or in two tiers (its node's ranks in a node-local
directory, one leader per node in the shared one), decided alike on every rank of the group.

The decision reads only what every rank read from the same rendezvous record (each member's
node and machine) and FSDIST_ALGO, which could differ between ranks and is therefore checked
against rank 0's through the store.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..defaults import ENV_ALGO, ENV_LOCAL_DIR, ENV_NODE_ID, local_dir
from ..files.trust import node_directory
from ..job.generation import Generation
from ..job.liveness import PeerWatch
from ..job.nodes import Nodes
from ..protocol import layout
from ..transport.tiers import NodeTiers
from .store import DirectoryStore

__all__ = ["two_tiers"]


def two_tiers(
    store: DirectoryStore, generation: Generation, global_ranks: Sequence[int], rank: int, directory: str,
    timeout: float,
) -> NodeTiers | None:  # fmt: skip
    """The group's two tiers where its collectives should run in two (``FSDIST_ALGO``), else None.

    Every rank must decide alike, or some would wait in tiers that others never enter: the
    decision is made from the node ids every rank read from the same rendezvous record, and
    FSDIST_ALGO (which could differ) is checked against rank 0's through the store.
    """
    algo = os.environ.get(ENV_ALGO, "auto")
    if algo not in ("auto", "flat", "hier"):
        raise ValueError(f"{ENV_ALGO}={algo!r}: expected auto, flat or hier")
    nodes = Nodes.of([generation.members[g].placement for g in global_ranks])
    use = algo == "hier" or (algo == "auto" and nodes.tiers_help())
    key = layout.GROUP_ALGO_KEY + os.path.basename(directory)
    if rank == 0:
        store.set(key, "hier" if use else "flat")
    elif (decided := store.get(key).decode()) != ("hier" if use else "flat"):
        raise ValueError(
            f"rank {rank}: this rank would run the group's collectives {'hier' if use else 'flat'} "
            f"({ENV_ALGO}={algo}), rank 0 runs them {decided}: set {ENV_ALGO} alike on every rank"
        )
    if not use:
        return None
    if not os.environ.get(ENV_LOCAL_DIR):  # the default (/dev/shm) is one machine's own
        for ranks in nodes.members:
            machines = {generation.members[global_ranks[r]].machine for r in ranks}
            if len(machines) > 1:  # every rank finds the same, so every rank raises it
                raise ValueError(
                    f"ranks {', '.join(str(r) for r in ranks)} of this group count as one node "
                    f"({generation.members[global_ranks[ranks[0]]].placement!r}) but run on {len(machines)} "
                    f"machines, whose {local_dir()} they cannot share: give each machine its own "
                    f"{ENV_NODE_ID}, or point {ENV_LOCAL_DIR} at a directory these ranks do share"
                )

    def watch_of(ranks: Sequence[int]) -> PeerWatch:
        job_ranks = [global_ranks[r] for r in ranks]
        return PeerWatch(
            [generation.members[g] for g in job_ranks], [generation.heartbeat_path(g) for g in job_ranks], ranks
        )

    placement = generation.members[global_ranks[rank]].placement
    node_tier = layout.node_group_dir(node_directory(), generation.generation_id, placement, directory)
    leaders_directory = os.path.join(directory, layout.LEADERS_DIR)
    return NodeTiers(nodes, rank, node_tier, leaders_directory, watch_of, timeout)
