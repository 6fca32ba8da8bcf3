"""Joining a job through the store c10d hands the backend: ``file://``, ``env://``, ``tcp://``, ``store=``.

fsdist's own init method forms the job in the run directory and hands torch a DirectoryStore
that carries the generation. Every other init method gives the backend one of torch's stores
(a FileStore, a TCPStore, a HashStore, inside c10d's PrefixStores). That store already connects
every rank of this job and no other, so it settles what a directory alone cannot: who the
members are, and a generation no earlier job used. Tensors still travel only through files, in
a run directory chosen by, in order:

1. ``FSDIST_DIR`` when it is set;
2. with a FileStore (``file://``), ``<its file>.fsdist`` beside it: every rank opens that file,
   so its folder is shared by definition;
3. when every rank runs on one machine (torchrun --standalone, Lightning's own launcher), a
   fresh private directory in ``FSDIST_LOCAL_DIR`` (default ``/dev/shm``);
4. otherwise none: the error names the store that came and what to set.

The exchange, under the world group's store prefix (``E``: this init's epoch, so a store used
for several inits in a row never shows one init's keys to the next):

1. every rank publishes who it is, its world size and its run directory (``fsdist/E/member/R``)
   and reads everyone's, failing at once on a disagreement;
2. rank 0 records a fresh generation with every member in its run directory (refusing a live
   job there) and publishes its id, or why it could not, as ``fsdist/E/generation``;
3. every other rank finds that generation in *its* run directory, which proves the directory is
   shared, and counts itself in ``fsdist/E/confirmed``. The first failure anywhere is written to
   ``fsdist/E/failed``; every wait watches it, so every rank raises it within a poll.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ..defaults import ENV_DIR, SHARED_DIR_GRACE_SECONDS
from ..errors import FsdistError, RendezvousError
from ..files.io import remove_tree
from ..files.places import node_directory, resolve_place
from ..files.trust import make_private_dir
from ..files.waiting import Deadline, poll
from ..fs import guard
from ..job.claim import claim, confirm, withdraw
from ..job.generation import Generation
from ..job.liveness import Identity, is_alive, this_process
from ..protocol import layout, rendezvous_record
from .compat import unwrap_store
from .store import DirectoryStore

log = logging.getLogger(__name__)

__all__ = ["GroupSite", "group_site", "join_through_store", "joined"]

_FORMAT = 1
#: The generation this process joined through a torch store for its world group (subgroups
#: created on that store find it here), until it is left.
_JOINED: list[Generation] = []
#: stores of failed rendezvous, kept for the process's life: rank 0 serves a TCPStore and may fail
#: first, and past ``linger``'s grace dropping the store would close it under peers still reading
#: it (a loaded machine: they got a network error instead of the same refusal)
_REFUSED_STORES: list[dist.Store] = []


def joined() -> Generation | None:
    return _JOINED[-1] if _JOINED else None


@dataclass(frozen=True)
class GroupSite:
    """Where a group lives: its generation, that generation's own store, the group's ranks in it,
    whether the group owns the generation (beats its heartbeat, leaves it at shutdown), and
    the group's folder."""

    store: DirectoryStore
    generation: Generation
    global_ranks: list[int]
    owns_generation: bool
    directory: str


