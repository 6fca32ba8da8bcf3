"""The rendezvous record ``DIR/fsdist-rendezvous.json``: its format, and the rules for judging it.

One JSON object, read and written only under an fcntl lock (rendezvous.py does the locking)::

    {"format": 1, "generation": "<16 hex>", "world_size": N, "complete": bool,
     "members": {"<rank>": {"host", "pid", "start_time", "machine", "nonce", "client",
                            "fs_hazard", "fs_local_hazard", "left"?, "refused"?}},
     "conflict"?: "<why every member must fail>"}

An empty file means "no job". JSON, never pickle: the directory is shared with other users.
Every function here is pure over the parsed record (plus liveness checks of its members), so the
joining, claiming and cleaning procedures in rendezvous.py share one set of rules.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from typing import Any

from ..errors import RendezvousError
from ..files.io import make_private_dir, remove_tree
from ..job.liveness import Identity, is_alive

log = logging.getLogger(__name__)

__all__ = [
    "FORMAT",
    "RENDEZVOUS_FILE",
    "conflict_message",
    "judge",
    "judge_previous",
    "mark_refused",
    "new_generation",
    "parse",
    "retire_own_stale_entries",
    "staying",
]

RENDEZVOUS_FILE = "fsdist-rendezvous.json"
FORMAT = 1


def mark_refused(old: bytes, nonce: str, reason: str) -> bytes | None:
    """Record that this rank refused the generation, so its peers fail with the same reason."""
    state = parse(old)
    mine = [m for m in state.get("members", {}).values() if m.get("nonce") == nonce]
    if not mine:
        return None
    mine[0].update(left=True, refused=reason)
    return json.dumps(state).encode()


def parse(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        state = json.loads(raw)
    except ValueError as exc:
        raise RendezvousError(f"the rendezvous file is not valid JSON (foreign or corrupt): {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise RendezvousError(f"the rendezvous file has an unknown format: {str(state)[:200]}")
    return state


def judge(state: dict[str, Any], rank: int | None, world_size: int, me: dict[str, Any]) -> str:
    """Decide under the lock what to do with the recorded generation: "join", "replace" or "wait".

    Raises RendezvousError for a second live job in the same directory.
    """
    if not state:
        return "replace"
    members = {int(r): m for r, m in state["members"].items()}
    holder = members.get(rank) if rank is not None else None
    if not state["complete"] and state["world_size"] == world_size and (holder is None or not staying(holder)):
        return "join"  # a free slot, or one whose holder died while the job was forming
    return judge_previous(state, world_size)


def judge_previous(state: dict[str, Any], world_size: int) -> str:
    """A recorded generation this rank cannot join: "replace" it (over), "wait" (leaving), or
    raise RendezvousError (a live job)."""
    members = {int(r): m for r, m in state["members"].items()}
    remaining = {r: m for r, m in members.items() if staying(m)}
    if not remaining:
        return "replace"  # every member left or died: the generation is over
    if any(m.get("left") for m in members.values()):
        return "wait"  # a job that is shutting down: its last members are leaving
    r, m = next(iter(remaining.items()))
    if not state["complete"] and state["world_size"] != world_size:
        raise RendezvousError(
            f"a job of world size {state['world_size']} is forming in this directory (generation "
            f"{state['generation']}; rank {r} is pid {m['pid']} on {m['host']}), but this rank was started "
            f"with world size {world_size}: the ranks disagree on the world size, or two jobs use this directory"
        )
    why = "is running" if state["complete"] else "is forming"
    raise RendezvousError(
        f"another job {why} in this directory (generation {state['generation']}, world size "
        f"{state['world_size']}; rank {r} is pid {m['pid']} on {m['host']}). Use another directory, "
        "or stop that job"
    )


def conflict_message(state: dict[str, Any], rank: int | None, world_size: int, me: dict[str, Any]) -> str:
    """What the ranks already waiting in a forming generation are told when another joins badly."""
    who = f"rank {rank}" if rank is not None else "a rank"
    why = (
        f"with world size {world_size}, but this generation has world size {state['world_size']}: "
        "the ranks disagree on the world size, or two jobs use this directory"
        if state["world_size"] != world_size
        else "to a slot a live process already holds: two jobs use this directory"
    )
    return (
        f"{who} (pid {me['pid']} on {me['host']}) tried to join generation {state['generation']} "
        f"{why}. Give every rank of a job the same world size, and each job its own directory"
    )


def retire_own_stale_entries(state: dict[str, Any], me: dict[str, Any]) -> bool:
    """Mark as left every entry of *this process* other than ``me`` (same machine, pid and start
    time, another nonce) in a formed generation; True if any was. Such an entry is an earlier init
    of this process whose group torch destroyed without fsdist hearing of it (a Gloo group formed
    through the directory): the process is starting afresh, so that membership is over. (In a
    generation still forming, another entry of this process is another thread's rank.)"""
    retired = False
    if not state.get("complete"):
        return False
    for member in state.get("members", {}).values():
        same = all(member.get(k) == me.get(k) for k in ("host", "pid", "start_time", "machine"))
        if same and member.get("nonce") != me.get("nonce") and not member.get("left"):
            member["left"] = retired = True
    return retired


def staying(member: dict[str, Any]) -> bool:
    """Not left, and not known to be dead. A process on another host cannot be checked from
    here, so it counts as alive: never delete what a live job elsewhere may still be using."""
    return not member.get("left") and is_alive(Identity.from_json(member)) is not False


def new_generation(root: str, world_size: int, previous: dict[str, Any]) -> dict[str, Any]:
    """Start a fresh generation and delete what dead generations left in ``root``."""
    generation = secrets.token_hex(8)
    for name in os.listdir(root):
        if name.startswith("gen-"):
            remove_tree(os.path.join(root, name))
    if previous:
        log.warning("fsdist: replacing dead generation %s in %s", previous.get("generation"), root)
    make_private_dir(os.path.join(root, f"gen-{generation}"))
    return {"format": FORMAT, "generation": generation, "world_size": world_size, "members": {}, "complete": False}
