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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import FsdistError
from ..files.io import remove_tree, unlink_quietly
from ..protocol import layout, rendezvous_record
from ..protocol.rendezvous_record import parse
from .clean import remove_node_tiers
from .io_choice import Choice, KeyValue, choose_records
from .liveness import Heartbeat, Identity, PeerWatch
from .lock_check import check_locks

log = logging.getLogger(__name__)

__all__ = ["Generation", "in_use_here"]

#: Generations of this process that an fsdist group runs on (``Generation.groups`` > 0).
_IN_USE: list[Generation] = []


def in_use_here(root: str | None = None) -> list[Generation]:
    """This process's generations (in ``root``, a resolved path, if given) that an fsdist group
    still runs on."""
    return [g for g in _IN_USE if root is None or g.root == root]


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
    #: How the job's records are read and written (job/io_choice.py): chosen at its first group
    #: (``settle``), before its heartbeat starts, and the same for every group of the job.
    records: Choice | None = None
    #: How many groups of each name this process has created (``group_directory``).
    incarnations: dict[str, int] = field(default_factory=dict)
    #: Called once this rank has left (init methods release what they keep alive for torch).
    on_leave: list[Callable[[], None]] = field(default_factory=list)
    left: bool = False
    #: fsdist groups of this process running on it (``use``/``release``): while any does, a new
    #: rendezvous of this process in the same directory must not take it for a stale entry
    groups: int = 0
    #: generations formed inside this one's directory (``nested_root``) so far
    nested: int = 0

    def __post_init__(self) -> None:
        # A group of another backend formed through fsdist's directory (env:// under `fsdist
        # run` serves Gloo too) is destroyed without telling fsdist: leave at exit at the latest
        atexit.register(self._leave_at_exit)

    def _leave_at_exit(self) -> None:
        try:
            self.leave()
        except (OSError, FsdistError) as exc:  # the directory may be gone already: best effort
            log.debug("fsdist: could not leave generation %s at exit: %s", self.generation_id, exc)

    def use(self) -> None:
        """An fsdist group of this process runs on the generation (until ``release``)."""
        self.groups += 1
        if self.groups == 1:
            _IN_USE.append(self)

    def release(self) -> None:
        self.groups -= 1
        if self.groups == 0:
            _IN_USE.remove(self)

    def nested_root(self) -> str:
        """A run directory inside this generation's, for another job of the same ranks formed
        while this one runs (``torch.distributed._dist2.new_group`` meets through ``env://``
        again): every rank names the same one by counting such rendezvous in call order."""
        self.nested += 1
        return os.path.join(self.directory, f"{layout.NESTED_PREFIX}{self.nested}")

    def settle(self, store: KeyValue) -> Choice:
        """The job's checks, once, at its first group (before its heartbeat starts; every rank
        makes its first group together): its locks across clients (job/lock_check.py), then how
        its records are read and written (job/io_choice.py)."""
        if self.records is None:
            check_locks(store, self.directory, self.members, self.rank)
            self.records = choose_records(store, self.directory, self.members, self.rank)
            log.info("fsdist: rank %d: %s records: %s", self.rank,
                     "direct" if self.records.direct else "locked", self.records.why)  # fmt: skip
        return self.records

    def group_directory(self, group_id: str) -> str:
        """The folder of the next group named ``group_id``: torch may give a re-created group the
        name of a destroyed one, and the incarnation count (the same on every member, which create
        groups in the same order) keeps them apart."""
        incarnation = self.incarnations.get(group_id, 0)
        self.incarnations[group_id] = incarnation + 1
        return layout.group_dir(self.directory, group_id, incarnation)

    @property
    def direct(self) -> bool:
        """Whether the job's records in the shared directory (and its heartbeats) are direct."""
        return self.records is not None and self.records.direct

    def heartbeat_path(self, rank: int) -> str:
        return layout.heartbeat_file(self.directory, rank)

    def heartbeat(self) -> Heartbeat:
        """This rank's heartbeat, beaten as the job's records are written (``records``)."""
        return Heartbeat(self.heartbeat_path(self.rank), self.direct)

    def peer_watch(self, job_ranks: Sequence[int], names: Sequence[int] | None = None) -> PeerWatch:
        """A watch over these ranks of the job (named ``names`` in errors), their heartbeats read
        as they are written."""
        members = [self.members[g] for g in job_ranks]
        return PeerWatch(members, [self.heartbeat_path(g) for g in job_ranks], names, self.direct)

    def remove_root(self) -> None:
        """Remove a root made for this job alone, once its record is empty and closed (and the
        folder of the generation it nested in, where that one's last rank left it behind)."""
        unlink_quietly(os.path.join(self.root, layout.RENDEZVOUS_FILE))
        with contextlib.suppress(OSError):
            os.rmdir(self.root)
            if os.path.basename(self.root).startswith(layout.NESTED_PREFIX):
                os.rmdir(os.path.dirname(self.root))  # (not empty while that generation runs)

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
            state = parse(old, self.root)
            if state.get("generation") != self.generation_id:
                return None  # already replaced (we were presumed dead): nothing of ours is left
            state["members"][str(self.rank)]["left"] = True
            mine = self.members[self.rank].placement
            if all(m.get("left") for r, m in state["members"].items() if self.members[int(r)].placement == mine):
                remove_node_tiers([self.generation_id], mine)  # the last of this node out (a crash leaves them)
            if all(m.get("left") for m in state["members"].values()):
                nonlocal emptied
                emptied = True
                _remove_generation_folder(self.directory)
                return b""
            return rendezvous_record.encode(state, self.root)

        with rendezvous_record.locked(self.root) as record:
            record.update(mark)
        if emptied and self.owns_root:  # closed first: on NFS an open file would stay as .nfsXXXX
            self.remove_root()
        for callback in self.on_leave:
            callback()
        self.on_leave.clear()
        return emptied


def _remove_generation_folder(directory: str) -> None:
    """Remove a finished generation's folder, all but the run directories of jobs nested in it
    that still run (``nested_root``): the last rank of such a job removes it, and this folder."""
    nested = [name for name in _listed(directory) if name.startswith(layout.NESTED_PREFIX)]
    running = [name for name in nested if _runs(os.path.join(directory, name))]
    if not running:
        remove_tree(directory)
        return
    for name in _listed(directory):
        if name not in running:
            path = os.path.join(directory, name)
            if os.path.isdir(path):
                remove_tree(path)
            else:
                unlink_quietly(path)


def _listed(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _runs(root: str) -> bool:
    """Whether the job recorded in ``root`` has a member that has not left (unreadable: yes)."""
    try:
        with rendezvous_record.locked(root, create=False) as record:
            raw = record.read()
    except FileNotFoundError:
        return False
    except (OSError, FsdistError):
        return True  # not ours to judge
    try:
        members = parse(raw, root).get("members", {}).values() if raw else []
    except (ValueError, FsdistError):
        return True
    return any(not member.get("left") for member in members)
