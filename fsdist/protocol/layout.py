"""Every name in a run directory, written down once; every reader and writer imports it.

    DIR/                                 the run directory (one job at a time)
      fsdist-rendezvous.json             the rendezvous record (rendezvous_record.py)
      .launch/                           `fsdist run`'s launchers: a rendezvous of their own
        fsdist-rendezvous.json
        rounds                           the restart history: each round's first failure (JSON)
        gen-<id>/abort                   the launchers' first-failure record (JSON)
        gen-<id>/done                    how many launchers' ranks all succeeded (Counter)
        gen-<id>/error.r<rank>.json      a rank's uncaught exception (cli/run_rank.py)
      gen-<id>/                          one generation of the job (16 hex digits)
        heartbeat.r<rank>                a liveness counter (files/locks.py Counter)
        io-probe.c<n>                    FSDIST_IO=auto's probe of the n-th client's direct
                                         writes (job/io_choice.py), while the job forms
        store/                           the DirectoryStore: .lock, k.<escaped key>, h.<sha256>
        groups/<escaped group name>.<incarnation>/
          state.r<rank>                  a rank's state record (state_record.py)
          abort                          why the group was aborted (UTF-8 text)
          closed                         how many ranks closed the group (Counter)
          wake.r<rank>, pwake.r<rank>    a rank's doorbells (FIFOs): collectives, point-to-point
          m<seq>.<step>.r<rank>          a collective message (message.py)
          p<src>-<dst>.<index>           a point-to-point message (message.py)
          ring<src>-<dst>                a sender's ring file of mid-size messages to one peer
          ring<rank>                     a rank's ring file of mid-size collective messages
                                         (both: local filesystems only, transport/rings.py)
          .spare.r<rank>.<n>             a retired message file kept for reuse
          leaders/                       two-tier groups: the leaders' tier (one rank per
                                         node), with the same files as its group folder
    ENDPOINT/RUN_ID/agents/              torchrun's agents (--rdzv-backend=fsdist): a rendezvous
    ENDPOINT/RUN_ID/workers/             their workers' run directory (a DIR as above)
    LOCAL/fsdist-<uid>/                  this user's own folder on the node (fsdist-group-<gid> with
                                         FSDIST_GROUP; LOCAL: FSDIST_LOCAL_DIR, default /dev/shm)
      tier-<gen id>-<node hash>-<group folder>/  two-tier groups: one node's tier, same files
      run-<random>/                      a single-machine job's run directory (a DIR as above)
    any folder: .tmp.<name>.<8 hex>      a file being written, renamed to <name> when complete
                                         (the file layer's own convention: files/io.py)

Store keys become file names by ``key_to_filename``: bytes outside ``[A-Za-z0-9_-]`` become
``%XX``, prefixed ``k.``; a name longer than 200 characters is ``h.`` + the key's SHA-256 instead.
"""

from __future__ import annotations

import hashlib
import os
import re

__all__ = [
    "ABORT_FILE",
    "CLOSED_FILE",
    "DONE_FILE",
    "GROUP_ALGO_KEY",
    "GROUP_RANKS_KEY",
    "IO_PROBE_KEY",
    "LAUNCH_DIR",
    "LEADERS_DIR",
    "LOCAL_RUN_PREFIX",
    "LOCK_PROBE_KEY",
    "NESTED_PREFIX",
    "RENDEZVOUS_FILE",
    "ROUNDS_FILE",
    "STORE_LOCK_FILE",
    "collective_ring_name",
    "doorbell_file",
    "error_file",
    "filename_to_key",
    "generation_dir",
    "generation_id_of",
    "group_dir",
    "groups_dir",
    "heartbeat_file",
    "identity",
    "io_probe_file",
    "is_generation_dir",
    "is_store_key_file",
    "key_to_filename",
    "lock_probe_file",
    "message_name",
    "node_group_dir",
    "node_ranks_file",
    "node_tier_prefix",
    "p2p_doorbell_file",
    "p2p_name",
    "spare_name",
    "state_file",
    "state_file_rank",
    "store_dir",
]

RENDEZVOUS_FILE = "fsdist-rendezvous.json"
LAUNCH_DIR = ".launch"
LEADERS_DIR = "leaders"
ABORT_FILE = "abort"
DONE_FILE = "done"
ROUNDS_FILE = "rounds"
CLOSED_FILE = "closed"
#: Store key a subgroup's rank 0 sets to the JSON list of the job ranks in the group (its
#: folder name follows), so `fsdist status` can name job ranks.
GROUP_RANKS_KEY = "fsdist/group-ranks/"
#: Store key a group's rank 0 sets to how it runs the group's collectives (``flat`` or
#: ``hier``; its folder name follows): every other rank checks it decided alike.
GROUP_ALGO_KEY = "fsdist/group-algo/"
#: The DirectoryStore's lock, taken for read-modify-write changes (add, compare_set, append).
STORE_LOCK_FILE = ".lock"

_GENERATION = "gen-"
_STATE_FILE = re.compile(r"state\.r(\d+)")
_SAFE_KEY_BYTE = re.compile(rb"[A-Za-z0-9_\-]")
_MAX_KEY_NAME = 200


_ANCHOR = re.compile(r"gen-[0-9a-f]{16}|tier-[0-9a-f]{16}-.+|run-[0-9a-f]{16}")


def identity(path: str) -> str:
    """What a file is, through whichever mount it is reached: its path from the folder of its
    generation (or node tier) down, e.g. ``gen-<id>/groups/k.0.0/m5.1.r1``; the name alone for a
    file outside one (``fsdist-rendezvous.json``). Seals bind it (files/seal.py): a valid item
    copied into another file, group or job fails its check there."""
    parts = path.split(os.sep)
    for index in range(len(parts) - 1, -1, -1):
        if _ANCHOR.fullmatch(parts[index]):
            return "/".join(parts[index:])
    return parts[-1]


