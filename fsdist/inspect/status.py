"""What a run directory says about its job: who the ranks are, where each one is, who is late.

Everything fsdist knows lives in files, so a job can be inspected from any machine that sees
the directory, while it runs or after it crashed, without talking to any rank. This module only
reads: the rendezvous file (members), each rank's heartbeat counter, each group's state records
(position and description of the operation each rank is in or last finished), the groups'
abort markers and the launcher's failure record. Records are read under a shared fcntl lock,
as the ranks' own readers do, so on NFS they are as fresh as the ranks see them.

Times ("since", heartbeat age) come from file modification times: each write of a state record
or heartbeat updates its file's mtime. They are good enough for a display — on another machine
they include the clock difference to the file server — and are never used for liveness
decisions, which stay with the ranks themselves (``liveness.py``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ProtocolError, RendezvousError
from ..files.counters import decode_counter
from ..files.io import read_file
from ..files.locks import read_locked
from ..files.places import adopt_run_directory, existing_node_directory
from ..files.seal import seal
from ..job.liveness import Identity, heartbeat_timeout, is_alive, node_id
from ..job.nodes import Nodes
from ..protocol import failure_report, layout, rendezvous_record, state_record
from ..protocol.sealed import MAX_VALUE_BYTES, SEAL_BYTES, unseal_text, unseal_value
from .straggler import RankPosition, Straggler, find_straggler, holding_up, in_step_line, list_ranks

__all__ = ["GroupStatus", "MemberStatus", "RankPosition", "RunStatus", "Straggler", "read_status"]


@dataclass
class MemberStatus:
    """One rank of the job, as the rendezvous file and its heartbeat show it."""

    rank: int
    host: str
    pid: int
    #: "alive" / "dead" (checked in /proc: same machine), "heartbeat" (another machine, beating),
    #: "stalled" (another machine, no beat within the heartbeat limit), "unknown" (another
    #: machine, no heartbeat file), "left" (shut down).
    liveness: str
    heartbeat_age_s: float | None
    heartbeats: int | None


@dataclass
class GroupStatus:
    """One process group's directory."""

    name: str
    directory: str
    ranks: list[int] | None  # global ranks by group rank; None if unknown
    positions: list[RankPosition]
    abort: str | None
    straggler: Straggler | None


@dataclass
class RunStatus:
    """Everything ``fsdist status`` shows; ``to_json()`` is the ``--json`` form."""

    directory: str
    #: "none" (no job), "forming", "running", "finished" (every rank left), "crashed" (every rank
    #: that has not left is dead; `fsdist clean DIR` removes it)
    state: str
    generation: str | None = None
    world_size: int | None = None
    members: list[MemberStatus] = field(default_factory=list)
    groups: list[GroupStatus] = field(default_factory=list)
    launcher_failure: dict[str, Any] | None = None
    #: ``fsdist run --max-restarts``: the job's restart budget and each round's first failure
    restarts: dict[str, Any] | None = None
    #: ranks that are behind in some group and wait in none: where a chain of waits ends
    holding_up: list[int] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    time: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """Plain dicts and lists, as ``fsdist status --json`` prints them."""
        return asdict(self)

    def straggler(self) -> Straggler | None:
        """The world group's straggler, else the first subgroup's."""
        found = [g.straggler for g in self.groups if g.straggler is not None]
        return found[0] if found else None


