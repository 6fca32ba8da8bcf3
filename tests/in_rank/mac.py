"""Cases run inside ranks of a job with FSDIST_SECRET_FILE: forgeries with a correct CRC, made by
one rank acting as a forger without the secret, and what every rank then says (test_mac.py)."""

from __future__ import annotations

import glob
import os
import struct
import time

import torch
import torch.distributed as dist

from fsdist.files.io import publish
from fsdist.files.locks import LockedRecord
from fsdist.files.seal import Sealer
from fsdist.protocol import message, state_record

from in_rank.errors import error_text

#: the check a forger without the secret can compute
CRC = Sealer(None, "none").seal("")


def _group_dir() -> str:
    (found,) = glob.glob(os.path.join(os.environ["FSDIST_TEST_DIR"], "gen-*", "groups", "k.0.0"))
    return found


def forged_message(numel: int) -> str:
    """Rank 1 sends rank 0 a tensor as a file, then (as a forger would) replaces the file with one of
    other values under a valid CRC; rank 0 receives. Returns what each rank's call said."""
    rank = dist.get_rank()
    if rank == 1:
        dist.send(torch.full((numel,), 1.0), 0)
        (path,) = glob.glob(os.path.join(_group_dir(), "p1-0.*"))
        index = int(path.rsplit(".", 1)[1])
        publish(
            os.path.dirname(path),
            os.path.basename(path),
            message.encode(index, 0, "forged", [torch.full((numel,), 666.0)], CRC),
        )
        return error_text(_barriers_while_rank_0_fails)
    received = torch.empty(numel)
    return error_text(lambda: (dist.barrier(), dist.recv(received, 1)))


def _barriers_while_rank_0_fails() -> None:
    """Meet rank 0, then again once it has met the forgery: this rank's first barrier may already
    end on rank 0's abort (rank 0 can leave it, fail and abort before this rank sees it left)."""
    dist.barrier()
    time.sleep(0.5)
    dist.barrier()


def forged_record() -> str:
    """Rank 1 (as a forger would) rewrites its own state record's header with a valid CRC, saying
    it reached a later operation; rank 0 reads it (still in the barrier before, or in the
    all_reduce after: whichever it reads, the forgery is refused)."""
    path = os.path.join(_group_dir(), "state.r1")

    def rank_1() -> None:
        dist.barrier()
        with LockedRecord(path, create=False) as record:
            record.write(state_record.encode(10_000, 1, "all_reduce SUM float32[4]", 0, 0, CRC))
        time.sleep(1.0)  # rank 0 reads it, refuses it and aborts the group
        dist.all_reduce(torch.ones(4))

    def rank_0() -> None:
        dist.barrier()
        end = time.monotonic() + 30  # only once the forgery is there (rank 1's own next write could come first)
        while _seq_in(path) != 10_000 and time.monotonic() < end:
            time.sleep(0.01)
        dist.all_reduce(torch.ones(4))

    return error_text(rank_1 if dist.get_rank() == 1 else rank_0)


def _seq_in(path: str) -> int:
    """The operation a state record's header says its rank is in (read as a forger would see it)."""
    with open(path, "rb") as record:
        return int(struct.unpack_from("<q", record.read(16), 8)[0])


def payload_altered(numel: int) -> str:
    """With FSDIST_MAC_PAYLOADS=1: rank 1 sends a tensor as a file, then flips one byte of its
    payload in place (the header untouched); rank 0 receives."""
    rank = dist.get_rank()
    if rank == 1:
        dist.send(torch.full((numel,), 1.0), 0)
        (path,) = glob.glob(os.path.join(_group_dir(), "p1-0.*"))
        with open(path, "r+b") as file:
            file.seek(os.path.getsize(path) - 8)
            byte = file.read(1)
            file.seek(-1, os.SEEK_CUR)
            file.write(bytes([byte[0] ^ 0x40]))
        return error_text(_barriers_while_rank_0_fails)
    received = torch.empty(numel)
    return error_text(lambda: (dist.barrier(), dist.recv(received, 1)))


