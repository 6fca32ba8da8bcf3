"""Is a peer still alive? Process checks on this machine, heartbeats across machines.

A rank is identified by host, pid, process start time and *machine*: the kernel's boot id plus
the pid namespace. Two containers, or two nodes that happen to share a hostname, have
different machine ids, so a pid is only ever looked up where it means something; the start
time guards against pid reuse.

On the same machine a dead process is noticed at once (``/proc``), and a stopped one (SIGSTOP)
by its heartbeat, as below. Across machines each rank
beats a heartbeat: a counter in ``heartbeat.r<rank>`` that a thread raises every fifth of the
heartbeat timeout (at most every ``HEARTBEAT_SECONDS``), read under the lock (coherent on NFS, unlike mtimes), or with
``FSDIST_IO=direct`` written and read with O_DIRECT (files/direct.py: its one writer). A peer whose
counter has not moved for ``FSDIST_HEARTBEAT_TIMEOUT`` seconds (default 10) of this rank's own
clock is declared dead; no clock synchronisation is needed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..defaults import (
    ENV_HEARTBEAT_TIMEOUT,
    ENV_NODE_ID,
    HEARTBEAT_BEATS_PER_TIMEOUT,
    HEARTBEAT_SECONDS,
    HEARTBEAT_TIMEOUT_SECONDS,
)
from ..files.counters import Counter, OwnCounter

__all__ = [
    "Heartbeat",
    "Identity",
    "PeerWatch",
    "heartbeat_period",
    "heartbeat_timeout",
    "is_alive",
    "is_stopped",
    "node_id",
    "this_process",
]


@dataclass(frozen=True)
class Identity:
    """Enough to recognise a process: where it runs, its pid and when it started."""

    host: str
    pid: int
    start_time: int
    machine: str = ""
    #: the node it counts as for placement (``node_id``): ranks of one node share memory
    node: str = ""
    #: the client it reaches the run directory through (fs/mounts.py ``client_key``; "" unknown)
    client: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Identity:
        return cls(
            host=str(data["host"]),
            pid=int(data["pid"]),
            start_time=int(data["start_time"]),
            machine=str(data.get("machine", "")),
            node=str(data.get("node", "")),
            client=str(data.get("client", "")),
        )

    @property
    def placement(self) -> str:
        """The node this process counts as (its machine where no node was recorded)."""
        return self.node or self.machine or self.host


def hostname() -> str:
    return os.uname().nodename


def machine_id() -> str:
    """Boot id and pid namespace: equal exactly when pids mean the same processes."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return hostname()
    return f"{boot_id}/{namespace}"


def node_id() -> str:
    """Which machine this rank counts as for placement: ``FSDIST_NODE_ID``, else ``machine_id()``.

    Only placement decisions read it (may the job keep its files on this machine? which ranks
    meet in a node-local directory?); liveness always uses the real machine id, so an override
    never makes a pid mean another process.
    """
    return os.environ.get(ENV_NODE_ID) or machine_id()


def this_process() -> Identity:
    return Identity(hostname(), os.getpid(), _start_time(os.getpid()) or 0, machine_id(), node_id())


def is_alive(who: Identity) -> bool | None:
    """True or False for a process on this machine; None when it runs elsewhere (unknowable here)."""
    if who.host != hostname() or (who.machine and who.machine != machine_id()):
        return None
    start = _start_time(who.pid)
    return start is not None and (who.start_time == 0 or start == who.start_time)


def is_stopped(pid: int) -> bool:
    """Whether a process on this machine is stopped (state T: SIGSTOP, SIGTSTP; t: a tracer).

    It is alive to /proc but runs nothing, its heartbeat thread included: a peer waiting for it
    judges it by that heartbeat, as it judges a rank on another machine.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    except OSError:  # no /proc (not Linux): fall back to signal 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def heartbeat_timeout() -> float:
    """How long a peer's heartbeat may stall before it counts as dead (FSDIST_HEARTBEAT_TIMEOUT)."""
    return float(os.environ.get(ENV_HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_SECONDS))


