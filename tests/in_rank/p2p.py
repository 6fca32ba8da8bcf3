"""Point-to-point cases run inside every rank: send/recv, isend/irecv, tags, any-source."""

from __future__ import annotations

import torch
import torch.distributed as dist

from reference import DTYPES, SHAPES, make_input, mismatch, non_contiguous


def ring_every_dtype_and_shape() -> list[str]:
    """Each rank sends to the next and receives from the previous, blocking, every dtype × shape."""
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for dtype_name, dtype in DTYPES.items():
        for label, shape, noncontig in SHAPES:
            for seed in (1, 2):  # twice back to back
                mine = make_input(seed, rank, shape, dtype)
                theirs = make_input(seed, prev, shape, dtype)
                out = torch.zeros_like(theirs)
                if noncontig:
                    mine, out = non_contiguous(mine), non_contiguous(out)
                if rank % 2 == 0:  # buffered sends make either order safe; mix them anyway
                    dist.send(mine, nxt)
                    dist.recv(out, prev)
                else:
                    req = dist.irecv(out, prev)
                    dist.isend(mine, nxt).wait()
                    req.wait()
                problem = mismatch(out, theirs)
                if problem:
                    failures.append(f"{dtype_name} {label} #{seed}: {problem}")
    return failures


def tags_and_order() -> list[str]:
    """Receives match by tag, out of send order; same-tag messages arrive in send order."""
    rank = dist.get_rank()
    failures = []
    if rank == 0:
        for value, tag in [(1.0, 5), (2.0, 7), (3.0, 7), (4.0, 5)]:
            dist.send(torch.tensor([value]), 1, tag=tag)
    elif rank == 1:
        got = {}
        reqs = []
        for name, tag in [("a7", 7), ("a5", 5), ("b7", 7), ("b5", 5)]:
            buf = torch.zeros(1)
            reqs.append(dist.irecv(buf, 0, tag=tag))
            got[name] = buf
        for req in reqs:
            req.wait()
        expected = {"a7": 2.0, "a5": 1.0, "b7": 3.0, "b5": 4.0}
        actual = {k: v.item() for k, v in got.items()}
        if actual != expected:
            failures.append(f"tag matching: got {actual}, expected {expected}")
    dist.barrier()
    return failures


def a_message_passed_over_keeps_its_bytes() -> list[str]:
    """A message left for later (its tag not asked for yet) survives the sends that follow.

    Small messages travel in two slots of the sender's record, reused once the receiver has
    consumed enough messages; here it consumes later ones first, then more are sent, and only
    then is the first one asked for (lost before the fix: FileNotFoundError on a message file).
    """
    rank = dist.get_rank()
    failures: list[str] = []
    first = [(100, torch.tensor([100.0]))]
    before = [(1, torch.full((4,), 1.0))]  # #0 in slot 0, #1 in slot 1: #1 consumed, #2 may take slot 0
    after = [(200 + k, torch.full((3 if k != 1 else 40_000,), 200.0 + k)) for k in range(4)]
    if rank == 0:
        for tag, value in first + before:
            dist.send(value, 1, tag=tag)
        dist.barrier()
        for tag, value in after:
            dist.send(value, 1, tag=tag)
        dist.barrier()
    elif rank == 1:
        got = {}
        for tag, value in before:
            got[tag] = torch.zeros_like(value)
            dist.recv(got[tag], 0, tag=tag)
        dist.barrier()
        dist.barrier()
        for tag, value in first + after:
            got[tag] = torch.zeros_like(value)
            dist.recv(got[tag], 0, tag=tag)
        for tag, value in first + before + after:
            if not torch.equal(got[tag], value):
                failures.append(f"tag {tag}: got {got[tag][:3].tolist()}, sent {value[:3].tolist()}")
    else:
        dist.barrier()
        dist.barrier()
    failures += _passed_over_while_the_ring_laps(rank)
    return failures