def read_status(directory: str) -> RunStatus:
    """Read ``directory`` (a run directory, as given to ``--dir`` or ``fsdist://``) into a RunStatus."""
    directory = adopt_run_directory(directory, create=False)
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.lexists(directory) else "does not exist"
        raise FileNotFoundError(f"{directory} {what}")
    now = time.time()
    status = RunStatus(directory=directory, state="none", time=now)
    raw, _ = read_locked(os.path.join(directory, layout.RENDEZVOUS_FILE), max_size=rendezvous_record.MAX_BYTES)
    status.launcher_failure = _launcher_failure(directory)
    status.restarts = _restarts(directory)
    try:
        state = rendezvous_record.parse(raw, directory)
    except RendezvousError as exc:
        status.summary.append(f"{os.path.join(directory, layout.RENDEZVOUS_FILE)}: {exc}")
        return status
    if not state:
        failed = _add_failure_line(status)
        status.summary.insert(
            0,
            f"no job is running in {directory}; the last one failed:"
            if failed
            else f"no job in {directory} (none started yet, or the last one finished cleanly)",
        )
        return status
    status.generation = state["generation"]
    status.world_size = state["world_size"]
    members = {int(r): m for r, m in state["members"].items()}
    gen_dir = layout.generation_dir(directory, status.generation)
    status.members = [_member(gen_dir, r, m, now) for r, m in sorted(members.items())]
    if not state.get("complete"):
        status.state = "forming"
        missing = sorted(set(range(status.world_size)) - set(members))
        status.summary.append(
            f"generation {status.generation} is forming: {len(members)} of {status.world_size} ranks joined"
            + (f" (waiting for ranks {list_ranks(missing)})" if missing else "")
        )
    elif all(m.liveness == "left" for m in status.members):
        status.state = "finished"
    elif all(m.liveness in ("left", "dead") for m in status.members):
        status.state = "crashed"
    else:
        status.state = "running"
    nodes_of = [Identity.from_json(members[r]).placement if r in members else "" for r in range(status.world_size)]
    status.groups = _groups(gen_dir, status.world_size, now, nodes_of)
    for member in status.members:
        if member.liveness in ("dead", "stalled"):
            why = "is dead (its process is gone)" if member.liveness == "dead" else "stopped its heartbeat"
            status.summary.append(f"rank {member.rank} (pid {member.pid} on {member.host}) {why}")
    status.holding_up = holding_up([g.straggler for g in status.groups if g.ranks is not None])
    world_late = next((g.straggler.ranks for g in status.groups if g.name == "world" and g.straggler), [])
    if status.holding_up and status.holding_up != world_late:
        one = len(status.holding_up) == 1
        status.summary.append(
            f"{'rank' if one else 'ranks'} {list_ranks(status.holding_up)} wait{'s' if one else ''} for no one, and "
            f"the others wait for {'it' if one else 'them'} (directly or through other ranks): start there"
        )
    if status.holding_up and len(set(nodes_of)) > 1:  # several nodes: say which machine to look at
        one = len(status.holding_up) == 1
        where_late = ", ".join(sorted({nodes_of[r] for r in status.holding_up if r < len(nodes_of)}))
        status.summary.append(
            f"{'rank' if one else 'ranks'} {list_ranks(status.holding_up)} holding the job up "
            f"{'runs' if one else 'run'} on node {where_late}"
        )
    for group in status.groups:
        where = "" if group.name == "world" else f" in group {group.name!r}"
        if group.abort:
            status.summary.append(f"group {group.name!r} was aborted: {group.abort}")
        if group.straggler is not None:
            status.summary.append(group.straggler.summary + where)
    if status.state == "running" and not any(g.straggler or g.abort for g in status.groups):
        status.summary.append(in_step_line(status.groups[0].positions if status.groups else []))
    _add_failure_line(status)
    return status


# ---- members ------------------------------------------------------------------------------


def _member(gen_dir: str, rank: int, data: dict[str, Any], now: float) -> MemberStatus:
    who = Identity.from_json(data)
    raw, mtime = read_locked(layout.heartbeat_file(gen_dir, rank))
    # the counter file exists from the start, empty until the first beat (after a second)
    try:
        beats = None if mtime is None else decode_counter(raw, layout.heartbeat_file(gen_dir, rank))
    except ProtocolError:
        beats = None  # a damaged counter: status still shows the rest (liveness comes from /proc)
    age = max(0.0, now - mtime) if mtime is not None else None
    alive = is_alive(who)
    if data.get("left"):
        liveness = "left"
    elif alive is not None:
        liveness = "alive" if alive else "dead"
    else:
        liveness = "unknown" if age is None else "heartbeat" if age <= heartbeat_timeout() else "stalled"
    return MemberStatus(rank, who.host, who.pid, liveness, age, beats)


# ---- groups -------------------------------------------------------------------------------


