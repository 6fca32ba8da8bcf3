"""Port-free rendezvous: ranks form a *generation* of a job through one lock-guarded file.

``DIR/fsdist-rendezvous.json`` (JSON, read and written only under an fcntl lock) names the
generation being formed or running and the identity of each member. A new generation, with
its own fresh ``gen-<id>/`` subdirectory, is started when there is none, when the recorded one
is dead (its same-host members' processes are gone), or when a rank finds its own slot taken
by a dead process. Files of a crashed earlier run are therefore never read: they live in a
directory no live rank names, and the rank that replaces a generation deletes it.

A rank waiting for a generation to fill up re-joins if someone replaced it meanwhile, so all
live ranks converge on the newest generation. A generation whose members are alive on this
host is never replaced: a second job pointed at the same directory gets a clear error.

The file holds JSON, never pickle: the directory is shared with other users.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from . import fs_guard
from .defaults import DEFAULT_TIMEOUT, ENV_DIR
from .errors import RendezvousError
from .fileio import make_private_dir, remove_tree
from .liveness import Identity, is_alive, this_process
from .locked_record import LockedRecord
from .store import DirectoryStore
from .waiting import Deadline, poll

log = logging.getLogger(__name__)

__all__ = ["RENDEZVOUS_FILE", "Generation", "clean", "fsdist_rendezvous_handler", "rendezvous"]

RENDEZVOUS_FILE = "fsdist-rendezvous.json"
_FORMAT = 1


@dataclass
class Generation:
    """One formed job: its directory, this rank, and who every rank is."""

    root: str
    generation_id: str
    directory: str
    rank: int
    world_size: int
    members: list[Identity]
    #: How many groups of each name this process has created (see ProcessGroupFsdist).
    incarnations: dict[str, int] = field(default_factory=dict)

    def heartbeat_path(self, rank: int) -> str:
        return os.path.join(self.directory, f"heartbeat.r{rank}")

    def leave(self) -> None:
        """Mark this rank as gone; the last rank out removes the generation and empties the file.

        Leaving is recorded in the rendezvous file itself, so a rank that starts the next job
        while its peers are still shutting down sees a job that is ending, not a live one.
        """
        LIVE_STORES[:] = [s for s in LIVE_STORES if s.generation is not self]

        def mark(old: bytes) -> bytes | None:
            state = _parse(old)
            if state.get("generation") != self.generation_id:
                return None  # already replaced (we were presumed dead): nothing of ours is left
            state["members"][str(self.rank)]["left"] = True
            if all(m.get("left") for m in state["members"].values()):
                remove_tree(self.directory)
                return b""
            return json.dumps(state).encode()

        with LockedRecord(os.path.join(self.root, RENDEZVOUS_FILE)) as record:
            record.update(mark)


def rendezvous(root: str, rank: int | None, world_size: int, timeout: timedelta = DEFAULT_TIMEOUT) -> Generation:
    """Join (or start) the generation of a ``world_size``-rank job in ``root``; wait until full.

    ``rank=None`` takes the lowest free slot (torchrun's agents get their node rank this way).
    """
    if world_size < 1 or (rank is not None and not 0 <= rank < world_size):
        raise RendezvousError(f"rank {rank} is outside a world of size {world_size}")
    root = os.path.realpath(root)  # the run directory itself may sit behind a link (/scratch -> ...)
    make_private_dir(root)
    me = {**this_process().to_json(), "nonce": secrets.token_hex(8), **fs_guard.describe_client(root)}
    fs_guard.refuse_known_multinode(root, me, world_size)
    record = LockedRecord(os.path.join(root, RENDEZVOUS_FILE))
    warned: set[str] = set()
    try:
        state: dict[str, Any] = {}

        def my_slot() -> int | None:
            slots = [int(r) for r, m in state.get("members", {}).items() if m.get("nonce") == me["nonce"]]
            return slots[0] if slots else None

        def join(old: bytes) -> bytes | None:
            nonlocal state
            state = _parse(old)
            members = state.get("members", {}).values()
            if any(m.get("refused") for m in members) and any(_staying(m) for m in members):
                return None  # a member refused this filesystem: fail like it did (fs_guard)
            if my_slot() is not None:
                return None  # already a member: just watching the generation fill up
            verdict = _judge(state, rank, world_size, me)
            if verdict == "wait":
                return None  # the previous job is shutting down: let it finish
            if verdict == "replace":
                state = _new_generation(root, world_size, previous=state)
            # members known dead can never take part: free their slots rather than count them
            state["members"] = {r: m for r, m in state["members"].items() if _staying(m)}
            slot = rank if rank is not None else min(set(range(world_size)) - {int(r) for r in state["members"]})
            state["members"][str(slot)] = me
            state["complete"] = len(state["members"]) == world_size
            return json.dumps(state).encode()

        def formed() -> dict[str, Any] | None:
            nonlocal record
            if me["fs_hazard"]:  # a held descriptor may never see other clients' writes here
                record.close()
                record = LockedRecord(os.path.join(root, RENDEZVOUS_FILE))
            try:
                record.update(join)
                fs_guard.check_members(root, state.get("members", {}), warned)
            except RendezvousError as exc:
                if "refusing to start" not in str(exc) and me["fs_hazard"]:  # the file itself was corrupted
                    raise fs_guard.corrupted(root, me["fs_hazard"], record.path, exc) from exc
                reason = str(exc)
                record.update(lambda old: _mark_refused(old, me["nonce"], reason))
                raise
            return state if my_slot() is not None and state["complete"] else None

        deadline = Deadline(timeout.total_seconds())
        final = poll(
            formed,
            deadline,
            lambda: RendezvousError(
                f"rank {rank}: rendezvous in {root} timed out after {deadline.seconds:.0f} s; "
                f"{len(state.get('members', {}))} of {world_size} ranks joined "
                f"(ranks {sorted(int(r) for r in state.get('members', {}))})"
                + (f"; and this rank's mount is unsafe across clients: {me['fs_hazard']}" if me["fs_hazard"] else "")
            ),
        )
        slot = my_slot()
        assert slot is not None
    finally:
        record.close()
    rank = slot
    members = [Identity.from_json(final["members"][str(r)]) for r in range(world_size)]
    directory = os.path.join(root, f"gen-{final['generation']}")
    log.debug("rank %d joined generation %s in %s", rank, final["generation"], root)
    return Generation(root, final["generation"], directory, rank, world_size, members)


def clean(root: str, force: bool = False) -> list[str]:
    """Remove every generation a dead job left in ``root``.

    Refuses while a member is alive on this host, or (unless ``force``) runs on another host,
    where this host cannot tell whether it is alive.
    """
    removed: list[str] = []
    path = os.path.join(root, RENDEZVOUS_FILE)
    if not os.path.exists(path):
        return removed
    with LockedRecord(path) as record:

        def wipe(old: bytes) -> bytes:
            state = _parse(old)
            for member in state.get("members", {}).values():
                who = Identity.from_json(member)
                alive = is_alive(who)
                if member.get("left") or alive is False or (alive is None and force):
                    continue
                hint = "stop it before cleaning" if alive else "use --force if that job is dead"
                raise RendezvousError(
                    f"a job may be alive in {root} (pid {who.pid} on {who.host}, generation "
                    f"{state['generation']}): {hint}"
                )
            for name in os.listdir(root):
                if name.startswith("gen-"):
                    remove_tree(os.path.join(root, name))
                    removed.append(name)
            return b""

        record.update(wipe)
    return removed


def _mark_refused(old: bytes, nonce: str, reason: str) -> bytes | None:
    """Record that this rank refused the generation, so its peers fail with the same reason."""
    state = _parse(old)
    mine = [m for m in state.get("members", {}).values() if m.get("nonce") == nonce]
    if not mine:
        return None
    mine[0].update(left=True, refused=reason)
    return json.dumps(state).encode()


def _parse(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        state = json.loads(raw)
    except ValueError as exc:
        raise RendezvousError(f"the rendezvous file is not valid JSON (foreign or corrupt): {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise RendezvousError(f"the rendezvous file has an unknown format: {str(state)[:200]}")
    return state


def _judge(state: dict[str, Any], rank: int | None, world_size: int, me: dict[str, Any]) -> str:
    """Decide under the lock what to do with the recorded generation: "join", "replace" or "wait".

    Raises RendezvousError for a second live job in the same directory.
    """
    if not state:
        return "replace"
    members = {int(r): m for r, m in state["members"].items()}
    holder = members.get(rank) if rank is not None else None
    if not state["complete"] and state["world_size"] == world_size and (holder is None or not _staying(holder)):
        return "join"  # a free slot, or one whose holder died while the job was forming
    staying = {r: m for r, m in members.items() if _staying(m)}
    if not staying:
        return "replace"  # every member left or died: the generation is over
    if any(m.get("left") for m in members.values()):
        return "wait"  # a job that is shutting down: its last members are leaving
    r, m = next(iter(staying.items()))
    why = "is running" if state["complete"] else "is forming"
    raise RendezvousError(
        f"another job {why} in this directory (generation {state['generation']}, world size "
        f"{state['world_size']}; rank {r} is pid {m['pid']} on {m['host']}). Use another directory, "
        "or stop that job"
    )


def _staying(member: dict[str, Any]) -> bool:
    """Not left, and not known to be dead. A process on another host cannot be checked from
    here, so it counts as alive: never delete what a live job elsewhere may still be using."""
    return not member.get("left") and is_alive(Identity.from_json(member)) is not False


def _new_generation(root: str, world_size: int, previous: dict[str, Any]) -> dict[str, Any]:
    """Start a fresh generation and delete what dead generations left in ``root``."""
    generation = secrets.token_hex(8)
    for name in os.listdir(root):
        if name.startswith("gen-"):
            remove_tree(os.path.join(root, name))
    if previous:
        log.warning("fsdist: replacing dead generation %s in %s", previous.get("generation"), root)
    make_private_dir(os.path.join(root, f"gen-{generation}"))
    return {"format": _FORMAT, "generation": generation, "world_size": world_size, "members": {}, "complete": False}


def open_store(generation: Generation, timeout: timedelta) -> DirectoryStore:
    """The key-value store of ``generation``, carrying the generation for the backend to find."""
    store = DirectoryStore(os.path.join(generation.directory, "store"), timeout)
    store.generation = generation
    return store


def parse_url(url: str) -> tuple[str, int, int]:
    """``fsdist:///dir?rank=R&world_size=W`` (or env fallbacks) → (dir, rank, world size)."""
    parsed = urllib.parse.urlparse(url)
    query = dict(urllib.parse.parse_qsl(parsed.query))
    root = (parsed.netloc + parsed.path) or os.environ.get(ENV_DIR, "")
    if not root:
        raise RendezvousError(f"no directory in {url!r}: use fsdist:///path/to/dir or set {ENV_DIR}")
    rank = _first_int(query.get("rank"), os.environ.get("RANK"), os.environ.get("SLURM_PROCID"), what="rank")
    world = _first_int(
        query.get("world_size"), os.environ.get("WORLD_SIZE"), os.environ.get("SLURM_NTASKS"), what="world size"
    )
    return os.path.abspath(root), rank, world


def _first_int(*candidates: str | None, what: str) -> int:
    for value in candidates:
        if value not in (None, ""):
            return int(value)
    raise RendezvousError(
        f"fsdist rendezvous needs the {what}: pass it to init_process_group, or set RANK/WORLD_SIZE "
        "(SLURM_PROCID/SLURM_NTASKS under SLURM)"
    )


def fsdist_rendezvous_handler(url: str, timeout: timedelta = DEFAULT_TIMEOUT, **_: Any) -> Iterator[Any]:
    """torch's rendezvous-handler protocol for ``init_method="fsdist://..."``."""
    root, rank, world_size = parse_url(url)
    generation = rendezvous(root, rank, world_size, timeout)
    store = open_store(generation, timeout)
    # c10d keeps only the C++ half of a Python store alive: hold the Python half until the
    # world group shuts down (Generation.leave), or its methods vanish under torch.
    LIVE_STORES.append(store)
    yield (store, rank, world_size)
    raise RuntimeError("fsdist rendezvous handler cannot be re-used")


LIVE_STORES: list[DirectoryStore] = []
