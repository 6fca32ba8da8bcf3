"""Where a group's collectives run, flat or in two tiers, and the chooser that runs each there.

Two tiers: the node's ranks in a node-local directory, one leader per node in the shared one;
decided alike on every rank of the group when the group is made (``two_tiers``), when
``Collectives`` also binds each operation to its algorithm in the form decided. The decision reads only
what every rank read from the same rendezvous record (each member's node and machine) and
FSDIST_ALGO, which could differ between ranks and is therefore checked against rank 0's
through the store.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from .. import collectives as coll
from ..collectives import hierarchical as hier
from ..defaults import ENV_ALGO, ENV_LOCAL_DIR, ENV_NODE_ID, local_dir
from ..files.places import node_directory
from ..job.generation import Generation
from ..job.liveness import PeerWatch
from ..job.nodes import Nodes
from ..protocol import layout
from ..transport.group import GroupTransport
from ..transport.locality import Locality
from ..transport.tiers import NodeTiers
from .store import DirectoryStore
from .store_rendezvous import GroupSite

__all__ = ["Channel", "Collectives", "group_collectives", "two_tiers"]

Algorithm = Callable[..., None]
#: where a collective runs: the group's one directory, or its two tiers (each has ``enter``)
Channel = GroupTransport | NodeTiers
#: each collective's flat form (collectives/) and two-tier form (collectives/hierarchical.py),
#: called alike: (channel, *args); None where the operation has no two-tier form
FORMS: dict[str, tuple[Algorithm, Algorithm | None]] = {
    "broadcast": (coll.broadcast, hier.broadcast),
    "all_reduce": (coll.all_reduce_coalesced, hier.all_reduce_coalesced),
    "reduce": (coll.reduce, hier.reduce),
    "all_gather": (coll.all_gather, hier.all_gather),
    "reduce_scatter": (coll.reduce_scatter, hier.reduce_scatter),
    "barrier": (coll.barrier, hier.barrier),
    "gather": (coll.gather, None),
    "scatter": (coll.scatter, None),
    "all_to_all": (coll.all_to_all, None),
}


class Collectives:
    """A group's collectives, each run flat over its transport or in its two tiers, as the
    group was placed when it was made (the same on every rank)."""

    def __init__(self, flat: GroupTransport, tiers: NodeTiers | None) -> None:
        self.flat, self.tiers = flat, tiers
        #: each collective's (where it runs, its algorithm there), FORMS chosen once for the
        #: group: the adapter enters the channel and calls the algorithm with it, no lookup between
        self.forms: dict[str, tuple[Channel, Algorithm]] = {
            name: (tiers, tiered) if tiered is not None and tiers is not None else (flat, flat_form)
            for name, (flat_form, tiered) in FORMS.items()
        }

    def abort(self, reason: str) -> None:
        """Fail the group in every tier: each tier's waiters, on every node, end with ``reason``."""
        if self.tiers is not None:
            self.tiers.abort(reason)
        self.flat.abort(reason)

    def close(self) -> None:
        if self.tiers is not None:
            self.tiers.close()
        self.flat.close()


def group_collectives(site: GroupSite, rank: int, timeout: float) -> Collectives:
    """The transports of the group at ``site`` (this rank being ``rank`` of it) in its folder,
    and where its collectives run."""
    generation, global_ranks = site.generation, site.global_ranks
    one_client = len({generation.members[g].client for g in global_ranks}) == 1
    locality = Locality.of(site.directory, one_client, generation.records)
    watch = generation.peer_watch(global_ranks)
    flat = GroupTransport(site.directory, rank, len(global_ranks), watch, timeout, locality=locality)
    return Collectives(flat, two_tiers(site.store, generation, global_ranks, rank, flat, timeout))


def two_tiers(
    store: DirectoryStore, generation: Generation, global_ranks: Sequence[int], rank: int, flat: GroupTransport,
    timeout: float,
) -> NodeTiers | None:  # fmt: skip
    """The group's two tiers where its collectives should run in two (``FSDIST_ALGO``), else None.

    Every rank must decide alike, or some would wait in tiers that others never enter: the
    decision is made from the node ids every rank read from the same rendezvous record, and
    FSDIST_ALGO (which could differ) is checked against rank 0's through the store (FSDIST_IO
    was, at the job's first group: Generation.settle).
    """
    algo = os.environ.get(ENV_ALGO, "auto")
    if algo not in ("auto", "flat", "hier"):
        raise ValueError(f"{ENV_ALGO}={algo!r}: expected auto, flat or hier")
    nodes = Nodes.of([generation.members[g].placement for g in global_ranks])
    use = algo == "hier" or (algo == "auto" and nodes.tiers_help())
    directory = flat.directory
    key = layout.GROUP_ALGO_KEY + os.path.basename(directory)
    mine = "hier" if use else "flat"
    if rank == 0:
        store.set(key, mine)
    elif (decided := store.get(key).decode()) != mine:
        raise ValueError(
            f"rank {rank}: this rank would run the group's collectives as '{mine}' ({ENV_ALGO}={algo}), "
            f"rank 0 as '{decided}': set {ENV_ALGO} alike on every rank"
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
        return generation.peer_watch([global_ranks[r] for r in ranks], ranks)

    placement = generation.members[global_ranks[rank]].placement
    node_tier = layout.node_group_dir(node_directory(), generation.generation_id, placement, directory)
    leaders_directory = os.path.join(directory, layout.LEADERS_DIR)
    return NodeTiers(nodes, rank, node_tier, leaders_directory, watch_of, timeout, flat, generation.records)