def group_site(opts: Any, timeout: timedelta) -> GroupSite:
    """Where a group c10d asks for (``opts``: its backend options) lives, the generation joined
    and the job's checks done (``Generation.settle``: at its first group).

    c10d hands the backend whatever store the init method made. fsdist's own (``fsdist://``,
    and ``env://`` where FSDIST_DIR is set) carries the generation formed in the directory; any
    other (FileStore, TCPStore, HashStore, a user's) is where the ranks agree on a fresh
    generation first. Subgroups reuse the world group's generation; the world group, or an
    fsdist group under another backend's world, owns its own.
    """
    store = unwrap_store(opts.store)
    global_ranks = list(opts.global_ranks_in_group)
    if isinstance(store, DirectoryStore) and store.generation is not None:
        generation, owner = store.generation, not global_ranks
    elif global_ranks and (world := joined()) is not None:
        generation, owner = world, False
    else:
        subdir = f"group.{layout.key_to_filename(str(opts.group_id))}" if global_ranks else None
        generation = join_through_store(opts.store, opts.group_rank, opts.group_size, timeout, subdir)
        owner, global_ranks = True, []
    if not isinstance(store, DirectoryStore) or store.generation is not generation:
        store = DirectoryStore(layout.store_dir(generation.directory), timeout)  # fsdist's own records
    generation.settle(store)
    global_ranks = global_ranks or list(range(generation.world_size))
    directory = generation.group_directory(str(opts.group_id))
    if not owner and opts.group_rank == 0:  # `fsdist status` maps the group's ranks to the job's
        store.set(layout.GROUP_RANKS_KEY + os.path.basename(directory), json.dumps(global_ranks))
    return GroupSite(store, generation, global_ranks, owner, directory)


def join_through_store(
    store: dist.Store, rank: int, world_size: int, timeout: timedelta, subdir: str | None = None
) -> Generation:
    """Form this job's generation with ``store`` as the meeting point (see the module docstring).

    ``subdir``: an fsdist group under another backend's world group gets a generation of its
    own, in that folder of the run directory (beside it, for a folder fsdist made), removed
    when its last rank leaves.
    """
    ex = _Exchange(store, rank, world_size, timeout)
    inner = unwrap_store(store)
    root, owns_root = _run_directory(inner)
    if root and subdir:  # inside a directory the user named; beside one fsdist made for the job
        root, owns_root = (f"{root}.{subdir}" if owns_root else os.path.join(root, subdir)), True
    me = {
        "format": _FORMAT, "world_size": world_size, "root": root or "",
        **this_process().to_json(), "nonce": secrets.token_hex(8),
        **(guard.describe_client(root) if root else {}),
    }  # fmt: skip
    generation: Generation | None = None
    try:
        if root:
            guard.refuse_known_multinode(root, me, world_size)
        store.set(ex.member_key(rank), json.dumps(me))
        members = _gather_members(ex, me)
        local = _placement(members, inner)
        if root:
            guard.check_members(root, {str(r): m for r, m in enumerate(members)}, set())
        if rank == 0:
            generation = _claim(ex, members, root, owns_root, local, timeout)
        else:
            generation = _confirm(ex, me["nonce"], root, owns_root)
            store.add(ex.confirmed_key, 1)
        ex.wait(
            "every rank to find the generation", lambda: int(store.add(ex.confirmed_key, 0)) >= world_size - 1 or None
        )
    except Exception as exc:
        ex.fail(str(exc) if str(exc).startswith("rank ") else f"rank {rank}: {exc}")
        if rank == 0 and generation is not None:
            withdraw(generation)
        ex.linger()
        _REFUSED_STORES.append(inner)
        raise
    if subdir is None:
        _JOINED.append(generation)
        generation.on_leave.append(lambda: _JOINED.remove(generation))
    log.info("fsdist: rank %d joined generation %s in %s", rank, generation.generation_id, generation.root)
    return generation


