"""What a rank has called in one group: a running hash of every operation's description, kept
per operation for the last _HISTORY of them.

Two ranks whose hashes differ at the same operation called different operations at or before
it, even if neither waited for the other then (a rank that never waits, a broadcast root say,
is caught at the next record its peers read). The hash travels in the rank's state record
(protocol/state_record.py ``chain``); comparing it is the desync check.
"""

from __future__ import annotations

from collections import deque

from ..protocol import state_record

__all__ = ["History"]

_HISTORY = 4096  # own history hashes kept, to compare with peers that lag behind


class History:
    """This rank's hash after each operation it called (the recent ones), and its descriptions."""

    def __init__(self) -> None:
        self.chain = 0
        self._at: dict[int, tuple[int, str]] = {0: (0, "")}
        self._order: deque[int] = deque([0])

    def enter(self, seq: int, description: str, stored: str) -> None:
        """Operation ``seq`` is ``description`` (``stored``: as the record holds it)."""
        self.chain = state_record.chain(self.chain, description)
        self._at[seq] = (self.chain, stored)
        self._order.append(seq)
        if len(self._order) > _HISTORY:
            self._at.pop(self._order.popleft(), None)

    def differs(self, seq: int, theirs: int) -> str | None:
        """This rank's description of operation ``seq`` where a peer's hash there, ``theirs``, is
        another (they called something else at or before it); None where they agree or ``seq``
        is too old (or too new) to tell."""
        mine = self._at.get(seq)
        return mine[1] if mine is not None and mine[0] != theirs else None
