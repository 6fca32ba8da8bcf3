"""Who a rank is (host, pid, process start time) and whether it is still alive.

The start time guards against pid reuse: a recycled pid belongs to a process that started later.
Only processes on this host can be checked this way; peers on other hosts are judged by the
abort marker and the group timeout.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Identity", "is_alive", "this_process"]


@dataclass(frozen=True)
class Identity:
    """Enough to recognise a process: where it runs, its pid and when it started."""

    host: str
    pid: int
    start_time: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Identity:
        return cls(host=str(data["host"]), pid=int(data["pid"]), start_time=int(data["start_time"]))


def hostname() -> str:
    return os.uname().nodename


def this_process() -> Identity:
    return Identity(hostname(), os.getpid(), _start_time(os.getpid()) or 0)


def is_alive(who: Identity) -> bool | None:
    """True or False for a process on this host; None when it runs elsewhere (unknowable here)."""
    if who.host != hostname():
        return None
    start = _start_time(who.pid)
    return start is not None and (who.start_time == 0 or start == who.start_time)


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
