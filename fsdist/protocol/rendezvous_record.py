"""The rendezvous record ``DIR/fsdist-rendezvous.json``: its format, parsed and checked.

One JSON object sealed with its checksum line (protocol/sealed.py), read and written only under
an fcntl lock (job/ does the locking)::

    {"format": 1, "generation": "<16 hex>", "world_size": N, "complete": bool,
     "members": {"<rank>": {"host": str, "pid": int, "start_time": int, "machine": str,
                            "node": str, "nonce": str, "client"?: str, "fs_hazard"?: str,
                            "fs_local_hazard"?: str, "left"?: bool, "refused"?: str, ...}},
     "conflict"?: "<why every member must fail>",
     "replaced"?: ["<16 hex>", ...],   dead generations this one replaced (their node tiers go too)
     "min_size"?: M, "max_size"?: N,   an elastic generation (torchrun --nnodes=M:N): it forms with
                                       N members, or with M or more once none joined for a while;
                                       world_size is N while forming, then the members counted
     "waiting"?: [<member>, ...]}      ranks waiting to join an elastic generation's next round

An empty file means "no job". JSON, never pickle: the directory is shared with other users, so
``parse`` checks every field it relies on and names the file's fault instead of failing later
with a KeyError. The functions here change a parsed record and know nothing of processes; the
rules that judge a record by its members' liveness are job/judge.py.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from typing import Any

from ..errors import ProtocolError, RendezvousError
from ..files.locks import LockedRecord
from . import layout
from .sealed import bound_to_directory, seal_json, unseal_json

__all__ = [
    "FORMAT",
    "MAX_BYTES",
    "MAX_WAITING",
    "NODES",
    "RANKS",
    "CorruptRecordError",
    "conflict_message",
    "encode",
    "is_generation_id",
    "locked",
    "mark_refused",
    "member_name",
    "parse",
    "retire_own_stale_entries",
    "size_name",
    "unusable",
]


class CorruptRecordError(RendezvousError, ProtocolError):
    """The rendezvous record is not valid: foreign, damaged, or written through a mount that
    loses lock-guarded writes (a rendezvous failure caused by a bad file)."""


FORMAT = 1
#: at most this many replaced generation ids are recorded (a directory holds one generation at a
#: time; more than one is left only by crashes during a replacement)
MAX_REPLACED = 16
#: at most this many ranks wait to join a running elastic generation (more are refused)
MAX_WAITING = 64
#: the largest record (~40,000 members): a larger file is refused unread
MAX_BYTES = 16 << 20
_GENERATION_ID = re.compile(r"[0-9a-f]{16}")
_RANK = re.compile(r"[0-9]{1,9}")
_MEMBER_FIELDS = {"host": str, "pid": int, "start_time": int, "nonce": str}
_OPTIONAL_FIELDS = {"machine": str, "node": str, "left": bool, "refused": str, "client": str, "fs_hazard": str}


def locked(root: str, create: bool = True) -> LockedRecord:
    """The rendezvous record of run directory ``root``, open (``create``: made empty if missing)."""
    return LockedRecord(os.path.join(root, layout.RENDEZVOUS_FILE), create=create, max_size=MAX_BYTES)


def unusable(root: str, exc: CorruptRecordError) -> CorruptRecordError:
    """A record no rank can read stops every job in ``root``: the error says how to repair it."""
    return CorruptRecordError(
        f"{os.path.join(root, layout.RENDEZVOUS_FILE)}: {exc}. No job can start in {root} while it stays so: "
        f"`fsdist clean {root}` empties it (removing only the generations it names)"
    )


def is_generation_id(text: str) -> bool:
    """Whether ``text`` is a generation id as fsdist makes them (16 lowercase hex digits): only
    such names are ever removed as a generation's."""
    return _GENERATION_ID.fullmatch(text) is not None


def binding(root: str) -> str:
    """The identity the record of run directory ``root`` is sealed under (sealed.py
    ``bound_to_directory``): a record copied from another run directory is refused there."""
    return bound_to_directory(layout.RENDEZVOUS_FILE, root)