def _groups(gen_dir: str, world_size: int, now: float, nodes_of: list[str]) -> list[GroupStatus]:
    """Every group's status; a two-tier group's tiers follow it (``nodes_of``: each job rank's node)."""
    groups_dir = layout.groups_dir(gen_dir)
    try:
        names = sorted(os.listdir(groups_dir))
    except FileNotFoundError:
        return []
    groups = []
    for dirname in names:
        path = os.path.join(groups_dir, dirname)
        try:
            files = os.listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            continue  # the group closed while we looked
        count = max((r + 1 for f in files if (r := layout.state_file_rank(f)) is not None), default=0)
        ranks = _group_ranks(gen_dir, dirname)
        name = _group_name(dirname)
        if ranks is None and count == world_size and dirname.endswith(".0"):
            ranks, name = list(range(world_size)), "world"
        group = _group(name, path, count, ranks, now)
        tiers = _tiers(group, os.path.basename(gen_dir), nodes_of, now) if ranks is not None else []
        groups += [group, *tiers]
    groups.sort(key=lambda g: g.name != "world")
    return groups


def _group(name: str, path: str, count: int, ranks: list[int] | None, now: float) -> GroupStatus:
    positions = [_position(path, r, ranks, now) for r in range(count)]
    abort_path = os.path.join(path, layout.ABORT_FILE)
    abort_raw, _ = read_locked(abort_path)
    try:
        abort = unseal_text(abort_raw, layout.identity(abort_path)) if abort_raw else None
    except ValueError as exc:
        abort = f"(an abort record with no readable reason: {exc})"
    return GroupStatus(name, path, ranks, positions, abort, find_straggler(positions))


def _tiers(group: GroupStatus, generation: str, nodes_of: list[str], now: float) -> list[GroupStatus]:
    """A two-tier group's leaders' tier (shared) and this machine's node tier, where they exist.

    Their ranks' positions also move the group's own (whose records see only its flat
    operations and point-to-point messages): each rank shows the furthest it is seen at. Other
    nodes' tiers live on their machines: run ``fsdist status`` there to see them.
    """
    assert group.ranks is not None
    try:
        nodes = Nodes.of([nodes_of[r] for r in group.ranks])
    except IndexError:
        return []
    tiers = []
    leaders = os.path.join(group.directory, layout.LEADERS_DIR)
    if os.path.isdir(leaders):
        leader_ranks = [group.ranks[nodes.leader(k)] for k in range(len(nodes.members))]
        tiers.append(_group(f"{group.name} · leaders' tier", leaders, len(leader_ranks), leader_ranks, now))
    here = node_id()
    node = next((k for k, ranks in enumerate(nodes.members) if nodes_of[group.ranks[ranks[0]]] == here), None)
    own_folder = existing_node_directory()
    local = layout.node_group_dir(own_folder or "", generation.removeprefix("gen-"), here, group.directory)
    if node is not None and own_folder is not None and os.path.isdir(local):
        node_ranks = [group.ranks[r] for r in nodes.members[node]]
        tiers.append(_group(f"{group.name} · node {here}'s tier", local, len(node_ranks), node_ranks, now))
    if not tiers:
        return tiers
    seen_ranks = {seen.rank for tier in tiers for seen in tier.positions}
    latest = max((seen.seq for tier in tiers for seen in tier.positions), default=-1)
    for position in group.positions:  # a rank in another node's tier: where it is, is not known here
        if position.rank not in seen_ranks and not position.closed and position.seq <= latest:
            position.seq, position.step, position.description = -1, 0, "(in its node's tier, on its machine)"
    by_rank = {p.rank: p for p in group.positions}
    for tier in tiers:
        for seen in tier.positions:
            mine = by_rank.get(seen.rank)
            if mine is not None and not mine.closed and (seen.seq, seen.step) > (mine.seq, mine.step):
                mine.seq, mine.step, mine.description = seen.seq, seen.step, seen.description
                mine.since_s = seen.since_s
    group.straggler = find_straggler(group.positions)
    return tiers


def _group_ranks(gen_dir: str, dirname: str) -> list[int] | None:
    key_file = layout.key_to_filename(layout.GROUP_RANKS_KEY + dirname)
    path = os.path.join(layout.store_dir(gen_dir), key_file)
    try:  # published whole by rename: no lock needed
        raw = read_file(path, MAX_VALUE_BYTES + SEAL_BYTES, "a store value")
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return [int(r) for r in json.loads(unseal_value(raw, layout.identity(path)))] if raw else None
    except (ValueError, TypeError, RecursionError):
        return None