def heartbeat_period() -> float:
    """How often this rank beats: HEARTBEAT_BEATS_PER_TIMEOUT beats in a timeout, so a beat late
    by most of a timeout is still in time, and no more often than HEARTBEAT_SECONDS needs (on
    NFS each beat is a WRITE: an idle rank's only round trip)."""
    return min(HEARTBEAT_SECONDS, heartbeat_timeout() / HEARTBEAT_BEATS_PER_TIMEOUT)


class Heartbeat:
    """A daemon thread raising this rank's heartbeat counter every ``heartbeat_period()``: a locked
    ``add``, or with direct records (FSDIST_IO=direct) one direct write, its only writer being
    this thread (on NFS one WRITE a beat instead of LOCK, GETATTR, READ, WRITE, UNLOCK)."""

    def __init__(self, path: str, direct: bool = False) -> None:
        """``direct``: the job's records are direct (Generation.records), its heartbeats too."""
        self._counter: Counter | OwnCounter = OwnCounter(path) if direct else Counter(path)
        self._beats = self._counter.try_get() or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fsdist-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        period = heartbeat_period()
        while not self._stop.wait(period):
            try:
                if isinstance(self._counter, OwnCounter):
                    self._beats += 1
                    self._counter.set(self._beats)
                else:
                    self._counter.add(1)
            except OSError:  # the directory went away at shutdown, or a transient error
                if self._stop.is_set():
                    return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._counter.close()


class PeerWatch:
    """Decides whether a peer is dead: by its process on this machine, by heartbeat elsewhere."""

    def __init__(
        self, members: Sequence[Identity], heartbeat_paths: Sequence[str], names: Sequence[int] | None = None,
        direct: bool = False,
    ) -> None:  # fmt: skip
        """``names``: what each member is called in errors (default: its index); ``direct``: the
        heartbeats are read directly, as they are written (Generation.records)."""
        self._direct = direct
        self.members = list(members)
        self._names = list(names) if names is not None else list(range(len(members)))
        self._paths = list(heartbeat_paths)
        self._counters: dict[int, Counter | OwnCounter] = {}
        self._last: dict[int, tuple[int | None, float]] = {}
        self.timeout = heartbeat_timeout()

    def dead_reason(self, rank: int) -> str | None:
        """None while ``rank`` seems alive, else why it is considered dead."""
        who = self.members[rank]
        alive = is_alive(who)
        if alive is False:
            return f"rank {self._names[rank]} (pid {who.pid} on {who.host}) died"
        stopped = alive is True and is_stopped(who.pid)
        if alive is True and not stopped:
            self._last.pop(rank, None)  # running here: its heartbeat says nothing more
            return None
        counter = self._counters.get(rank)
        if counter is None:  # read directly where beats are written so (or locked: its tag tells either way)
            path = self._paths[rank]
            counter = self._counters[rank] = OwnCounter(path) if self._direct else Counter(path)
        # never wait for the lock: its holder may be the stopped process itself (its heartbeat
        # thread, stopped mid-beat); a beat not readable now counts as one that did not move
        beat, now = counter.try_get(), time.monotonic()
        last = self._last.get(rank)
        if last is None or (beat is not None and beat != last[0]):
            self._last[rank] = (beat, now)
            return None
        if now - last[1] > self.timeout:
            why = " (its process is stopped: SIGSTOP, or a debugger)" if stopped else ""
            return (
                f"rank {self._names[rank]} (pid {who.pid} on {who.host}) stopped its heartbeat{why}: no beat for "
                f"{now - last[1]:.1f} s (limit {self.timeout:.0f} s, {ENV_HEARTBEAT_TIMEOUT})"
            )
        return None

    def close(self) -> None:
        for counter in self._counters.values():
            counter.close()
