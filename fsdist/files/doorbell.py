"""Doorbells: a FIFO per rank in the group directory, so a waiting rank sleeps in the kernel.

Polling alone forces a choice between latency and CPU: a short sleep wakes often (CPU), a long
one notices late. Two ranks that both sleep between polls also fall into step with each
other's back-off, and on two shared cores a spinning waiter steals the CPU its peer needs to
publish. So a rank that publishes also *wakes* its peers: it writes one byte into each peer's
FIFO (``wake.r<rank>``, a named pipe: a file in the shared directory, no socket), and a
waiting rank sleeps in ``select`` on its own FIFO, woken by the kernel within tens of µs.

A wake-up is the waker's rank (4 bytes little-endian: a write of at most PIPE_BUF bytes is never
split), so a waiter knows who woke it and need not re-read the record of a peer that has not (on
NFS every read is a round trip). The bell only shortens sleeps; it never replaces the record
check. A FIFO carries bytes only
between processes of one host (on NFS each client has its own pipe), so peers on other
machines are still found by the polling schedule, whose sleep is the ``select`` timeout. Where
FIFOs cannot be made (some FUSE filesystems) the bell is silent and waiting is plain polling.
"""

from __future__ import annotations

import errno
import os
import select
import struct
import time
from collections.abc import Iterable

from .trust import OPEN_FLAGS, check_open, refusal, sharing

__all__ = ["RUN_QUEUE", "Doorbell", "RunQueue"]

_RETRY_OPEN_SECONDS = 1.0  # a peer whose FIFO could not be opened (another host, not yet made)
_WAKEUP = struct.Struct("<I")  # a wake-up: the waker's rank