def _group_name(dirname: str) -> str:
    """``k.<escaped name>.<incarnation>`` back to the name torch gave the group."""
    base, _, incarnation = dirname.rpartition(".")
    name = layout.filename_to_key(base)
    if name is None:
        return dirname  # a long name stored as its digest
    return name if incarnation == "0" else f"{name} (#{incarnation})"


def _position(group_dir: str, group_rank: int, ranks: list[int] | None, now: float) -> RankPosition:
    path = layout.state_file(group_dir, group_rank)
    rank = ranks[group_rank] if ranks is not None and group_rank < len(ranks) else None
    for attempt in range(3):  # a direct record's writer takes no lock: a read may meet its write
        raw, mtime = read_locked(path, size=state_record.HEADER_SIZE)
        since = max(0.0, now - mtime) if mtime is not None else None
        try:
            state = state_record.decode(raw, path, seal(layout.identity(path)))
            break
        except ProtocolError:
            if attempt == 2:
                what = f"(not an fsdist v{state_record.VERSION} record)"
                return RankPosition(group_rank, rank, -1, 0, what, False, since)
    if state is state_record.NOT_STARTED:
        return RankPosition(group_rank, rank, -1, 0, "(no record yet)", False, since)
    what = state.description or "(no collective yet)"
    return RankPosition(group_rank, rank, state.seq, state.step, what, state.closed, since)


# ---- the launcher -------------------------------------------------------------------------


def _launcher_failure(directory: str) -> dict[str, Any] | None:
    """The first failure a launcher recorded (``.launch/gen-*/abort``), if any."""
    launch = os.path.join(directory, layout.LAUNCH_DIR)
    try:
        names = [n for n in os.listdir(launch) if layout.is_generation_dir(n)]
    except (FileNotFoundError, NotADirectoryError):
        return None
    for name in sorted(names):
        raw, _ = read_locked(os.path.join(launch, name, layout.ABORT_FILE), max_size=failure_report.MAX_BYTES)
        if raw:
            try:
                return failure_report.parse(raw)
            except ValueError as exc:
                return {"reason": f"unreadable failure record ({exc})"}
    return None


def _restarts(directory: str) -> dict[str, Any] | None:
    """The restart history of the job last run here by ``fsdist run`` (``.launch/rounds``), if any."""
    raw, _ = read_locked(
        os.path.join(directory, layout.LAUNCH_DIR, layout.ROUNDS_FILE), max_size=failure_report.MAX_BYTES
    )
    if not raw:
        return None
    try:
        return failure_report.parse_rounds(raw, directory)
    except ValueError as exc:
        return {"reason": f"unreadable restart history ({exc})"}


def _add_failure_line(status: RunStatus) -> bool:
    """Add what the launcher recorded of failures; True where the job last run here failed."""
    failure = status.launcher_failure
    if failure is not None:
        status.summary.append(f"the launcher recorded a failure of {_failure_text(failure)}")
    history = status.restarts
    if history is None:
        return failure is not None
    if "rounds" not in history:
        status.summary.append(str(history.get("reason")))
        return failure is not None
    rounds, budget = history["rounds"], history["max_restarts"]
    if not rounds:
        return failure is not None  # the job last run here had no failed round
    restarted = sum(1 for entry in rounds if entry["round"] < budget and not entry.get("final"))
    ended = rounds[-1]["round"] >= budget or bool(rounds[-1].get("final"))
    status.summary.append(
        f"fsdist run --max-restarts {budget} (job {history['job']}): restarted {restarted} time"
        f"{'' if restarted == 1 else 's'}" + ("; then the job failed" if ended else "")
    )
    for entry in rounds:
        status.summary.append(f"  round {entry['round']} ended by {_failure_text(entry)}")
    return failure is not None or ended


def _failure_text(failure: dict[str, Any]) -> str:
    who = "the launcher" if int(failure.get("rank", -1)) < 0 else f"rank {failure['rank']}"
    if "exit_code" in failure:
        who += f" (exit code {failure['exit_code']}" + (f" on {failure['host']})" if "host" in failure else ")")
    what = failure.get("type") or ""
    text = str(failure.get("message") or failure.get("reason") or "")
    return f"{who}: {what + ': ' if what else ''}{text}"
