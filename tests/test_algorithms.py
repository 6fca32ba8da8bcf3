"""Every collective algorithm × reduce op × world size 1–8, in one process, in milliseconds.

The algorithms in fsdist/collectives see only a CollectiveChannel; tests/memory_transport.py
implements one in memory (each rank a thread), so the very code the multi-process suite runs
over files is checked here against references, at world sizes where spawning ranks would cost
minutes. Sizes cover both all_reduce algorithms (one round, and sliced from 256 KiB at N ≥ 3).
"""

from __future__ import annotations

import functools
import importlib
import itertools
import time
from dataclasses import dataclass
from typing import Any
from unittest.mock import patch

import pytest
import torch

from fsdist import collectives as coll
from fsdist.collectives import hierarchical as hier
from fsdist.collectives.doubling import all_reduce_doubling
from fsdist.collectives.reduce_ops import ReduceKind, Reduction
from fsdist.collectives.rooted import all_reduce_rooted
from fsdist.errors import DesyncError
from fsdist.job.nodes import Nodes

from memory_transport import MemoryChannel, MemoryWorld, run_ranks
from reference import OPS, PREMUL_FACTOR, make_input, mismatch, reduce_reference, supported

WORLDS = range(1, 9)
#: 0-d, empty, small; all_reduce also one large enough for its sliced form (40,000 × 8 B > 256 KiB)
SHAPES = [(), (0,), (7,)]
LARGE = (40_000,)
DTYPES = [torch.float64, torch.int64, torch.float32]


