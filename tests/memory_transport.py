"""A CollectiveChannel in memory: every rank a thread of one process, to test the algorithms.

The algorithms in fsdist/collectives/ see only a CollectiveChannel (transport/interfaces.py). Here one
``MemoryWorld`` keeps every rank's position and published tensors under one lock, so the
algorithm code that runs on files in the multi-process suite runs here in milliseconds, at any
world size, inside one test. Same contract: a rank waits for a peer's step; a peer in the
same operation with another description is a DesyncError; waits end at a deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from fsdist.errors import DesyncError, FsdistTimeoutError, PeerFailedError
from fsdist.protocol.message import Part
from fsdist.transport.locality import Locality

__all__ = ["MemoryChannel", "MemoryMessage", "MemoryWorld", "run_ranks"]


class MemoryMessage:
    """A published message: copies of the tensors, read back by byte ranges as from a file."""

    def __init__(self, seq: int, tag: int, description: str, tensors: Sequence[torch.Tensor]) -> None:
        self.seq, self.tag, self.description = seq, tag, description
        self._bytes = [t.detach().clone().reshape(-1).view(torch.uint8) for t in tensors]
        #: the ranks the publisher declared as its only readers (None: any)
        self.readers: frozenset[int] | None = None
        self.parts = [Part(t.dtype, tuple(t.shape), t.numel() * t.element_size(), 0) for t in tensors]

    def read_into(self, index: int, dest: torch.Tensor, byte_offset: int = 0) -> None:
        nbytes = dest.numel() * dest.element_size()
        dest.reshape(-1).view(torch.uint8).copy_(self._slice(index, byte_offset, nbytes))

    def mapped(self, index: int, like: torch.Tensor, byte_offset: int = 0) -> AbstractContextManager[torch.Tensor]:
        nbytes = like.numel() * like.element_size()
        return nullcontext(self._slice(index, byte_offset, nbytes).view(like.dtype).view(like.shape))

    def _slice(self, index: int, byte_offset: int, nbytes: int) -> torch.Tensor:
        if byte_offset + nbytes > self.parts[index].nbytes:
            raise ValueError(f"bytes {byte_offset}..{byte_offset + nbytes} outside part {index}")
        return self._bytes[index][byte_offset : byte_offset + nbytes]

    def file_size(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def close(self) -> None:
        pass

    def __enter__(self) -> MemoryMessage:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class MemoryWorld:
    """``size`` ranks' shared state: positions, descriptions and messages, under one lock."""

    def __init__(self, size: int, timeout: float = 10.0) -> None:
        self.size = size
        self.timeout = timeout
        self.lock = threading.Lock()
        #: one condition per rank over the one lock: a rank that moves wakes only the ranks
        #: waiting for it (waking every rank on every step costs O(N²) GIL hand-offs at N = 8)
        self.wakeups = [threading.Condition(self.lock) for _ in range(size)]
        self.waiting_for: list[int | None] = [None] * size
        self.positions = [(0, 0)] * size
        self.descriptions = [""] * size
        self.messages: dict[tuple[int, int, int], MemoryMessage] = {}
        self.aborted: str | None = None

    def wake_all(self) -> None:
        """Wake every waiting rank (an abort). Call with the lock held."""
        for wakeup in self.wakeups:
            wakeup.notify()

    def moved(self, rank: int, waiters: Sequence[int] | None = None) -> None:
        """``rank`` changed position: wake whoever waits for it (only ``waiters`` if given, as a
        doorbell would: a rank left out by mistake sleeps to its timeout and the test fails).
        Call with the lock held."""
        for waiter, peer in enumerate(self.waiting_for):
            if peer == rank and (waiters is None or waiter in waiters):
                self.wakeups[waiter].notify()

    def abort(self, reason: str) -> None:
        """Fail every rank's wait in this world with ``reason`` (the first reason stays)."""
        with self.lock:
            self.aborted = self.aborted or reason
            self.wake_all()

    def run(self, function: Callable[[MemoryChannel], Any]) -> list[Any]:
        """Run ``function(channel)`` on one thread per rank; the results in rank order."""
        return run_ranks(self.size, lambda rank: function(MemoryChannel(self, rank)), [self], self.timeout * 2)