def generation_dir(root: str, generation_id: str) -> str:
    return os.path.join(root, _GENERATION + generation_id)


def is_generation_dir(name: str) -> bool:
    return name.startswith(_GENERATION)


def generation_id_of(name: str) -> str:
    """The generation id in a generation folder's name (``gen-<id>``)."""
    return name.removeprefix(_GENERATION)


def heartbeat_file(generation: str, rank: int) -> str:
    return os.path.join(generation, f"heartbeat.r{rank}")


def io_probe_file(generation: str, client: int) -> str:
    return os.path.join(generation, f"io-probe.c{client}")


def lock_probe_file(generation: str, client: int) -> str:
    return os.path.join(generation, f"lock-probe.c{client}")


#: the start-up lock check's store keys (job/lock_check.py): each client's steps, its verdict, the result
LOCK_PROBE_KEY = "fsdist/lock-probe/"

#: FSDIST_IO=auto's store keys (job/io_choice.py): each client's probe steps, its verdict, the choice
IO_PROBE_KEY = "fsdist/io-probe/"


def store_dir(generation: str) -> str:
    return os.path.join(generation, "store")


def groups_dir(generation: str) -> str:
    return os.path.join(generation, "groups")


def group_dir(generation: str, group_name: str, incarnation: int) -> str:
    """A group's folder: its name escaped like a store key, and how many groups of that name
    this job created before it (torch may give a re-created group the name of a destroyed one)."""
    return os.path.join(groups_dir(generation), f"{key_to_filename(group_name)}.{incarnation}")


def node_group_dir(local: str, generation_id: str, node: str, group: str) -> str:
    """Node ``node``'s tier of a group: in ``local`` (this user's own folder of the node's
    directory: files/trust.py ``node_directory``), named by the generation, the node (a hash of
    its id) and the group's folder, so no other job, group or node shares it (nodes may share a
    ``local``: containers with one /dev/shm, nodes simulated on one machine), and a node's tiers
    can be removed without touching another's."""
    return os.path.join(local, f"{node_tier_prefix(generation_id, node)}{os.path.basename(group)}")


#: The start of the run directory of a job formed inside a running generation's folder by the same
#: processes (``nested.<n>``: job/generation.py ``nested_root``).
NESTED_PREFIX = "nested."

#: The start of a single-machine job's run directory in this user's node-local folder
#: (``run-<random>``: c10d/store_rendezvous.py).
LOCAL_RUN_PREFIX = "run-"


def node_tier_prefix(generation_id: str, node: str | None = None) -> str:
    """What the names of a generation's node tiers begin with: all of them, or ``node``'s."""
    if node is None:
        return f"tier-{generation_id}-"
    return f"tier-{generation_id}-{hashlib.sha256(node.encode()).hexdigest()[:12]}-"


def state_file(group: str, rank: int) -> str:
    return os.path.join(group, f"state.r{rank}")


def state_file_rank(name: str) -> int | None:
    """The rank whose state record ``name`` is, or None for another file."""
    match = _STATE_FILE.fullmatch(name)
    return int(match.group(1)) if match else None


def doorbell_file(group: str, rank: int) -> str:
    """A rank's FIFO rung when it may find a new step of a collective."""
    return os.path.join(group, f"wake.r{rank}")


def p2p_doorbell_file(group: str, rank: int) -> str:
    """A rank's FIFO rung when a point-to-point message arrives for it."""
    return os.path.join(group, f"pwake.r{rank}")


def message_name(rank: int, seq: int, step: int) -> str:
    """The message ``rank`` publishes at ``step`` of operation ``seq``."""
    return f"m{seq}.{step}.r{rank}"


def ring_name(src: int, dst: int) -> str:
    """The ring file of ``src``'s mid-size messages to ``dst`` (local filesystems only)."""
    return f"ring{src}-{dst}"


def collective_ring_name(rank: int) -> str:
    """The ring file of ``rank``'s mid-size collective messages (local filesystems only)."""
    return f"ring{rank}"


def p2p_name(src: int, dst: int, index: int) -> str:
    """The ``index``-th message ``src`` sends ``dst`` (counted from 0 per pair)."""
    return f"p{src}-{dst}.{index}"


def spare_name(rank: int, number: int) -> str:
    return f".spare.r{rank}.{number}"


def error_file(launch_generation: str, rank: int) -> str:
    return os.path.join(launch_generation, f"error.r{rank}.json")


def node_ranks_file(launch_generation: str, node: int) -> str:
    """Where node ``node``'s launcher says how many ranks it starts (protocol/node_ranks.py)."""
    return os.path.join(launch_generation, f"nproc.n{node}.json")


def key_to_filename(key: str) -> str:
    """An injective, path-safe file name for a store key (no '/', never '.' or '..')."""
    raw = key.encode()
    escaped = "".join(chr(b) if _SAFE_KEY_BYTE.fullmatch(bytes([b])) else f"%{b:02X}" for b in raw)
    name = "k." + escaped
    if len(name) > _MAX_KEY_NAME:  # long keys: a digest keeps names within filesystem limits
        name = "h." + hashlib.sha256(raw).hexdigest()
    return name


def filename_to_key(name: str) -> str | None:
    """``key_to_filename`` undone; None for a digest name (``h.``), which cannot be."""
    if not name.startswith("k."):
        return None
    raw = re.sub(rb"%([0-9A-F]{2})", lambda m: bytes([int(m.group(1), 16)]), name[2:].encode())
    return raw.decode(errors="replace")


def is_store_key_file(name: str) -> bool:
    return name.startswith(("k.", "h."))