def _roots(world: int) -> list[int]:
    """Every root up to 4 ranks; beyond, the first, second, middle and last (an algorithm's
    index arithmetic goes wrong at an end or next to one, and the cost of every root is N²)."""
    return list(range(world)) if world <= 4 else sorted({0, 1, world // 2, world - 1})


def _reduction(op: str) -> Reduction:
    return Reduction(ReduceKind[op], PREMUL_FACTOR if op == "PREMUL_SUM" else None)


def _cases(op: str | None = None, shapes: list[tuple[int, ...]] = SHAPES):
    for dtype, shape in itertools.product(DTYPES, shapes):
        if op is None or supported(op, dtype, all_reduce=True):
            yield dtype, shape


@functools.cache
def _inputs(world: int, seed: int, shape, dtype, op: str = "SUM") -> list[torch.Tensor]:
    """Every rank's input, made once for all ranks (each rank-thread used to make all N: O(N²));
    callers clone before writing."""
    return [make_input(seed, r, shape, dtype, op) for r in range(world)]


def _run(world: int, body) -> list[list[str]]:
    """``body(channel, seq_counter)`` per rank; returns each rank's list of failures."""

    def rank_main(ch: MemoryChannel) -> list[str]:
        failures: list[str] = []
        body(ch, failures)
        return failures

    return MemoryWorld(world).run(rank_main)


def _check(results: list[list[str]]) -> None:
    failures = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not failures, "\n".join(failures[:20])


def _note(failures: list[str], label: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    problem = mismatch(actual, expected)
    if problem:
        failures.append(f"{label}: {problem}")


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("op", OPS)
def test_all_reduce_and_coalesced(world: int, op: str) -> None:
    def body(ch: MemoryChannel, failures: list[str]) -> None:
        seq = 0
        for dtype, shape in _cases(op, [*SHAPES, LARGE]):
            inputs = _inputs(world, 1, shape, dtype, op)
            seq += 1
            ch.enter(seq, f"all_reduce {op} {dtype} {shape}")
            tensor = inputs[ch.rank].clone()
            coll.all_reduce(ch, tensor, _reduction(op))
            _note(failures, f"all_reduce {dtype} {shape}", tensor, reduce_reference(inputs, op))
        dtype = torch.float64 if supported(op, torch.float64) else torch.int64
        # all small (one message, or doubling); and small and large mixed (one all_reduce each)
        for shapes in ([(5,), (5,), (5,)], [(7,), LARGE, (), (3,)]):
            many = [_inputs(world, s, shape, dtype, op) for s, shape in enumerate(shapes)]
            seq += 1
            ch.enter(seq, f"all_reduce_coalesced {op} {shapes}")
            tensors = [inputs[ch.rank].clone() for inputs in many]
            coll.all_reduce_coalesced(ch, tensors, _reduction(op))
            for index, inputs in enumerate(many):
                _note(failures, f"coalesced {shapes} #{index}", tensors[index], reduce_reference(inputs, op))

    _check(_run(world, body))


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("op", OPS)
def test_reduce_and_reduce_scatter(world: int, op: str) -> None:
    def body(ch: MemoryChannel, failures: list[str]) -> None:
        seq = 0
        for (dtype, shape), root in itertools.product(_cases(op), _roots(world)):
            inputs = _inputs(world, 2, shape, dtype, op)
            seq += 1
            ch.enter(seq, f"reduce {op} {dtype} {shape} root {root}")
            tensor = inputs[ch.rank].clone()
            coll.reduce(ch, tensor, root, _reduction(op))
            if ch.rank == root:
                _note(failures, f"reduce {dtype} {shape} root {root}", tensor, reduce_reference(inputs, op))
        for dtype, shape in _cases(op):
            pieces = [_inputs(world, 3 + k, shape, dtype, op) for k in range(world)]  # pieces[k][r]
            seq += 1
            ch.enter(seq, f"reduce_scatter {op} {dtype} {shape}")
            output = torch.empty(shape, dtype=dtype)
            coll.reduce_scatter(ch, [output], [[pieces[k][ch.rank].clone() for k in range(world)]], _reduction(op))
            _note(failures, f"reduce_scatter {dtype} {shape}", output, reduce_reference(pieces[ch.rank], op))

    _check(_run(world, body))


@pytest.mark.parametrize("world", WORLDS)
def test_data_movement(world: int) -> None:
    def body(ch: MemoryChannel, failures: list[str]) -> None:
        seq = 0
        rank = ch.rank
        for dtype, shape in _cases():
            inputs = _inputs(world, 4, shape, dtype)
            for root in _roots(world):
                seq += 1
                ch.enter(seq, f"broadcast {dtype} {shape} {root}")
                tensor = inputs[rank].clone()
                coll.broadcast(ch, [tensor], root)
                _note(failures, f"broadcast root {root}", tensor, inputs[root])
                seq += 1
                ch.enter(seq, f"gather {dtype} {shape} {root}")
                outs = [torch.empty(shape, dtype=dtype) for _ in range(world)] if rank == root else []
                coll.gather(ch, outs, inputs[rank].clone(), root)
                for r, out in enumerate(outs):
                    _note(failures, f"gather root {root} from {r}", out, inputs[r])
                seq += 1
                ch.enter(seq, f"scatter {dtype} {shape} {root}")
                out = torch.empty(shape, dtype=dtype)
                coll.scatter(ch, out, [x.clone() for x in inputs] if rank == root else [], root)
                _note(failures, f"scatter root {root}", out, inputs[rank])
            seq += 1
            ch.enter(seq, f"all_gather {dtype} {shape}")
            outs = [[torch.empty(shape, dtype=dtype)] for _ in range(world)]
            coll.all_gather(ch, outs, [inputs[rank].clone()])
            for r, (out,) in enumerate(outs):
                _note(failures, f"all_gather from {r}", out, inputs[r])
            seq += 1
            ch.enter(seq, f"all_to_all {dtype} {shape}")
            sends = [_inputs(world, 10 + d, shape, dtype)[rank] for d in range(world)]  # rank -> d
            outs2 = [torch.empty(shape, dtype=dtype) for _ in range(world)]
            coll.all_to_all(ch, outs2, sends)
            for src, out in enumerate(outs2):
                _note(failures, f"all_to_all from {src}", out, _inputs(world, 10 + rank, shape, dtype)[src])
        seq += 1
        ch.enter(seq, "barrier")
        coll.barrier(ch)

    _check(_run(world, body))


def test_a_desync_is_caught_by_every_algorithm_s_waits() -> None:
    def body(ch: MemoryChannel, failures: list[str]) -> None:
        ch.enter(1, "all_reduce SUM" if ch.rank else "all_reduce MAX")
        coll.all_reduce(ch, torch.ones(3), _reduction("SUM" if ch.rank else "MAX"))

    with pytest.raises(DesyncError, match="ranks disagree on operation #1"):
        _run(3, body)


@pytest.mark.parametrize("world", WORLDS)
def test_every_rank_gets_the_same_bits_and_nobody_leaves_a_barrier_early(world: int) -> None:
    """Float sums depend on their order: every rank must still end with identical bits (DDP's
    replicas stay equal only then), whichever algorithm the size picks (one round, sliced,
    recursive doubling). And no rank may leave a barrier before the last one entered it."""
    entered: list[int] = []

    def body(ch: MemoryChannel) -> list[bytes]:
        bits = []
        for seq, shape in enumerate([(7,), (300,), LARGE], start=1):
            ch.enter(seq, f"all_reduce {shape}")
            tensor = make_input(seq, ch.rank, shape, torch.float32)
            coll.all_reduce(ch, tensor, _reduction("SUM"))
            bits.append(tensor.numpy().tobytes())
        for seq in range(10, 13):
            if ch.rank == seq % world:
                time.sleep(0.05)  # the late rank
            entered.append(ch.rank)
            ch.enter(seq, "barrier")
            coll.barrier(ch)
            assert len(entered) >= world * (seq - 9), f"rank {ch.rank} left barrier #{seq} early"
        return bits

    results = MemoryWorld(world).run(body)
    for rank, bits in enumerate(results):
        assert bits == results[0], f"rank {rank} got other bits than rank 0"


def test_a_small_all_reduce_goes_through_rank_0_from_4_to_31_ranks() -> None:
    """The choice every rank makes alike, from the group size and the bytes alone: through rank 0
    from 4 to 31 ranks (on one client or across clients, whose looks are paced), doubling above."""
    from fsdist.collectives.allreduce import small_form

    assert small_form(4, 8) is all_reduce_rooted
    assert small_form(31, 1024) is all_reduce_rooted
    assert small_form(32, 8) is all_reduce_doubling
    assert small_form(3, 8) is None  # one round: every rank reads 2 records
    assert small_form(4, 1025) is None  # not small


@pytest.mark.parametrize("world", [4, 5, 8, 31, 32])
def test_a_barrier_across_clients_goes_through_rank_0_and_nobody_leaves_early(world: int) -> None:
    """Across clients (every wait a look at the server) a barrier of 4 to 31 ranks goes through
    rank 0; from 32 by doubling. Either way no rank leaves before the last one entered."""
    from fsdist.collectives import doubling, rooted
    from fsdist.transport.locality import Locality

    entered: list[int] = []
    used: list[str] = []

    def body(ch: MemoryChannel) -> None:
        ch.locality = Locality(one_client=False, local=False, reuse_files=False)
        for seq in range(1, 4):
            if ch.rank == (seq * 3) % world:
                time.sleep(0.05)  # the late rank
            entered.append(ch.rank)
            ch.enter(seq, "barrier")
            coll.barrier(ch)
            assert len(entered) >= world * seq, f"rank {ch.rank} left barrier #{seq} early"

    def spy(name: str, form: Any) -> Any:
        def run(t: Any, *args: Any) -> None:
            used.append(name)
            form(t, *args)

        return run

    coll_barrier = importlib.import_module("fsdist.collectives.barrier")  # (coll.barrier: the function)
    with (
        patch.object(coll_barrier, "barrier_rooted", spy("rooted", rooted.barrier_rooted)),
        patch.object(coll_barrier, "barrier_doubling", spy("doubling", doubling.barrier_doubling)),
    ):
        MemoryWorld(world).run(body)
    assert set(used) == {"rooted" if world < 32 else "doubling"}


@pytest.mark.parametrize("world", [*WORLDS, 11, 16])
@pytest.mark.parametrize("form", ["doubling", "rooted"])
def test_both_small_all_reduce_forms_at_every_size(world: int, form: str) -> None:
    """The dispatch picks one small form by group size and clients (rooted below 32 ranks, on
    one client): each is tested here at every size, powers of two and not (doubling folds the
    extra ranks in), against the reference, coalesced too, and with the same bits on every rank."""
    run_form = all_reduce_doubling if form == "doubling" else all_reduce_rooted

    def body(ch: MemoryChannel) -> list[bytes]:
        bits = []
        cases = [
            ("SUM", torch.float32, [(7,)]),
            ("MAX", torch.int64, [()]),
            ("PRODUCT", torch.float64, [(3,), (0,), (2, 2)]),
        ]
        for seq, (op, dtype, shapes) in enumerate(cases, start=1):
            many = [_inputs(world, k, shape, dtype, op) for k, shape in enumerate(shapes)]
            ch.enter(seq, f"{form} {op} {shapes}")
            tensors = [inputs[ch.rank].clone() for inputs in many]
            run_form(ch, tensors, _reduction(op), 1)
            for tensor, inputs in zip(tensors, many, strict=True):
                problem = mismatch(tensor, reduce_reference(inputs, op))
                assert problem is None, f"{form} {op} {shapes} at world {world}, rank {ch.rank}: {problem}"
                bits.append(tensor.numpy().tobytes())
        return bits

    results = MemoryWorld(world).run(body)
    assert all(bits == results[0] for bits in results), "ranks ended with different bits"


# ---- two tiers (collectives/hierarchical.py) over one MemoryWorld per node and one for the leaders

#: ranks per node: even, odd, a one-rank node, all one-rank nodes (no node tiers), one node (no
#: leaders' tier), and 4 or 5 leaders (their tier by doubling for barriers, through rank 0 for
#: small all_reduces)
LAYOUTS = [(2, 2), (3, 1), (1, 3), (2, 3, 1, 2, 1), (1, 1, 1), (4,), (2, 2, 2, 2)]


@dataclass
class _Tiers:
    """One rank's TieredChannel over memory channels."""

    rank: int
    size: int
    nodes: Nodes
    local: MemoryChannel | None
    cross: MemoryChannel | None

    def enter(self, seq: int, description: str) -> None:
        for channel in (self.local, self.cross):
            if channel is not None:
                channel.enter(seq, description)


def _run_tiered(layout: tuple[int, ...], body) -> list[list[str]]:
    """``body(tiers, failures)`` on one thread per rank of ``layout``; each rank's failures."""
    nodes = Nodes.of([f"node{k}" for k, count in enumerate(layout) for _ in range(count)])
    node_worlds = [MemoryWorld(len(ranks)) if len(ranks) > 1 else None for ranks in nodes.members]
    leaders = MemoryWorld(len(nodes.members)) if len(nodes.members) > 1 else None
    worlds = [w for w in (*node_worlds, leaders) if w is not None]
    results: list[list[str]] = [[] for _ in range(nodes.size)]

    def rank_main(rank: int) -> None:
        node = nodes.node_of[rank]
        here = node_worlds[node]
        local = MemoryChannel(here, nodes.local_rank(rank)) if here is not None else None
        cross = MemoryChannel(leaders, node) if leaders is not None and rank == nodes.leader(node) else None
        body(_Tiers(rank, nodes.size, nodes, local, cross), results[rank])

    run_ranks(nodes.size, rank_main, worlds, 30)
    return results


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_two_tier_algorithms_against_references(layout: tuple[int, ...]) -> None:
    world = sum(layout)

    def body(h: _Tiers, failures: list[str]) -> None:
        seq, rank = 0, h.rank

        def enter(what: str) -> None:
            nonlocal seq
            seq += 1
            h.enter(seq, what)

        for op in OPS:
            for dtype, shape in _cases(op, [(), (0,), (7,), LARGE]):
                inputs = _inputs(world, 1, shape, dtype, op)
                enter(f"all_reduce {op} {dtype} {shape}")
                tensors = [inputs[rank].clone(), inputs[(rank + 1) % world].clone()]  # coalesced: two
                hier.all_reduce_coalesced(h, tensors, _reduction(op))
                _note(failures, f"all_reduce {op} {dtype} {shape}", tensors[0], reduce_reference(inputs, op))
                rolled = [inputs[(r + 1) % world] for r in range(world)]
                _note(failures, f"all_reduce {op} {dtype} {shape} #1", tensors[1], reduce_reference(rolled, op))
        for op in ("SUM", "MAX", "AVG", "BXOR"):
            dtype = torch.int64 if op == "BXOR" else torch.float64
            for root in range(world):
                inputs = _inputs(world, 2, (5,), dtype, op)
                enter(f"reduce {op} {root}")
                tensor = inputs[rank].clone()
                hier.reduce(h, tensor, root, _reduction(op))
                expected = reduce_reference(inputs, op) if rank == root else inputs[rank]
                _note(failures, f"reduce {op} root {root}", tensor, expected)
            pieces = [[_inputs(world, 3 + k, (3,), dtype, op)[r] for k in range(world)] for r in range(world)]
            enter(f"reduce_scatter {op}")
            outputs = [torch.empty(3, dtype=dtype), torch.empty(3, dtype=dtype)]
            hier.reduce_scatter(h, outputs, [pieces[rank], list(reversed(pieces[rank]))], _reduction(op))
            mine = [pieces[r][rank] for r in range(world)]
            _note(failures, f"reduce_scatter {op}", outputs[0], reduce_reference(mine, op))
            theirs = [pieces[r][world - 1 - rank] for r in range(world)]
            _note(failures, f"reduce_scatter {op} #1", outputs[1], reduce_reference(theirs, op))
        for root in range(world):
            inputs = _inputs(world, 4, (6,), torch.float32)
            enter(f"broadcast {root}")
            tensors = [inputs[rank].clone(), inputs[rank][:2].clone()]
            hier.broadcast(h, tensors, root)
            _note(failures, f"broadcast root {root}", tensors[0], inputs[root])
            _note(failures, f"broadcast root {root} #1", tensors[1], inputs[root][:2])
        inputs = _inputs(world, 5, (4,), torch.int32)
        enter("all_gather")
        outputs = [[torch.empty(4, dtype=torch.int32), torch.empty(2, dtype=torch.int32)] for _ in range(world)]
        hier.all_gather(h, outputs, [inputs[rank], inputs[rank][1:3] * 2])
        for r in range(world):
            _note(failures, f"all_gather from {r}", outputs[r][0], inputs[r])
            _note(failures, f"all_gather from {r} #1", outputs[r][1], inputs[r][1:3] * 2)
        enter("barrier")
        hier.barrier(h)

    _check(_run_tiered(layout, body))