class _Exchange:
    """This rank's side of one init's exchange: the store, the keys, the deadline."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.deadline = Deadline(timeout.total_seconds())
        epoch = (int(store.add("fsdist/joins", 1)) - 1) // world_size
        prefix = f"fsdist/{epoch}/"
        self.generation_key = prefix + "generation"
        self.confirmed_key = prefix + "confirmed"
        self.failed_key = prefix + "failed"
        self.failed_seen_key = prefix + "failed-seen"
        self._acknowledged = False
        self._member_prefix = prefix + "member/"

    def member_key(self, rank: int) -> str:
        return f"{self._member_prefix}{rank}"

    def wait(self, what: str, done: Callable[[], Any]) -> Any:
        """Poll ``done`` until it returns something, watching the failure key."""

        def attempt() -> Any:
            if self.store.check([self.failed_key]):
                self._acknowledge()
                raise RendezvousError(self.store.get(self.failed_key).decode(errors="replace"))
            return done()

        return poll(
            attempt,
            self.deadline,
            lambda: RendezvousError(
                f"rank {self.rank}: Timed out after {self.deadline.seconds:.0f} s waiting for {what} "
                "(fsdist's join through the store c10d gave it)"
            ),
        )

    def fail(self, message: str) -> None:
        """Tell every rank (the first failure wins) and count this rank as having seen it."""
        try:
            self.store.compare_set(self.failed_key, "", message)
            self._acknowledge()
        except Exception:  # the store itself may be what failed: the caller raises anyway
            log.debug("fsdist: could not publish the failure %r", message, exc_info=True)

    def _acknowledge(self) -> None:
        if not self._acknowledged:
            self._acknowledged = True
            self.store.add(self.failed_seen_key, 1)

    def linger(self) -> None:
        """Rank 0 (which serves a TCPStore) stays until every rank has read the failure, or for
        SHARED_DIR_GRACE_SECONDS: leaving at once would take the store, and the reason, with it."""
        if self.rank != 0:
            return
        end = time.monotonic() + SHARED_DIR_GRACE_SECONDS
        with contextlib.suppress(Exception):
            while int(self.store.add(self.failed_seen_key, 0)) < self.world_size and time.monotonic() < end:
                time.sleep(0.01)


def _run_directory(store: dist.Store) -> tuple[str | None, bool]:
    """This rank's run directory, and whether it exists for this job alone (see the docstring)."""
    if os.environ.get(ENV_DIR):
        return resolve_place(os.environ[ENV_DIR]), False
    if isinstance(store, dist.FileStore):
        return resolve_place(store.path) + ".fsdist", True  # type: ignore[attr-defined]  # stub lacks it
    if isinstance(store, DirectoryStore):
        return resolve_place(store.directory) + ".fsdist", True
    return None, False