def _passed_over_while_the_ring_laps(rank: int) -> list[str]:
    """A mid-size message left for later while 60 more go through its ring (4.8 MB, over two laps of
    the 2 MiB ring wherever it starts): its space is reused, so the receiver must have copied it
    when it passed it over (a held reference into the ring read 20000 of 20000 elements wrong)."""
    failures: list[str] = []
    early = torch.arange(20_000, dtype=torch.float32) + 0.5
    dist.barrier()  # earlier messages all received: the early one finds its slot free (not a file)
    if rank == 0:
        dist.send(early, 1, tag=100)
        for k in range(60):
            dist.send(torch.full((20_000,), float(k)), 1, tag=1)
            dist.recv(torch.zeros(1), 1, tag=2)  # one at a time: each finds the space before it free
    elif rank == 1:
        for k in range(60):
            out = torch.zeros(20_000)
            dist.recv(out, 0, tag=1)
            if not torch.equal(out, torch.full((20_000,), float(k))):
                failures.append(f"tag 1 #{k}: wrong values")
            dist.send(torch.zeros(1), 0, tag=2)
        out = torch.zeros(20_000)
        dist.recv(out, 0, tag=100)
        if not torch.equal(out, early):
            failures.append(f"the message passed over: {int((out != early).sum())} of 20000 elements wrong")
    dist.barrier()
    return failures