class Doorbell:
    """This rank's FIFO (to wait on) and its peers' FIFOs (to wake them)."""

    def __init__(self, paths: list[str], rank: int) -> None:
        """``paths``: every rank's FIFO (this rank's is made here); ``rank``: this rank."""
        self._paths = paths
        self._rank = rank
        size = len(paths)
        self._fd = -1
        path = paths[rank]
        made = False
        try:
            os.mkfifo(path, sharing().file_mode)
            made = True
        except FileExistsError:
            pass  # (checked below: this rank's own FIFO from before, or planted)
        except OSError:
            path = ""  # no FIFOs here: every wait is a plain timed sleep
        if path:
            # O_RDWR: opening never blocks, and the pipe never reports end-of-file
            try:
                fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | OPEN_FLAGS)
            except OSError as exc:
                raise refusal(path, "FIFO", exc) from None
            try:
                share = sharing()
                if made and share.gid is not None:  # the group's peers write to it, whatever the umask
                    os.fchown(fd, -1, share.gid)
                    os.fchmod(fd, share.file_mode)
                check_open(fd, path, "FIFO")
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        self._peers: list[int] = [-1] * size
        self._retry_at = [0.0] * size
        self._wakeup = _WAKEUP.pack(rank)
        #: peers whose wake-ups were drained from the pipe and not taken yet (``take_wakeup``)
        self._woken: set[int] = set()

    def wake(self, peers: Iterable[int]) -> None:
        """Wake ``peers`` if they wait (a full pipe already holds a wake-up: nothing lost)."""
        for peer in peers:
            fd = self._peers[peer]
            if fd < 0:
                fd = self._open_peer(peer)
                if fd < 0:
                    continue
            try:
                os.write(fd, self._wakeup)
            except BlockingIOError:
                pass
            except OSError:  # EPIPE: the peer closed its end (it left); never wake it again
                os.close(fd)
                self._peers[peer] = -1
                self._retry_at[peer] = float("inf")

    def _open_peer(self, peer: int) -> int:
        now = time.monotonic()
        if now < self._retry_at[peer]:
            return -1
        try:
            fd = os.open(self._paths[peer], os.O_WRONLY | os.O_NONBLOCK | OPEN_FLAGS)
        except OSError as exc:
            # ENXIO: nobody reads it on this host (a peer elsewhere, or one not started yet)
            if exc.errno not in (errno.ENXIO, errno.ENOENT, errno.ELOOP, errno.EACCES, errno.ENODEV):
                raise
            self._retry_at[peer] = now + _RETRY_OPEN_SECONDS
            return -1
        try:
            check_open(fd, self._paths[peer], "FIFO")  # a peer's FIFO, not a file or another user's pipe
        except BaseException:
            os.close(fd)
            raise
        self._peers[peer] = fd
        return fd

    def reaches(self, peer: int) -> bool:
        """Whether ``peer`` can wake this rank: it runs on this host (its FIFO opens here, so it
        opens ours) and this rank has a FIFO to wait on."""
        return self._fd >= 0 and (self._peers[peer] >= 0 or self._open_peer(peer) >= 0)

    def spin(self, seconds: float) -> bool:
        """Busy-wait up to ``seconds`` for a ring; True if one came. No sleep, no lock, no
        filesystem call: one non-blocking read of this rank's pipe per turn."""
        if self._fd < 0:
            return False
        end = time.monotonic() + seconds
        while True:
            if self._drain():
                return True
            if time.monotonic() >= end:
                return False

    def take_wakeup(self, peer: int) -> bool:
        """Whether ``peer`` woke this rank since this was last asked of it (the answer is used up)."""
        if peer in self._woken:
            self._woken.discard(peer)
            return True
        return False

    def _drain(self) -> bool:
        """Read every wake-up waiting in the pipe into ``_woken``; True if there was any."""
        got = False
        while True:
            try:
                raw = os.read(self._fd, 4096)
            except BlockingIOError:
                return got
            got = got or bool(raw)
            for (peer,) in _WAKEUP.iter_unpack(raw[: len(raw) - len(raw) % _WAKEUP.size]):
                if peer < len(self._peers):
                    self._woken.add(peer)
            if len(raw) < 4096:
                return got

    def local_ranks(self) -> int:
        """How many ranks of the group run on this host (this one and those whose FIFO opens here)."""
        return 1 + sum(1 for peer in range(len(self._peers)) if peer != self._rank and self.reaches(peer))

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, less if a peer wakes this rank; True if one did (``take_wakeup`` says who)."""
        if self._fd < 0:
            time.sleep(seconds)
            return False
        if seconds <= 0:
            return self._drain()  # (no select to ask first: the read does not block)
        ready, _, _ = select.select([self._fd], [], [], seconds)
        return bool(ready) and self._drain()

    def close(self) -> None:
        for fd in (self._fd, *self._peers):
            if fd >= 0:
                os.close(fd)
        self._fd = -1
        self._peers = [-1] * len(self._peers)


class RunQueue:
    """How many threads are runnable on this machine right now (Linux: ``/proc/loadavg``'s
    fourth field, the reader included), read with one ``pread`` of a file kept open.

    An answer serves for ``max_age`` seconds: reading and parsing the file costs ~3 µs, a
    twentieth of a small operation, and the run queue a waiter decides on is a snapshot anyway.
    """

    def __init__(self, path: str = "/proc/loadavg", cores: int | None = None, max_age: float = 0.001) -> None:
        self._cores = cores or os.cpu_count() or 1
        self._max_age = max_age
        self._answer = True
        self._valid_until = 0.0
        try:
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._fd = -1

    def core_free(self) -> bool:
        """Whether the runnable threads leave a core idle for a waiter to spin on (True where unknown)."""
        if self._fd < 0:
            return True
        now = time.monotonic()
        if now < self._valid_until:
            return self._answer
        try:
            runnable = int(os.pread(self._fd, 128, 0).split()[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):
            return True
        self._answer, self._valid_until = runnable <= self._cores, now + self._max_age
        return self._answer


#: this machine's run queue, read by every waiter deciding whether to spin
RUN_QUEUE = RunQueue()
