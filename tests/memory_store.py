"""The job's store as the start-up measurements use it (job/io_choice.py, job/lock_check.py),
in memory and shared by threads standing in for ranks: ``get`` waits for the key."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class MemoryStore:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self._changed = threading.Condition()

    def set(self, key: str, value: str) -> None:
        with self._changed:
            self.values[key] = value.encode()
            self._changed.notify_all()

    def get(self, key: str) -> bytes:
        with self._changed:
            assert self._changed.wait_for(lambda: key in self.values, timeout=20), f"nobody set {key}"
            return self.values[key]


def every_rank_as_a_thread(measure: Callable[..., Any], directory: str, clients: list[str]) -> list[Any]:
    """``measure(store, directory, members, rank)`` on every rank, each a thread, rank r on client
    ``clients[r]``: what each returned, or the exception it raised ("unfinished" if it hung)."""
    from fsdist.job.liveness import Identity

    members = [Identity("h", 100 + r, 1, "m", client=c) for r, c in enumerate(clients)]
    store, out = MemoryStore(), ["unfinished"] * len(clients)

    def rank(r: int) -> None:
        try:
            out[r] = measure(store, directory, members, r)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            out[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out