def collectives_are_right(sizes: list[int]) -> list[str]:
    """all_reduce, all_gather, broadcast and a reduce_scatter at each size, checked."""
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    for numel in sizes:
        t = torch.full((numel,), float(rank + 1))
        dist.all_reduce(t)
        if not (t == world * (world + 1) / 2).all():
            failures.append(f"all_reduce {numel}")
        gathered = [torch.empty(numel) for _ in range(world)]
        dist.all_gather(gathered, torch.full((numel,), float(rank)))
        if any(not (g == i).all() for i, g in enumerate(gathered)):
            failures.append(f"all_gather {numel}")
        b = torch.arange(numel, dtype=torch.float32) if rank == 0 else torch.empty(numel)
        dist.broadcast(b, 0)
        if not (b == torch.arange(numel, dtype=torch.float32)).all():
            failures.append(f"broadcast {numel}")
        out = torch.empty(numel)
        dist.reduce_scatter(out, [torch.full((numel,), float(i)) for i in range(world)])
        if not (out == world * rank).all():
            failures.append(f"reduce_scatter {numel}")
    return failures


#: what rank 0 broadcasts as an object, and what the forger puts in its place (the same length,
#: so the pickle still loads: it would hand rank 1 the forger's object, or run her code)
OBJECT_MARK, FORGED_MARK = b"the-victims-own-object", b"the-forgers-own-object"


def object_payload_rewritten(extra: int) -> dict[str, str]:
    """Rank 0 broadcasts an object (a pickle of ``extra`` more bytes: inline in its record when
    small, a message file when large); rank 1, acting as a forger without the secret, waits
    for the pickle to appear, rewrites its bytes in place (an inline slot's CRC recomputed; the
    header, under its MAC, untouched), then receives. Returns what each rank's call said, and
    what rank 1 received where nothing refused it."""
    payload = [{"mark": OBJECT_MARK.decode(), "pad": "x" * extra}]
    if dist.get_rank() == 0:
        said = error_text(lambda: dist.broadcast_object_list(payload, src=0))
        return {"said": said if said != "no error" else error_text(dist.barrier), "forged": ""}
    forged = _rewrite_pickle(time.monotonic() + 20)
    received: list[object] = [None]
    said = error_text(lambda: (dist.broadcast_object_list(received, src=0), dist.barrier()))
    return {"said": said, "forged": forged, "received": repr(received[0])[:80]}


def _rewrite_pickle(deadline: float) -> str:
    """Where the forger rewrote the pickle: ``inline`` (rank 0's state record) or ``file``."""
    group = _group_dir()
    while time.monotonic() < deadline:
        record = os.path.join(group, "state.r0")
        with LockedRecord(record, create=False) as locked:
            raw = bytearray(locked.read())
            where = raw.find(OBJECT_MARK)
            if where >= 0:
                slot = (where - state_record.HEADER_SIZE) // state_record.INLINE_SLOT_BYTES
                start = state_record.slot_offset(slot)
                seq, step, length, _ = struct.unpack_from("<qIII", raw, start)
                body = bytes(raw[start + 20 : start + 20 + length]).replace(OBJECT_MARK, FORGED_MARK)
                raw[start : start + 20 + length] = state_record.encode_slot(seq, step, body)
                locked.write(bytes(raw))
                return "inline"
        for path in glob.glob(os.path.join(group, "*.r0*")):
            if path == record or not os.path.isfile(path) or os.path.islink(path):
                continue  # (the state record, looked at above under its lock: the pickle may have
                # reached it since, and rewriting it here would skip the slot's CRC; a doorbell)
            with open(path, "r+b") as file:
                data = file.read()
                where = data.find(OBJECT_MARK)
                if where >= 0:
                    file.seek(where)
                    file.write(FORGED_MARK)
                    return "file"
        time.sleep(0.005)
    return "never found the pickle"