def parse(raw: bytes, root: str) -> dict[str, Any]:
    """The record of run directory ``root`` in ``raw`` (``{}`` for an empty file), checked field by field."""
    if not raw:
        return {}
    try:
        state = json.loads(unseal_json(raw, binding(root)))
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        copied = (
            f" (with the same secret on every rank: written in another run directory and copied here, or this "
            f"machine sees {root} with another inode number than the one that wrote it: compare ls -id on each)"
            if "MAC mismatch" in str(exc) else ""
        )  # fmt: skip
        raise CorruptRecordError(
            f"the rendezvous file is not a sealed JSON record (foreign or corrupt): {exc}{copied}"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CorruptRecordError(f"the rendezvous file has an unknown format: {str(state)[:200]}")
    problem = _problem(state)
    if problem:
        raise CorruptRecordError(f"the rendezvous file is corrupt ({problem}): {str(state)[:200]}")
    return state


def encode(state: dict[str, Any], root: str) -> bytes:
    """The bytes of run directory ``root``'s record for ``state`` (what every writer of the rendezvous file writes)."""
    raw = seal_json(state, binding(root))
    if len(raw) > MAX_BYTES:
        raise RendezvousError(f"the rendezvous record would hold {len(raw)} bytes, more than {MAX_BYTES}")
    return raw


def _problem(state: dict[str, Any]) -> str | None:
    if not isinstance(state.get("generation"), str) or not _GENERATION_ID.fullmatch(state["generation"]):
        return "generation"
    world = state.get("world_size")
    if type(world) is not int or world < 1:
        return "world_size"
    if type(state.get("complete")) is not bool or not isinstance(state.get("conflict", ""), str):
        return "complete or conflict"
    replaced = state.get("replaced", [])
    if not (isinstance(replaced, list) and len(replaced) <= MAX_REPLACED):
        return "replaced"
    if not all(isinstance(g, str) and _GENERATION_ID.fullmatch(g) for g in replaced):
        return "replaced"
    if "min_size" in state or "max_size" in state:
        low, high = state.get("min_size"), state.get("max_size")
        if type(low) is not int or type(high) is not int or not 1 <= low <= high or world > high:
            return "min_size or max_size"
    waiting = state.get("waiting", [])
    if not (isinstance(waiting, list) and len(waiting) <= MAX_WAITING):
        return "waiting"
    for index, member in enumerate(waiting):
        problem = _member_problem(member)
        if problem:
            return f"waiting member {index}'s {problem}"
    members = state.get("members")
    if not isinstance(members, dict):
        return "members"
    for rank, member in members.items():
        if not (isinstance(rank, str) and _RANK.fullmatch(rank) and int(rank) < world):  # "²" is a digit too
            return f"member {rank!r}"
        problem = _member_problem(member)
        if problem:
            return f"member {rank}'s {problem}"
    return None


def _member_problem(member: Any) -> str | None:
    if not isinstance(member, dict):
        return "entry"
    for name, kind in {**_MEMBER_FIELDS, **_OPTIONAL_FIELDS}.items():
        if (name in _MEMBER_FIELDS or name in member) and type(member.get(name)) is not kind:
            return name
    return None


def mark_refused(old: bytes, nonce: str, reason: str, root: str) -> bytes | None:
    """Record that this rank refused the generation, so its peers fail with the same reason."""
    state = parse(old, root)
    mine = [m for m in state.get("members", {}).values() if m.get("nonce") == nonce]
    if not mine:
        return None
    mine[0].update(left=True, refused=reason)
    return encode(state, root)


#: How a rendezvous's messages name its members: the ranks of a job, or the launchers of a job's
#: nodes (one per node: ``fsdist run``'s and torchrun's own rendezvous, where "rank 0" and "world
#: size 1" would mean the launcher of node 0 and one node to a user who started 2 ranks).
RANKS, NODES = "rank", "node"


def member_name(unit: str, slot: int | str) -> str:
    return f"rank {slot}" if unit == RANKS else f"the launcher of node {slot}"


def size_name(unit: str, size: int) -> str:
    return f"world size {size}" if unit == RANKS else f"{size} node{'' if size == 1 else 's'} (--nnodes)"


def rank_taken_message(state: dict[str, Any], rank: int, me: dict[str, Any], unit: str = RANKS) -> str:
    """A rank joins a forming generation at a slot a live process holds: the same rank given twice
    (one job's launchers without their own --node-rank, say), or two jobs in one directory."""
    holder = state["members"][str(rank)]
    last = state["world_size"] - 1
    if unit == NODES:
        return (
            f"node rank {rank} was given twice: pid {holder['pid']} on {holder['host']} is the launcher of node "
            f"{rank} of the {state['world_size']} nodes forming in this directory (generation "
            f"{state['generation']}), and pid {me['pid']} on {me['host']} came as node {rank} too. Give each "
            f"node's launcher its own --node-rank, 0 to {last}; or, if these are two jobs, give each its own directory"
        )
    return (
        f"rank {rank} was given twice: pid {holder['pid']} on {holder['host']} holds rank {rank} of the "
        f"{state['world_size']} ranks forming in this directory (generation {state['generation']}), and pid "
        f"{me['pid']} on {me['host']} came as rank {rank} too. Give each rank (each node's launcher: its "
        f"--node-rank) its own number, 0 to {last}; or, if these are two jobs, give each its own directory"
    )


def conflict_message(
    state: dict[str, Any], rank: int | None, world_size: int, me: dict[str, Any], unit: str = RANKS
) -> str:
    """What the ranks already waiting in a forming generation are told when another joins badly."""
    if rank is not None and state["world_size"] == world_size and str(rank) in state.get("members", {}):
        return rank_taken_message(state, rank, me, unit)
    who = member_name(unit, rank) if rank is not None else f"a {unit}'s launcher" if unit == NODES else "a rank"
    if state["world_size"] != world_size:
        why = (
            f"with {size_name(unit, world_size)}, but this generation has {size_name(unit, state['world_size'])}: "
            + ("the launchers disagree on --nnodes" if unit == NODES else "the ranks disagree on the world size")
            + ", or two jobs use this directory"
        )
    else:
        why = "to a slot a live process already holds: two jobs use this directory"
    same = "every launcher of a job the same --nnodes" if unit == NODES else "every rank of a job the same world size"
    return (
        f"{who} (pid {me['pid']} on {me['host']}) tried to join generation {state['generation']} "
        f"{why}. Give {same}, and each job its own directory"
    )


def retire_own_stale_entries(state: dict[str, Any], me: dict[str, Any], in_use: Collection[str] = ()) -> bool:
    """Mark as left every entry of *this process* other than ``me`` (same machine, pid and start
    time, another nonce) in a formed generation; True if any was. Such an entry is an earlier init
    of this process whose group torch destroyed without fsdist hearing of it (a Gloo group formed
    through the directory): the process is starting afresh, so that membership is over. (In a
    generation still forming, another entry of this process is another thread's rank.)"""
    retired = False
    if not state.get("complete") or state.get("generation") in in_use:
        return False  # (``in_use``: generations an fsdist group of this process still runs on)
    for member in state.get("members", {}).values():
        same = all(member.get(k) == me.get(k) for k in ("host", "pid", "start_time", "machine"))
        if same and member.get("nonce") != me.get("nonce") and not member.get("left"):
            member["left"] = retired = True
    return retired