def mid_size_messages_out_of_order_every_byte_checked() -> list[str]:
    """Mid-size messages (ring files on local filesystems, transport/rings.py) beside inline ones and
    files, received in send order, in reverse (every earlier one passed over, so copied out of
    the ring before its space is reused) and shuffled; every element checked."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    failures: list[str] = []
    sizes = [300, 20_000, 70_000, 140_000]  # float32: inline, ring, ring, a file (past RING_MESSAGE_MAX)
    orders = [list(range(12)), list(reversed(range(12))), [5, 0, 11, 3, 1, 2, 4, 6, 7, 8, 9, 10]]
    for round_, order in enumerate(orders):

        def value(sender: int, k: int, round_: int = round_) -> torch.Tensor:
            return torch.arange(sizes[k % 4], dtype=torch.float32) + (sender * 1000 + round_ * 100 + k)

        requests = [dist.isend(value(rank, k), nxt, tag=k) for k in range(12)]
        for k in order:
            out = torch.zeros(sizes[k % 4])
            dist.recv(out, prev, tag=k)
            if not torch.equal(out, value(prev, k)):
                failures.append(f"round {round_}, tag {k}: {int((out != value(prev, k)).sum())} elements wrong")
        for request in requests:
            request.wait()
    return failures


def large_messages_come_back_through_kept_mappings() -> list[str]:
    """Large messages (files: spares rewritten in place, read and written through mappings kept
    by inode on local filesystems, files/mapped.py) going round a ring and out from a root for
    many rounds, each round's values new: a copy out of a mapping must see the latest message,
    never an earlier one written into the same inode; every element checked."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    failures: list[str] = []
    count = 300_000  # 1.2 MB: past the mapping threshold (256 KiB) and the rings
    for round_ in range(10):
        sent = torch.arange(count, dtype=torch.float32) + (rank * 100 + round_)
        out = torch.zeros(count)
        ops = [dist.P2POp(dist.isend, sent, nxt), dist.P2POp(dist.irecv, out, prev)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        want = torch.arange(count, dtype=torch.float32) + (prev * 100 + round_)
        if not torch.equal(out, want):
            failures.append(f"ring round {round_}: {int((out != want).sum())} elements wrong")
        root = round_ % world
        value = torch.full((count,), float(round_ * 10 + root)) if rank == root else torch.zeros(count)
        dist.broadcast(value, root)
        if not torch.equal(value, torch.full((count,), float(round_ * 10 + root))):
            failures.append(f"broadcast round {round_} from {root}: wrong values")
        pieces = torch.arange(count // world * world, dtype=torch.float32) + rank * 7 + round_
        got = torch.zeros_like(pieces)
        dist.all_to_all_single(got, pieces)
        piece = count // world
        want = torch.cat(
            [
                torch.arange(rank * piece, (rank + 1) * piece, dtype=torch.float32) + src * 7 + round_
                for src in range(world)
            ]
        )
        if not torch.equal(got, want):
            failures.append(f"all_to_all round {round_}: {int((got != want).sum())} elements wrong")
    return failures


def any_source() -> list[str]:
    """Rank 0 receives one message from every other rank without naming the source."""
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    if rank == 0:
        senders = []
        for _ in range(world - 1):
            buf = torch.zeros(2, dtype=torch.int64)
            src = dist.recv(buf)
            if buf.tolist() != [src, src * 10]:
                failures.append(f"from {src}: got {buf.tolist()}")
            senders.append(src)
        if sorted(senders) != list(range(1, world)):
            failures.append(f"senders {senders}")
    else:
        dist.send(torch.tensor([rank, rank * 10]), 0)
    dist.barrier()
    return failures


def irecv_does_not_block_collectives() -> list[str]:
    """A posted irecv whose message comes after a collective must not hold that collective up."""
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    buf = torch.zeros(3)
    req = dist.irecv(buf, (rank - 1) % world) if world > 1 else None
    t = torch.ones(4)
    dist.all_reduce(t)
    if t.tolist() != [float(world)] * 4:
        failures.append(f"all_reduce gave {t.tolist()}")
    if req is not None:
        dist.send(torch.full((3,), float(rank)), (rank + 1) % world)
        req.wait()
        if buf.tolist() != [float((rank - 1) % world)] * 3:
            failures.append(f"irecv gave {buf.tolist()}")
        # the future of an irecv yields the output tensors (DDP-style callbacks use it)
        req2 = dist.irecv(torch.zeros(1), (rank - 1) % world)
        dist.send(torch.ones(1), (rank + 1) % world)
        value = req2.get_future().wait()
        if [v.tolist() for v in value] != [[1.0]]:
            failures.append(f"irecv future gave {value}")
    return failures


def batch_exchange() -> list[str]:
    """batch_isend_irecv: every rank exchanges with both neighbours at once."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return []
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    from_prev, from_next = torch.zeros(5), torch.zeros(5)
    ops = [
        dist.P2POp(dist.irecv, from_prev, prev),
        dist.P2POp(dist.irecv, from_next, nxt),
        dist.P2POp(dist.isend, torch.full((5,), float(rank)), nxt),
        dist.P2POp(dist.isend, torch.full((5,), float(rank)), prev),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    failures = []
    if from_prev.tolist() != [float(prev)] * 5 or from_next.tolist() != [float(nxt)] * 5:
        failures.append(f"got {from_prev.tolist()} / {from_next.tolist()}")
    return failures


def bad_peers() -> list[str]:
    """Sending to oneself or to a rank outside the group is a clear error, and loses nothing."""
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    group = dist.distributed_c10d._get_default_group()
    for peer, words in [(rank, "itself"), (world + 3, "outside"), (-1, "outside")]:
        # torch's front door checks some of these itself; the backend must too (direct callers)
        for via, call in [
            ("dist.send", lambda: dist.send(torch.zeros(1), peer)),
            ("pg.send", lambda: group.send([torch.zeros(1)], peer, 0)),
            ("pg.recv", lambda: group.recv([torch.zeros(1)], peer, 0)),
        ]:
            try:
                call()
            except (ValueError, RuntimeError) as exc:
                if via.startswith("pg") and words not in str(exc):
                    failures.append(f"{via} to {peer}: unclear error {exc}")
            else:
                failures.append(f"{via} to {peer} did not raise")
    dist.barrier()
    return failures


def mismatched_recv(role: str) -> str:
    """Rank 0 sends 4 floats; rank 1 expects 5 int64s: rank 1 must say so, not hang or garble."""
    rank = dist.get_rank()
    try:
        if rank == 0:
            dist.send(torch.zeros(4), 1)  # buffered: returns at once...
            dist.barrier()  # ...so the sender hears of the mismatch at its next operation
        else:
            dist.recv(torch.zeros(5, dtype=torch.int64), 0)
    except Exception as exc:  # noqa: BLE001 - the error text is what is checked
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def sends_are_buffered() -> list[str]:
    """Every rank sends to every other rank, then meets them in a barrier, then receives.

    If a send waited for its receiver this would deadlock: the receives come after the barrier.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    for peer in range(world):
        if peer != rank:
            for k in range(3):
                dist.send(torch.tensor([rank * 100.0 + k]), peer)
    dist.barrier()
    failures = []
    for peer in range(world):
        if peer != rank:
            for k in range(3):
                got = torch.zeros(1)
                dist.recv(got, peer)
                if got.item() != peer * 100.0 + k:
                    failures.append(f"from {peer} #{k}: {got.item()}")
    return failures


def held_back_counts_never_block_a_capped_sender() -> list[str]:
    """Rank 1 has sent to rank 0, so its counts of rank 0's messages ride with its next send
    (pairs.acknowledge). It receives one of rank 0's MAX_UNRECEIVED_SENDS + 1 sends and enters a
    barrier: rank 0's last send waits for that count, which rank 1 must write before it waits
    in the barrier (else both wait until the timeout). Then the rest, every value checked."""
    from fsdist.defaults import MAX_UNRECEIVED_SENDS

    rank = dist.get_rank()
    failures: list[str] = []
    if rank == 1:
        dist.send(torch.ones(1), 0)
    elif rank == 0:
        dist.recv(torch.zeros(1), 1)
    if rank == 0:
        for i in range(MAX_UNRECEIVED_SENDS + 1):
            dist.send(torch.tensor([float(i)]), 1)
    elif rank == 1:
        got = torch.zeros(1)
        dist.recv(got, 0)
        failures += [] if got.item() == 0.0 else [f"#0: {got.item()}"]
    dist.barrier()
    if rank == 1:
        for i in range(1, MAX_UNRECEIVED_SENDS + 1):
            dist.recv(got, 0)
            failures += [] if got.item() == float(i) else [f"#{i}: {got.item()}"]
    dist.barrier()
    return failures


def held_back_counts_of_an_irecv_reach_a_capped_sender() -> list[str]:
    """Rank 1 has sent to a peer near rank 0 (pairs.acknowledge: its counts of rank 0's messages
    may ride with a later send), posts an irecv from rank 0 and enters a barrier before the
    irecv is matched: the receive loop's thread matches it while rank 1 waits in the barrier,
    and holds the count back. Rank 0's MAX_UNRECEIVED_SENDS + 1-th send needs that count, and
    rank 1 needs rank 0 in the barrier: the receive thread must write the count on its own
    (within its tick), or both wait until the timeout. Then the rest, every value checked."""
    from fsdist.defaults import MAX_UNRECEIVED_SENDS

    rank, world = dist.get_rank(), dist.get_world_size()
    other = (1 + 1) % world  # rank 2, or rank 0 itself in a world of 2
    failures: list[str] = []
    if rank == 1:
        dist.send(torch.ones(1), other)
    elif rank == other:
        dist.recv(torch.zeros(1), 1)
    got = torch.zeros(1)
    if rank == 0:
        for i in range(MAX_UNRECEIVED_SENDS + 1):
            dist.send(torch.tensor([float(i)]), 1)
    elif rank == 1:
        first = dist.irecv(got, 0)
    dist.barrier()
    if rank == 1:
        first.wait()
        failures += [] if got.item() == 0.0 else [f"#0: {got.item()}"]
        for i in range(1, MAX_UNRECEIVED_SENDS + 1):
            dist.recv(got, 0)
            failures += [] if got.item() == float(i) else [f"#{i}: {got.item()}"]
    dist.barrier()
    return failures


def send_cap(count: int) -> list[int]:
    """Rank 0 sends `count` messages before rank 1 receives any: the sender must stop at the
    cap of unreceived messages (files stay bounded) and go on once receives start."""
    import glob
    import os
    import time

    rank = dist.get_rank()
    if rank == 0:
        for i in range(count):
            dist.send(torch.tensor([float(i)]), 1)
        return []
    if rank != 1:
        return []
    time.sleep(1.5)
    waiting = len(glob.glob(os.path.join(os.environ["FSDIST_TEST_DIR"], "gen-*", "groups", "*", "p0-1.*")))
    got = []
    for _ in range(count):
        t = torch.zeros(1)
        dist.recv(t, 0)
        got.append(int(t.item()))
    assert got == list(range(count)), got[:20]
    return [waiting]