def run_ranks(size: int, main: Callable[[int], Any], worlds: Sequence[MemoryWorld], timeout: float) -> list[Any]:
    """``main(rank)`` on one thread per rank; the results in rank order. The first error of any
    rank aborts ``worlds`` (every other rank's wait fails: the test fails, not hangs) and is
    raised after every thread ended or ``timeout`` passed."""
    results: list[Any] = [None] * size
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            results[rank] = main(rank)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            errors.append(exc)
            for world in worlds:
                world.abort(f"rank {rank}: {exc}")

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    if errors:
        raise errors[0]
    return results


class MemoryChannel:
    """One rank's CollectiveChannel over a MemoryWorld."""

    locality = Locality(one_client=True, local=True, reuse_files=False)  # one process: every wait is woken

    def __init__(self, world: MemoryWorld, rank: int) -> None:
        self._world = world
        self.rank = rank
        self.size = world.size
        self.seq = 0
        self.description = ""

    def enter(self, seq: int, description: str) -> None:
        """Start operation ``seq`` (the adapter does this before every algorithm)."""
        self.seq, self.description = seq, description
        with self._world.lock:
            self._world.positions[self.rank] = (seq, 0)
            self._world.descriptions[self.rank] = description
            self._world.moved(self.rank)

    def publish(
        self, step: int, tensors: Sequence[torch.Tensor], tag: int = 0, readers: Sequence[int] | None = None
    ) -> None:
        msg = MemoryMessage(self.seq, tag, self.description, tensors)
        msg.readers = None if readers is None else frozenset(readers)
        with self._world.lock:
            self._world.messages[(self.rank, self.seq, step)] = msg
        self.advance(step, readers)

    def advance(self, step: int, waiters: Sequence[int] | None = None) -> None:
        with self._world.lock:
            self._world.positions[self.rank] = (self.seq, step)
            self._world.moved(self.rank, waiters)

    def wait_for(self, peer: int, step: int) -> None:
        world = self._world
        with world.lock:

            def arrived() -> bool:
                if world.aborted is not None:
                    raise PeerFailedError(f"rank {self.rank}: the group was aborted: {world.aborted}")
                seq = world.positions[peer][0]
                if seq == self.seq and world.descriptions[peer] != self.description:
                    raise self._desync(peer, world.descriptions[peer])
                return world.positions[peer] >= (self.seq, step)

            world.waiting_for[self.rank] = peer
            start = time.monotonic()
            try:
                arrived_in_time = world.wakeups[self.rank].wait_for(arrived, world.timeout)
            finally:
                world.waiting_for[self.rank] = None
            if arrived_in_time and time.monotonic() - start >= world.timeout:
                # the step was there when the wait gave up, but nothing woke this rank for it
                raise AssertionError(
                    f"rank {self.rank} was not woken for rank {peer}'s step {step}: left out of its waiters?"
                )
            if not arrived_in_time:
                raise FsdistTimeoutError(
                    f"rank {self.rank}, operation #{self.seq} '{self.description}': Timed out waiting for "
                    f"rank {peer} to publish step {step} (it is at {world.positions[peer]})"
                )

    def open_message(self, peer: int, step: int) -> MemoryMessage:
        with self._world.lock:
            msg = self._world.messages.get((peer, self.seq, step))
        if msg is None or msg.description != self.description:
            raise self._desync(peer, msg.description if msg else f"(no message for step {step})")
        if msg.readers is not None and self.rank not in msg.readers:
            # a wrong declaration would let the file transport reuse the space under this reader
            raise AssertionError(f"rank {self.rank} read rank {peer}'s step {step}, declared for {sorted(msg.readers)}")
        with self._world.lock:
            if self._world.positions[self.rank] > (self.seq, step) and msg.readers is not None:
                raise AssertionError(f"rank {self.rank} read rank {peer}'s step {step} after it moved past it")
        return msg

    def abort(self, reason: str) -> None:
        with self._world.lock:
            self._world.aborted = self._world.aborted or reason
            self._world.wake_all()

    def _desync(self, peer: int, theirs: str) -> DesyncError:
        return DesyncError(
            f"rank {self.rank}: ranks disagree on operation #{self.seq}: "
            f"rank {self.rank} called '{self.description}', rank {peer} called '{theirs}'"
        )
