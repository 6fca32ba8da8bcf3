"""A formed job as one rank sees it, and how a rank leaves it.

Leaving is recorded in the rendezvous record, so a job starting in the same directory while the
last ranks shut down sees a job that is ending, not a live one; the last rank out removes the
generation's folder (and a root made for this job alone).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import FsdistError
from ..files.io import remove_tree, unlink_quietly
from ..protocol import layout, rendezvous_record
from ..protocol.rendezvous_record import parse
from .clean import remove_node_tiers
from .io_choice import Choice
from .liveness import Identity

log = logging.getLogger(__name__)

__all__ = ["Generation"]


@dataclass
class Generation:
    """One formed job: its directory, this rank, and who every rank is."""

    root: str
    generation_id: str
    directory: str
    rank: int
    world_size: int
    members: list[Identity]
    #: The root exists for this job alone (beside a FileStore's file, or node-local): the last
    #: rank out removes it too.
    owns_root: bool = False
    #: How the job's records are read and written (job/io_choice.py): chosen by the first group
    #: that beats the heartbeat, before it starts, and the same for every group of the job.
    records: Choice | None = None
    #: How many groups of each name this process has created (see ProcessGroupFsdist).
    incarnations: dict[str, int] = field(default_factory=dict)
    #: Called once this rank has left (init methods release what they keep alive for torch).
    on_leave: list[Callable[[], None]] = field(default_factory=list)
    left: bool = False

    def __post_init__(self) -> None:
        # A group of another backend formed through fsdist's directory (env:// under `fsdist
        # run` serves Gloo too) is destroyed without telling fsdist: leave at exit at the latest
        atexit.register(self._leave_at_exit)

    def _leave_at_exit(self) -> None:
        try:
            self.leave()
        except (OSError, FsdistError) as exc:  # the directory may be gone already: best effort
            log.debug("fsdist: could not leave generation %s at exit: %s", self.generation_id, exc)

    @property
    def direct(self) -> bool:
        """Whether the job's records in the shared directory (and its heartbeats) are direct."""
        return self.records is not None and self.records.direct

    def heartbeat_path(self, rank: int) -> str:
        return layout.heartbeat_file(self.directory, rank)

    def remove_root(self) -> None:
        """Remove a root made for this job alone, once its record is empty and closed."""
        unlink_quietly(os.path.join(self.root, layout.RENDEZVOUS_FILE))
        with contextlib.suppress(OSError):
            os.rmdir(self.root)

    def leave(self) -> bool:
        """Mark this rank as gone; the last rank out removes the generation and empties the file.

        Leaving is recorded in the rendezvous file itself, so a rank that starts the next job
        while its peers are still shutting down sees a job that is ending, not a live one.
        Leaving twice is leaving once. True: this rank was the last one out.
        """
        if self.left:
            return False
        self.left = True
        atexit.unregister(self._leave_at_exit)
        emptied = False

        def mark(old: bytes) -> bytes | None:
            state = parse(old)
            if state.get("generation") != self.generation_id:
                return None  # already replaced (we were presumed dead): nothing of ours is left
            state["members"][str(self.rank)]["left"] = True
            mine = self.members[self.rank].placement
            if all(m.get("left") for r, m in state["members"].items() if self.members[int(r)].placement == mine):
                remove_node_tiers([self.generation_id], mine)  # the last of this node out (a crash leaves them)
            if all(m.get("left") for m in state["members"].values()):
                nonlocal emptied
                emptied = True
                remove_tree(self.directory)
                return b""
            return rendezvous_record.encode(state)

        with rendezvous_record.locked(self.root) as record:
            record.update(mark)
        if emptied and self.owns_root:  # closed first: on NFS an open file would stay as .nfsXXXX
            self.remove_root()
        for callback in self.on_leave:
            callback()
        self.on_leave.clear()
        return emptied