def _gather_members(ex: _Exchange, me: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's published entry, checked against this rank's as each arrives."""
    members: dict[int, dict[str, Any]] = {ex.rank: me}

    def arrived() -> bool | None:
        for r in range(ex.world_size):
            if r not in members and ex.store.check([ex.member_key(r)]):
                members[r] = _parse_member(ex.store.get(ex.member_key(r)), r)
                _agree(members[r], r, me, ex.rank)
        return True if len(members) == ex.world_size else None

    ex.wait("every rank to publish its entry", arrived)
    return [members[r] for r in range(ex.world_size)]


def _parse_member(raw: bytes, rank: int) -> dict[str, Any]:
    """A peer's entry, checked field by field: nothing read from a store is trusted."""
    try:
        member = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RendezvousError(f"rank {rank}'s entry in the store is not JSON: {raw[:80]!r}") from exc
    fields = {"format": int, "world_size": int, "root": str, "node": str, "host": str, "pid": int,
              "start_time": int, "machine": str, "nonce": str}  # fmt: skip
    if not isinstance(member, dict) or any(not isinstance(member.get(k), t) for k, t in fields.items()):
        raise RendezvousError(f"rank {rank}'s entry in the store is not an fsdist member: {raw[:200]!r}")
    if member["format"] != _FORMAT:
        raise RendezvousError(f"rank {rank} runs another fsdist version (member format {member['format']})")
    return dict(member)


def _agree(other: dict[str, Any], other_rank: int, me: dict[str, Any], rank: int) -> None:
    if other["world_size"] != me["world_size"]:
        raise RendezvousError(
            f"ranks disagree on the world size: rank {rank} has {me['world_size']}, rank {other_rank} "
            f"(pid {other['pid']} on {other['host']}) has {other['world_size']}. Give every rank the same "
            "world_size (WORLD_SIZE)"
        )
    if bool(other["root"]) != bool(me["root"]):
        has, lacks = (rank, other_rank) if me["root"] else (other_rank, rank)
        raise RendezvousError(
            f"rank {has} has a run directory and rank {lacks} has none: set {ENV_DIR} on every rank "
            "(to the same shared directory), or on none"
        )


def _placement(members: list[dict[str, Any]], store: dist.Store) -> bool:
    """True when the job keeps its files node-local; raises when it has nowhere to keep them."""
    if members[0]["root"]:
        return False
    nodes = {m["node"] for m in members}
    if len(nodes) == 1:
        return True
    kind = type(store).__name__
    how = "env:// (torch's default when init_process_group gets no init_method) or tcp://"
    raise RendezvousError(
        f"the fsdist backend got a {kind} from c10d ({how if kind == 'TCPStore' else 'store='}) and no run "
        f"directory, and its {len(members)} ranks run on {len(nodes)} machines: fsdist moves tensors only "
        f"through files in a directory every rank shares. Set {ENV_DIR}=/shared/dir on every rank (env:// "
        f"then meets there too, with no TCPStore), or use init_method='file:///shared/dir/initfile' or "
        "'fsdist:///shared/dir'"
    )


def _claim(
    ex: _Exchange, members: list[dict[str, Any]], root: str | None, owns_root: bool, local: bool, timeout: timedelta
) -> Generation:
    if local:
        root, owns_root = _local_root(), True
    assert root is not None
    generation = claim(root, members, timeout, owns_root=owns_root)
    published = {"generation": generation.generation_id, "local_root": root if local else ""}
    ex.store.set(ex.generation_key, json.dumps(published))
    return generation


def _confirm(ex: _Exchange, nonce: str, root: str | None, owns_root: bool) -> Generation:
    ex.wait("rank 0 to record the generation", lambda: ex.store.check([ex.generation_key]) or None)
    try:
        published = json.loads(ex.store.get(ex.generation_key))
        generation_id, local_root = str(published["generation"]), str(published["local_root"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise RendezvousError(f"rank 0's generation entry in the store is not fsdist's: {exc}") from exc
    if local_root:
        root, owns_root = local_root, True
    assert root is not None
    generation = confirm(root, generation_id, ex.rank, nonce)
    generation.owns_root = owns_root
    return generation


def _local_root() -> str:
    """A fresh private directory on this machine for a job whose ranks all run here: in this
    user's own node-local folder (files/trust.py), under a name nobody can know in advance."""
    base = node_directory()
    _sweep(base)
    root = os.path.join(base, layout.LOCAL_RUN_PREFIX + secrets.token_hex(8))
    make_private_dir(root)
    return root


def _sweep(base: str) -> None:
    """Remove single-machine run directories whose jobs died (a crash cannot remove its own).

    ``base`` is this user's own folder, so nothing in it was planted by another user; a record
    that is damaged (or a directory whose lock stays busy) is skipped, not judged."""
    for name in os.listdir(base):
        path = os.path.join(base, name)
        if not name.startswith(layout.LOCAL_RUN_PREFIX) or not os.path.exists(
            os.path.join(path, layout.RENDEZVOUS_FILE)
        ):
            continue
        try:
            with rendezvous_record.locked(path, create=False) as locked:
                raw = locked.try_read()
            if raw is None:
                continue  # a live job is changing it right now
            members = rendezvous_record.parse(raw, path).get("members", {}).values()
            if members and all(m.get("left") or _dead(m) for m in members):
                remove_tree(path)
                log.info("fsdist: removed %s, left by a job that died", path)
        except (OSError, ValueError, AttributeError, KeyError, TypeError, RecursionError, FsdistError):
            continue  # damaged, or being removed right now: not ours to judge


def _dead(member: dict[str, Any]) -> bool:
    return is_alive(Identity.from_json(member)) is False
