"""Two-tier collectives: a node's ranks meet in its node-local directory, its leader in the shared one.

A group spread over nodes, several ranks on each, would otherwise have every rank write and
read the shared directory (on NFS: every lock, open and rename a round trip to one server).
Here, as in Open MPI's coll/han, each operation is an intra-node step, an inter-node step among
one leader per node (its lowest rank), and an intra-node step back:

=================  ===================================  =====================  ===================
operation          node, step 1 (to the leader)         leaders (shared dir)   node, step 2
=================  ===================================  =====================  ===================
all_reduce         reduce                               all_reduce             broadcast
reduce             reduce                               reduce to root's node  to the root, if
                                                                               not its leader
broadcast          (root's node: broadcast from root)   broadcast              broadcast
all_gather         gather                               all_gather of blocks   broadcast all
reduce_scatter     reduce (all N pieces)                reduce_scatter of      scatter
                                                        node blocks
barrier            arrive                               barrier                release
=================  ===================================  =====================  ===================

Shared-directory bytes per operation fall from per-rank to per-node: an all_reduce of S writes
S per node instead of ~S per rank, and the shared-directory calls are a leader's alone. The
partial reductions combine in node order, then rank order within a node: results are identical
on every rank, and equal to the flat algorithms' bit for bit where the reduction is exact
(integers, min/max, bitwise); float sums may differ from flat in the last bits, as a tree
differs from a ring. AVG and PREMUL_SUM sum through both tiers and scale once, at the end.

Steps: each tier is a channel of its own (``TieredChannel``), so the leaders' step numbers are
independent of the node's; within a node step 1 goes to the leader and step 2 comes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from ..transport.interfaces import TieredChannel
from ._common import read_part, reduce_into_own
from .allreduce import all_reduce_coalesced as flat_all_reduce
from .barrier import barrier as flat_barrier
from .broadcast import broadcast as flat_broadcast
from .reduce import reduce as flat_reduce
from .reduce_ops import ReduceKind, Reduction, finish

__all__ = ["all_gather", "all_reduce_coalesced", "barrier", "broadcast", "reduce", "reduce_scatter"]

TO_LEADER, FROM_LEADER = 1, 2


def _partial(reduction: Reduction) -> Reduction:
    """The reduction of the tiers before the last: AVG and PREMUL_SUM scale once, at the end."""
    if reduction.kind in (ReduceKind.AVG, ReduceKind.PREMUL_SUM):
        return replace(reduction, kind=ReduceKind.SUM)
    return reduction


def all_reduce_coalesced(h: TieredChannel, tensors: Sequence[torch.Tensor], reduction: Reduction) -> None:
    """Reduce each of ``tensors`` over every rank of every node, in place."""
    local, partial = h.local, _partial(reduction)
    if local is not None and local.rank != 0:
        local.publish(TO_LEADER, tensors, readers=[0])
        for part, tensor in enumerate(tensors):
            read_part(local, 0, FROM_LEADER, part, tensor)
        return
    if local is not None:
        for part, tensor in enumerate(tensors):
            reduce_into_own(local, TO_LEADER, part, partial, tensor)  # the leader is local rank 0
    if h.cross is not None:
        flat_all_reduce(h.cross, tensors, partial)
    for tensor in tensors:
        finish(reduction, tensor, h.size)
    if local is not None:
        local.publish(FROM_LEADER, tensors)


def reduce(h: TieredChannel, tensor: torch.Tensor, root: int, reduction: Reduction) -> None:
    """Leave the reduction of every rank's ``tensor`` in the root's; every other tensor unchanged."""
    local, partial, nodes = h.local, _partial(reduction), h.nodes
    root_node, root_local = nodes.node_of[root], nodes.local_rank(root)
    if local is not None and local.rank != 0:
        local.publish(TO_LEADER, [tensor], readers=[0])
        if h.rank == root:
            read_part(local, 0, FROM_LEADER, 0, tensor)
        return
    acc = tensor if h.rank == root else tensor.clone()  # a leader that is not the root keeps its input
    if local is not None:
        reduce_into_own(local, TO_LEADER, 0, partial, acc)
    if h.cross is not None:
        flat_reduce(h.cross, acc, root_node, partial)
    if nodes.node_of[h.rank] == root_node:
        finish(reduction, acc, h.size)
        if h.rank != root and local is not None:
            local.publish(FROM_LEADER, [acc], readers=[root_local])


def broadcast(h: TieredChannel, tensors: Sequence[torch.Tensor], root: int) -> None:
    """Copy the root's ``tensors`` into every rank's: within the root's node from the root, then
    to the other leaders, then within each other node from its leader."""
    root_node = h.nodes.node_of[root]
    mine = h.nodes.node_of[h.rank] == root_node
    if mine and h.local is not None:
        flat_broadcast(h.local, tensors, h.nodes.local_rank(root))
    if h.cross is not None:
        flat_broadcast(h.cross, tensors, root_node)
    if not mine and h.local is not None:
        flat_broadcast(h.local, tensors, 0)


def all_gather(h: TieredChannel, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]) -> None:
    """``outputs[rank][i] <- inputs[i] of rank`` for every rank: the leader gathers its node's
    inputs, the leaders exchange node blocks, each leader hands its node everything."""
    local, nodes = h.local, h.nodes
    every = [dest for by_rank in outputs for dest in by_rank]  # part k·len(inputs) + i: rank k's input i
    if local is not None and local.rank != 0:
        local.publish(TO_LEADER, inputs, readers=[0])
        for rank, by_rank in enumerate(outputs):
            for index, dest in enumerate(by_rank):
                if rank == h.rank:
                    dest.copy_(inputs[index])
                else:
                    read_part(local, 0, FROM_LEADER, rank * len(inputs) + index, dest)
        return
    node = nodes.node_of[h.rank]
    for local_rank, rank in enumerate(nodes.members[node]):
        for index, dest in enumerate(outputs[rank]):
            if rank == h.rank:
                dest.copy_(inputs[index])
            else:
                assert local is not None
                read_part(local, local_rank, TO_LEADER, index, dest)
    cross = h.cross
    if cross is not None:
        cross.publish(1, [dest for rank in nodes.members[node] for dest in outputs[rank]])
        for other, ranks in enumerate(nodes.members):
            if other != node:
                block = [dest for rank in ranks for dest in outputs[rank]]
                for part, dest in enumerate(block):
                    read_part(cross, other, 1, part, dest)
    if local is not None:
        local.publish(FROM_LEADER, every)


def reduce_scatter(
    h: TieredChannel,
    outputs: Sequence[torch.Tensor],
    inputs: Sequence[Sequence[torch.Tensor]],
    reduction: Reduction,
) -> None:
    """For each k: ``outputs[k] <- reduction over ranks of inputs[k][rank]``: the leader reduces its
    node's whole inputs, the leaders reduce-scatter node blocks, each leader scatters its block."""
    local, nodes, partial, size = h.local, h.nodes, _partial(reduction), h.size
    node = nodes.node_of[h.rank]
    if local is not None and local.rank != 0:
        local.publish(TO_LEADER, [piece for pieces in inputs for piece in pieces], readers=[0])
        mine = nodes.local_rank(h.rank)
        for k, output in enumerate(outputs):
            read_part(local, 0, FROM_LEADER, k * len(nodes.members[node]) + mine, output)
        return
    acc = [[piece.clone() for piece in pieces] for pieces in inputs]  # the inputs stay the caller's
    if local is not None:
        for k in range(len(inputs)):
            for rank in range(size):
                reduce_into_own(local, TO_LEADER, k * size + rank, partial, acc[k][rank])
    cross = h.cross
    if cross is not None:
        cross.publish(1, [piece for pieces in acc for piece in pieces])
        for k in range(len(inputs)):
            for rank in nodes.members[node]:
                reduce_into_own(cross, 1, k * size + rank, partial, acc[k][rank])
    block = [acc[k][rank] for k in range(len(inputs)) for rank in nodes.members[node]]
    for piece in block:
        finish(reduction, piece, size)
    for k, output in enumerate(outputs):
        output.copy_(acc[k][h.rank])
    if local is not None:
        local.publish(FROM_LEADER, block)


def barrier(h: TieredChannel) -> None:
    """Return once every rank of every node has entered: the leader waits for its node, the
    leaders for each other, then each leader releases its node."""
    local = h.local
    if local is not None and local.rank != 0:
        local.advance(TO_LEADER, waiters=[0])
        local.wait_for(0, FROM_LEADER)
        return
    if local is not None:
        for peer in range(1, local.size):
            local.wait_for(peer, TO_LEADER)
    if h.cross is not None:
        flat_barrier(h.cross)
    if local is not None:
        local.advance(FROM_LEADER)
