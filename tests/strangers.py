"""Another user on the same filesystem and node, tried for real: a victim uid, an attacker uid.

Run as root by tests/test_strangers.py (``python strangers.py OUT.json``): this fresh interpreter
imports everything a rank needs, then forks children that drop to unprivileged uids (root
ignores file modes, so root is never the victim). Children cannot read the interpreter's files
after dropping privileges (the virtual environment may be private to root), which is why
everything is imported before the first fork and why no rank is a new process. Each scenario's
findings go into one JSON file; the test module asserts on each separately.

The shared places are folders made here: ``shared`` is sticky and world-writable like /tmp, and
``shm`` stands for /dev/shm (FSDIST_LOCAL_DIR points there).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import select
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import fsdist
import fsdist.c10d.backend
import fsdist.c10d.placement
import fsdist.c10d.store_rendezvous
import fsdist.cli.bench_locks
import fsdist.cli.clean
import fsdist.cli.doctor
import fsdist.cli.run
import fsdist.cli.status  # noqa: F401
from fsdist.cli.main import main as fsdist_main
from fsdist.protocol import layout, rendezvous_record, state_record

try:  # the attacker's FUSE daemon: mfusepy (the test extra) over libfuse 3 (Debian's fuse3)
    import impostor_fs
except (ImportError, OSError) as _missing:  # reported by the scenario that needs it
    impostor_fs, FUSE_MISSING = None, f"{type(_missing).__name__}: {_missing}"

VICTIM, ATTACKER, COLLEAGUE = 1001, 1002, 1003
SHARED_GID = 2000  # the group the victim and the colleague share (the attacker is not in it)
#: what the victim's ranks all_reduce: bytes an attacker who read any message would find
MARKER = 31415.926
REFUSE_WITHIN = 5.0


def as_user(uid: int, function: Callable[..., Any], *args: Any, groups: tuple[int, ...] = (), umask: int = 0o077,
            env: dict[str, str] | None = None) -> int:  # fmt: skip
    """Fork a child that becomes ``uid`` and runs ``function(*args)``; returns (pid, read end)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return pid, read_end  # type: ignore[return-value]
    os.close(read_end)
    started = time.monotonic()
    try:
        os.setgroups(list(groups))
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        os.umask(umask)
        os.environ.update(env or {})
        result = {"value": function(*args)}
    except BaseException as exc:  # noqa: BLE001 - every outcome goes back to the parent
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    result["seconds"] = time.monotonic() - started
    data = json.dumps(result, default=str).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(write_end, view[:65536]) :]
    os._exit(0)


def collect(children: list[Any], timeout: float = 90) -> list[dict[str, Any]]:
    """Every child's result (``{"error": "timed out"}`` for one killed at the deadline)."""
    end = time.monotonic() + timeout
    out = []
    for pid, fd in children:
        chunks = []
        while True:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                chunks = [json.dumps({"error": "timed out (killed)"}).encode()]
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(fd)
        os.waitpid(pid, 0)
        raw = b"".join(chunks)
        out.append(json.loads(raw) if raw else {"error": "the child died without a word"})
    return out


def one(uid: int, function: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    return collect([as_user(uid, function, *args, **kwargs)])[0]


# ---- what a victim rank does ---------------------------------------------------------------


def rank_job(rank: int, world: int, init_method: str, env: dict[str, str]) -> dict[str, Any]:
    """One rank of the victim's job: form the group, all_reduce MARKER-filled tensors (small and
    large, so records and files both carry them), check the sums."""
    os.environ.update(env)
    kwargs: dict[str, Any] = {"rank": rank, "world_size": world, "timeout": timedelta(seconds=30)}
    if init_method.startswith("tcp://"):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=init_method.rsplit(":", 1)[1], FSDIST_ENV_INIT="torch")
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
        dist.init_process_group("fsdist", timeout=kwargs["timeout"])
    else:
        dist.init_process_group("fsdist", init_method=init_method, **kwargs)
    try:
        right = True
        for numel in (4, 1 << 16, 1 << 19):
            tensor = torch.full((numel,), MARKER, dtype=torch.float32)
            dist.all_reduce(tensor)
            right = right and bool((tensor == MARKER * world).all())
        return {"right": right}
    finally:
        dist.destroy_process_group()


def job(
    uid: int, world: int, init_method: str, env: dict[str, str] | None = None, timeout: float = 90, **kwargs: Any
) -> list[dict[str, Any]]:
    children = [as_user(uid, rank_job, r, world, init_method, dict(env or {}), **kwargs) for r in range(world)]
    return collect(children, timeout=timeout)


# ---- what an attacker does ------------------------------------------------------------------


def marker_bytes() -> bytes:
    return struct.pack("<f", MARKER) * 4


def scan_for_marker(*roots: str) -> dict[str, Any]:
    """Everything this user can read under ``roots``: files read, and those holding the marker."""
    needle, read, found, denied = marker_bytes(), 0, [], 0
    for root in roots:
        for folder, _dirs, files in os.walk(root, onerror=lambda e: None):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    with open(path, "rb") as f:
                        data = f.read(64 << 20)
                except OSError:
                    denied += 1
                    continue
                read += 1
                if needle in data:
                    found.append(path)
    return {"read": read, "found": found, "denied": denied}


def plant_adopted_run_directory(path: str, mode: int = 0o777) -> None:
    """The first reproduction: a 0777 run directory with a forming generation and 0666 files."""
    os.mkdir(path)
    os.chmod(path, mode | (os.stat(path).st_mode & 0o2000))
    generation = "0123456789abcdef"
    state = {"format": 1, "generation": generation, "world_size": 2, "members": {}, "complete": False}
    record = os.path.join(path, layout.RENDEZVOUS_FILE)
    with open(record, "wb") as f:
        f.write(rendezvous_record.encode(state, path))
    os.chmod(record, 0o666 if mode == 0o777 else 0o660)
    gen = layout.generation_dir(path, generation)
    group = layout.group_dir(gen, "0", 0)
    for folder in (gen, layout.store_dir(gen), layout.groups_dir(gen), group):
        os.mkdir(folder)
        os.chmod(folder, mode)
    for name in ("state.r0", "state.r1", "ring0", "ring1", "abort", "closed"):
        file = os.path.join(group, name)
        with open(file, "wb"):
            pass
        os.chmod(file, 0o666 if mode == 0o777 else 0o660)


def try_to_write(*paths: str) -> list[str]:
    """The paths this user could create or open for writing (there should be none)."""
    wrote = []
    for path in paths:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o666)
            os.close(fd)
            wrote.append(path)
        except OSError:
            pass
    return wrote


# ---- scenarios ------------------------------------------------------------------------------


def scenario_adopted_run_directory(shared: str, shm: str) -> dict[str, Any]:
    """1: a run directory the attacker made (0777, a forming generation, 0666 records)."""
    path = os.path.join(shared, "fsdist-quickstart")
    planted = one(ATTACKER, plant_adopted_run_directory, path)
    env = {"FSDIST_LOCAL_DIR": shm}
    ranks = job(VICTIM, 2, f"fsdist://{path}", env)
    script = os.path.abspath(__file__)  # (it exists; the launcher refuses the directory before any rank runs)
    launcher = one(VICTIM, cli, ["run", "--nproc-per-node", "2", "--dir", path, script], env=env)
    scan = one(ATTACKER, scan_for_marker, shared, shm)
    return {"planted": planted, "ranks": ranks, "launcher": launcher, "scan": scan, "path": path}


def scenario_private_directory_in_shared_place(shared: str, shm: str) -> dict[str, Any]:
    """The same place, a directory of the victim's own: the job runs; the attacker reads nothing,
    and can plant nothing inside."""
    path = os.path.join(shared, "victims-run")
    env = {"FSDIST_LOCAL_DIR": shm}
    # two tiers (two simulated nodes of two ranks), so node tiers exist in shm too
    children = [
        as_user(VICTIM, rank_job, r, 4, f"fsdist://{path}", {**env, "FSDIST_NODE_ID": f"node{r // 2}"})
        for r in range(4)
    ]
    attacker = as_user(ATTACKER, _watch_and_plant, path, shm, 6.0)
    ranks = collect(children)
    watched = collect([attacker])[0]
    return {"ranks": ranks, "attacker": watched, "scan": one(ATTACKER, scan_for_marker, shared, shm)}


def _watch_and_plant(path: str, shm: str, seconds: float) -> dict[str, Any]:
    """For ``seconds``: read whatever can be read, plant files wherever a name can be guessed."""
    end, wrote, seen = time.monotonic() + seconds, set(), set()
    needle, found = marker_bytes(), set()
    while time.monotonic() < end:
        for root in (path, shm):
            for folder, _, files in os.walk(root, onerror=lambda e: None):
                seen.add(folder)
                for name in files:
                    try:
                        with open(os.path.join(folder, name), "rb") as f:
                            if needle in f.read(1 << 22):
                                found.add(os.path.join(folder, name))
                    except OSError:
                        pass
        guesses = [os.path.join(path, "gen-x"), os.path.join(path, layout.RENDEZVOUS_FILE)]
        guesses += [os.path.join(shm, f"fsdist-{VICTIM}", "planted")]
        wrote.update(try_to_write(*guesses))
        time.sleep(0.05)
    return {"found": sorted(found), "wrote": sorted(wrote), "folders": len(seen)}


def scenario_predictable_node_folder(shared: str, shm: str) -> dict[str, Any]:
    """2: the attacker takes the victim's node-local folder name first (a 0777 directory, then a
    symbolic link): the victim refuses, on every rank, naming it."""
    out = {}
    for how in ("directory", "symlink"):
        local = os.path.join(shm, how)
        one(0, _make_sticky, local)
        taken = os.path.join(local, f"fsdist-{VICTIM}")
        if how == "directory":
            one(ATTACKER, _mkdir_mode, taken, 0o777)
        else:
            one(ATTACKER, os.symlink, os.path.join(shared, "elsewhere"), taken)
        path = os.path.join(shared, f"victim-tiers-{how}")
        env = {"FSDIST_LOCAL_DIR": local}
        children = [
            as_user(VICTIM, rank_job, r, 4, f"fsdist://{path}", {**env, "FSDIST_NODE_ID": f"node{r // 2}"})
            for r in range(4)
        ]
        out[how] = {"ranks": collect(children), "path": taken}
    # a job that keeps nothing node-local (flat, one node each) is not stopped by it: not when it
    # leaves, not after a crash (its next job replaces the generation), not by `fsdist clean`
    local = os.path.join(shm, "directory")
    path = os.path.join(shared, "victim-flat")
    env = {"FSDIST_LOCAL_DIR": local}
    out["flat"] = {
        "first": job(VICTIM, 2, f"fsdist://{path}", env),
        "crash": collect([as_user(VICTIM, _crash_a_job, path, env)])[0],
        "next": job(VICTIM, 2, f"fsdist://{path}", env),
        "clean": one(VICTIM, cli, ["clean", path], env=env),
    }
    # FSDIST_LOCAL_DIR itself writable by everyone without the sticky bit: refused
    loose = os.path.join(shm, "loose")
    one(0, _mkdir_mode, loose, 0o777)
    out["loose"] = {"ranks": job(VICTIM, 1, f"fsdist://{shared}/victim-loose", {"FSDIST_LOCAL_DIR": loose,
                    "FSDIST_ALGO": "hier"}), "path": loose}  # fmt: skip
    return out


def _make_sticky(path: str) -> None:
    os.mkdir(path)
    os.chmod(path, 0o1777)


def _mkdir_mode(path: str, mode: int) -> None:
    os.mkdir(path)
    os.chmod(path, mode)


def scenario_garbage_collection(shared: str, shm: str) -> dict[str, Any]:
    """3: the victim's own folder holds gen-notes/ (and a stray gen-1002/); a crashed job there
    is replaced by the next: only the recorded generation goes. A record wedged by a bad
    ``replaced`` entry is repaired by ``fsdist clean``. ``--dir`` /tmp-like (world-writable) is
    refused outright."""
    home = os.path.join(shared, "victim-home")
    env = {"FSDIST_LOCAL_DIR": shm}
    one(VICTIM, _make_home, home)
    crashed = collect([as_user(VICTIM, _crash_a_job, home, env)])[0]
    after = job(VICTIM, 2, f"fsdist://{home}", env)
    kept = one(VICTIM, _listing, home)
    one(VICTIM, _wedge, home)
    wedged = job(VICTIM, 1, f"fsdist://{home}", env)
    cleaned = one(VICTIM, _clean, home)
    repaired = job(VICTIM, 1, f"fsdist://{home}", env)
    world_writable = job(VICTIM, 1, f"fsdist://{shared}", env)
    return {
        "crashed": crashed, "after": after, "kept": kept, "wedged": wedged, "cleaned": cleaned,
        "repaired": repaired, "world_writable": world_writable, "shared": shared,
    }  # fmt: skip


def _make_home(home: str) -> None:
    os.mkdir(home, 0o755)
    os.makedirs(os.path.join(home, "gen-notes"))
    with open(os.path.join(home, "gen-notes", "thesis.txt"), "w") as f:
        f.write("four years of work\n")
    os.makedirs(os.path.join(home, "gen-1002"))


def _crash_a_job(home: str, env: dict[str, str]) -> dict[str, Any]:
    """Rank 0 of a 1-rank job that dies without leaving: its generation stays recorded."""
    pid = os.fork()
    if pid == 0:
        try:
            rank_job_without_leaving(home, env)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    with open(os.path.join(home, layout.RENDEZVOUS_FILE), "rb") as f:
        return {"recorded": rendezvous_record.parse(f.read(), home)}


def rank_job_without_leaving(home: str, env: dict[str, str]) -> None:
    os.environ.update(env)
    dist.init_process_group("fsdist", init_method=f"fsdist://{home}", rank=0, world_size=1)
    tensor = torch.full((4,), MARKER)
    dist.all_reduce(tensor)
    os._exit(0)  # no destroy, no leave: a crash


def _listing(home: str) -> dict[str, Any]:
    return {
        "names": sorted(os.listdir(home)),
        "thesis": open(os.path.join(home, "gen-notes", "thesis.txt")).read(),
    }


def _wedge(home: str) -> None:
    """What fsdist before this change wrote after deleting gen-notes: a record its parser refuses."""
    state = {"format": 1, "generation": "0123456789abcdef", "world_size": 1, "members": {}, "complete": False,
             "replaced": ["notes"]}  # fmt: skip
    path = os.path.join(home, layout.RENDEZVOUS_FILE)
    body = json.dumps(state).encode()
    with open(path, "wb") as f:
        f.write(body + b"\n#crc32=%08x\n" % zlib.crc32(body))


def _clean(home: str) -> dict[str, Any]:
    return {**cli(["clean", home]), "names": sorted(os.listdir(home))}


def cli(argv: list[str]) -> dict[str, Any]:
    """``fsdist ARGV`` in this process (a child cannot start Python: see the docstring)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = fsdist_main(argv)
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}


def scenario_node_local_sweep(shared: str, shm: str) -> dict[str, Any]:
    """4: a single-machine job (torch's TCPStore, so its run directory is node-local) starts at
    once beside a planted 16 GiB sparse record and a directory whose lock the attacker holds,
    in the old names; and beside the same inside the victim's own folder (damage of its own)."""
    planted = one(ATTACKER, _plant_in_shm, shm, f"fsdist-{VICTIM}-")
    own = os.path.join(shm, f"fsdist-{VICTIM}")
    one(VICTIM, _mkdir_mode, own, 0o700)
    damaged = one(VICTIM, _plant_in_shm, own, layout.LOCAL_RUN_PREFIX)
    holder = as_user(VICTIM, _hold_lock, os.path.join(own, layout.LOCAL_RUN_PREFIX + "locked"), 6.0)
    time.sleep(0.5)
    port = _free_port()
    env = {"FSDIST_LOCAL_DIR": shm}
    ranks = job(VICTIM, 2, f"tcp://127.0.0.1:{port}", env)
    collect([holder])
    return {"planted": planted, "damaged": damaged, "ranks": ranks}


def _plant_in_shm(folder: str, prefix: str) -> None:
    for name in ("sparse", "locked"):
        path = os.path.join(folder, prefix + name)
        os.mkdir(path)
        with open(os.path.join(path, layout.RENDEZVOUS_FILE), "wb") as f:
            if name == "sparse":
                f.truncate(16 << 30)


def _hold_lock(folder: str, seconds: float) -> None:
    import fcntl

    with open(os.path.join(folder, layout.RENDEZVOUS_FILE), "r+b") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)
        time.sleep(seconds)


def _free_port() -> int:
    import socket  # torch's own TCPStore, the route under test; fsdist itself opens none

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scenario_symlinked_run_directory(shared: str, shm: str) -> dict[str, Any]:
    """5: a run directory named through a symbolic link: the attacker's link is refused, even to a
    directory of the victim's; the victim's own link is followed, and its target checked."""
    target = os.path.join(shared, "victim-target")
    one(VICTIM, _mkdir_mode, target, 0o700)
    theirs, mine = os.path.join(shared, "attackers-link"), os.path.join(shared, "victims-link")
    one(ATTACKER, os.symlink, target, theirs)
    one(VICTIM, os.symlink, target, mine)
    env = {"FSDIST_LOCAL_DIR": shm}
    return {
        "attackers_link": job(VICTIM, 2, f"fsdist://{theirs}", env),
        "victims_link": job(VICTIM, 2, f"fsdist://{mine}", env),
        "target_after": one(VICTIM, os.listdir, target),
    }


def scenario_group_tricks(shared: str, shm: str) -> dict[str, Any]:
    """A folder of the shared group that everyone may write (set-group-ID, so what anyone makes
    there is the group's): the attacker, not in the group, plants a run directory of the group
    there; the victim and the colleague refuse it. And a group folder made without the
    set-group-ID bit (mkdir -m 770; chgrp): the job runs, its files the group's."""
    open_door = os.path.join(shared, "projx-drop")
    one(0, _group_folder, open_door, 0o3777)
    planted = os.path.join(open_door, "run")
    one(ATTACKER, plant_adopted_run_directory, planted, 0o770)
    env = {"FSDIST_LOCAL_DIR": shm, "FSDIST_GROUP": "projx"}
    planted_ranks = collect(
        [
            as_user(uid, rank_job, rank, 2, f"fsdist://{planted}", env, groups=(SHARED_GID,))
            for rank, uid in enumerate((VICTIM, COLLEAGUE))
        ]
    )
    no_setgid = os.path.join(shared, "projx-run")
    one(VICTIM, _group_folder, no_setgid, 0o770, groups=(SHARED_GID,))
    ranks = collect(
        [
            as_user(uid, rank_job, rank, 2, f"fsdist://{no_setgid}", env, groups=(SHARED_GID,))
            for rank, uid in enumerate((VICTIM, COLLEAGUE))
        ]
    )
    return {"planted": planted_ranks, "path": planted, "no_setgid": ranks}


def _group_folder(path: str, mode: int) -> None:
    os.mkdir(path)
    os.chown(path, -1, SHARED_GID)
    os.chmod(path, mode)


def scenario_umask_002(shared: str, shm: str) -> dict[str, Any]:
    """A user whose umask is 002 and whose group is their own (a user-private group, the default of
    many systems) makes the run directory 0775 themselves: it is theirs, and it is taken."""
    path = os.path.join(shared, "upg-run")
    one(VICTIM, os.mkdir, path, 0o775, umask=0o002)
    return {"ranks": job(VICTIM, 2, f"fsdist://{path}", {"FSDIST_LOCAL_DIR": shm}, umask=0o002)}


def scenario_group_access(shared: str, shm: str) -> dict[str, Any]:
    """Two users of one group run one job (FSDIST_GROUP): it works under umask 077, the files are
    the group's, and the attacker (not in it) reads and plants nothing. The old switch is
    refused, naming the new one."""
    path = os.path.join(shared, "group-run")
    env = {"FSDIST_LOCAL_DIR": shm, "FSDIST_GROUP": str(SHARED_GID)}
    children = [
        as_user(uid, rank_job, rank, 2, f"fsdist://{path}", env, groups=(SHARED_GID,))
        for rank, uid in enumerate((VICTIM, COLLEAGUE))
    ]
    attacker = as_user(ATTACKER, _watch_and_plant, path, shm, 4.0)
    ranks = collect(children)
    old = job(VICTIM, 1, f"fsdist://{path}-old", {"FSDIST_LOCAL_DIR": shm, "FSDIST_GROUP_ACCESS": "1"})
    not_member = job(ATTACKER, 1, f"fsdist://{path}-x", env)
    mode = one(0, lambda: oct(os.stat(path).st_mode) + f" gid {os.stat(path).st_gid}")
    return {"ranks": ranks, "attacker": collect([attacker])[0], "old_switch": old, "not_member": not_member,
            "mode": mode, "scan": one(ATTACKER, scan_for_marker, shared, shm)}  # fmt: skip


# ---- issue 47: mounts planted, folders on the way, torch's FileStore, the secret's path ------


def scenario_planted_fuse_mount(shared: str, shm: str) -> dict[str, Any]:
    """1: the attacker mounts her own FUSE filesystem (tests/impostor_fs.py: every file the
    victim's, 0700/0600) where the victim's job would keep its files: the node-local folder of a
    single-machine job met through torch's TCPStore (torchrun --standalone's way), a --dir name
    not yet made in a sticky shared folder, the same with a daemon that never answers, and a
    node folder mounted without allow_other. Every rank refuses at once, naming the mount, its
    owner and the fix; the victim writes nothing into the attacker's filesystem."""
    if impostor_fs is None:
        raise RuntimeError(f"the FUSE scenario needs mfusepy (pip) and fuse3 (apt-get install fuse3): {FUSE_MISSING}")
    out: dict[str, Any] = {}
    port = _free_port()
    cases = {  # name: (mount point, allow_other, silent, init method: "tiers" for two nodes' tiers)
        "node_folder": (os.path.join(shm, f"fsdist-{VICTIM}"), True, False, f"tcp://127.0.0.1:{port}"),
        "run_directory": (os.path.join(shared, "victim-fuse-run"), True, False, ""),
        "silent": (os.path.join(shared, "victim-silent-run"), True, True, ""),
        "no_allow_other": (os.path.join(shm, "private", f"fsdist-{VICTIM}"), False, False, "tiers"),
    }
    one(0, _make_sticky, os.path.join(shm, "private"))
    for name, (point, allow_other, silent, init) in cases.items():
        backing = os.path.join(shared, f".mallorys-{name}")
        local = os.path.dirname(point) if point.startswith(shm) else shm
        one(ATTACKER, _mkdir_mode, backing, 0o700)
        one(ATTACKER, _mkdir_mode, point, 0o700)
        daemon = as_user(ATTACKER, impostor_fs.serve, point, backing, VICTIM, VICTIM, silent, allow_other)
        mounted = _wait_for_mount(point)
        env = {"FSDIST_LOCAL_DIR": local}
        if init == "tiers":
            path = os.path.join(shared, f"victim-tiers-{name}")
            children = [
                as_user(VICTIM, rank_job, r, 4, f"fsdist://{path}", {**env, "FSDIST_NODE_ID": f"node{r // 2}"})
                for r in range(4)
            ]
            ranks = collect(children, timeout=30)
        else:
            ranks = job(VICTIM, 2, init or f"fsdist://{point}", env, timeout=30)
        os.kill(daemon[0], signal.SIGKILL)  # (its end aborts every request still waiting on it)
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        collect([daemon], timeout=10)
        out[name] = {"mounted": mounted, "ranks": ranks, "path": point,
                     "backing": one(ATTACKER, lambda b: sorted(os.listdir(b)), backing)}  # fmt: skip
    return out


def _wait_for_mount(point: str, seconds: float = 10.0) -> str:
    """The mount table's line for ``point`` once the daemon's mount is there ("" if it never came)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with open("/proc/self/mountinfo") as table:
            for line in table:
                if f" {point} " in line:
                    return line.strip()
        time.sleep(0.05)
    return ""


def scenario_folders_another_user_owns(shared: str, shm: str) -> dict[str, Any]:
    """3 and 5: a sticky folder the attacker owns (she may rename anything inside it): a run
    directory in it is refused, and so are ``fsdist doctor`` and ``fsdist bench locks`` there,
    while she swaps any scratch folder that appears for a link to the victim's notes, which stay
    as they were. A folder of the victim's own that a group with other members may write (a
    project folder, without the sticky bit): refused too, unless FSDIST_GROUP names that group."""
    hers = os.path.join(shared, "mallorys-sticky")
    one(ATTACKER, _mkdir_mode, hers, 0o1777)
    notes = os.path.join(shared, "victim-notes")
    one(VICTIM, _make_notes, notes)
    swapper = as_user(ATTACKER, _swap_scratch_for, hers, notes, 8.0)
    env = {"FSDIST_LOCAL_DIR": shm}
    run = job(VICTIM, 2, f"fsdist://{hers}/victim-run", env)
    doctor = one(VICTIM, cli, ["doctor", hers], env=env)
    locks = one(VICTIM, cli, ["bench", "locks", hers, "--seconds", "0.5"], env=env)
    swapped = collect([swapper])[0]
    project = os.path.join(shared, "victim-project")
    one(VICTIM, _group_folder, project, 0o2775, groups=(SHARED_GID,))
    in_project = job(VICTIM, 2, f"fsdist://{project}/run", env, groups=(SHARED_GID,))
    named = job(VICTIM, 2, f"fsdist://{project}/run", {**env, "FSDIST_GROUP": "projx"}, groups=(SHARED_GID,))
    return {"folder": hers, "run": run, "doctor": doctor, "locks": locks, "swapped": swapped,
            "notes": one(VICTIM, _notes_now, notes), "project": project, "in_project": in_project,
            "named": named}  # fmt: skip


def _make_notes(notes: str) -> None:
    os.mkdir(notes, 0o700)
    for name in ("record", "rename-probe"):
        with open(os.path.join(notes, name), "w") as f:
            f.write(f"the victim's {name}\n")


def _notes_now(notes: str) -> dict[str, str]:
    return {name: open(os.path.join(notes, name)).read() for name in sorted(os.listdir(notes))}


def _swap_scratch_for(folder: str, target: str, seconds: float) -> list[str]:
    """For ``seconds``: every new folder in ``folder`` is renamed away and replaced by a link to
    ``target`` (what the attacker did to doctor's scratch within 0.3 s)."""
    end, swapped = time.monotonic() + seconds, []
    while time.monotonic() < end:
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if name.startswith(".old-") or os.path.islink(path):
                continue
            with contextlib.suppress(OSError):
                os.rename(path, os.path.join(folder, ".old-" + name))
                os.symlink(target, path)
                swapped.append(name)
        time.sleep(0.01)
    return swapped


def scenario_file_store(shared: str, shm: str) -> dict[str, Any]:
    """4: ``init_method="file://..."`` in a sticky shared folder. The attacker made the file first
    (0666) and holds its lock: every rank refuses at once, naming her, instead of hanging in
    torch's FileStore. Made by the victim's fsdist group it is 0600 (a Gloo group's is left as
    torch makes it)."""
    planted = os.path.join(shared, "initfile")
    one(ATTACKER, _plant_locked_file, planted)
    holder = as_user(ATTACKER, _hold_lock_on, planted, 8.0)
    time.sleep(0.3)
    env = {"FSDIST_LOCAL_DIR": shm}
    refused = job(VICTIM, 2, f"file://{planted}", env, timeout=30)
    collect([holder])
    own = os.path.join(shared, "victims-initfile")
    return {
        "path": planted, "refused": refused, "ran": job(VICTIM, 2, f"file://{own}", env),
        "fsdist_mode": one(VICTIM, _file_store_mode, f"{own}-1", "fsdist", env=env, umask=0o022),
        "gloo_mode": one(VICTIM, _file_store_mode, f"{own}-2", "gloo", env=env, umask=0o022),
    }  # fmt: skip


def _plant_locked_file(path: str) -> None:
    with open(path, "wb"):
        pass
    os.chmod(path, 0o666)


def _hold_lock_on(path: str, seconds: float) -> None:
    import fcntl

    with open(path, "r+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        time.sleep(seconds)


def _file_store_mode(path: str, backend: str) -> str:
    """The mode of torch's FileStore file while a one-rank group of ``backend`` runs on it."""
    dist.init_process_group(backend, init_method=f"file://{path}", rank=0, world_size=1)
    try:
        return oct(stat.S_IMODE(os.stat(path).st_mode))
    finally:
        dist.destroy_process_group()


def scenario_secret_path(shared: str, shm: str) -> dict[str, Any]:
    """7: the victim's secret in a sticky folder the attacker owns, which she swaps for a link to a
    file of the victim's whose bytes she knows (authorized_keys); and a link of hers to the
    victim's secret: both refused, naming her. A secret of sixteen zero bytes: refused."""
    hers = os.path.join(shared, "mallorys-keys")
    one(ATTACKER, _mkdir_mode, hers, 0o1777)
    home = os.path.join(shared, "victim-keys")
    one(VICTIM, _make_keys, home, hers)
    one(ATTACKER, _swap_for_link, os.path.join(hers, "secret"), os.path.join(home, "authorized_keys"))
    link = os.path.join(shared, "mallorys-link-to-secret")
    one(ATTACKER, os.symlink, os.path.join(home, "secret"), link)
    env = {"FSDIST_LOCAL_DIR": shm}
    path = os.path.join(shared, "victim-secret-run")
    return {
        "swapped": job(VICTIM, 2, f"fsdist://{path}", {**env, "FSDIST_SECRET_FILE": os.path.join(hers, "secret")}),
        "link": job(VICTIM, 2, f"fsdist://{path}", {**env, "FSDIST_SECRET_FILE": link}),
        "zeros": job(VICTIM, 2, f"fsdist://{path}", {**env, "FSDIST_SECRET_FILE": os.path.join(home, "zeros")}),
        "own": job(VICTIM, 2, f"fsdist://{path}", {**env, "FSDIST_SECRET_FILE": os.path.join(home, "secret")}),
        "folder": hers, "link_path": link,
    }  # fmt: skip


def _make_keys(home: str, hers: str) -> None:
    os.mkdir(home, 0o755)
    for folder, name, data, mode in (
        (home, "secret", os.urandom(32), 0o600), (hers, "secret", os.urandom(32), 0o600),
        (home, "zeros", bytes(16), 0o600), (home, "authorized_keys", b"ssh-ed25519 AAAAC3Nza victim@laptop\n", 0o644),
    ):  # fmt: skip
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
        os.chmod(os.path.join(folder, name), mode)


def _swap_for_link(path: str, target: str) -> None:
    os.unlink(path)  # (her sticky folder: she may remove what is in it)
    os.symlink(target, path)


def scenario_copied_record(shared: str, shm: str) -> dict[str, Any]:
    """6 (root on another NFS client, who can write as any uid: root here): job A's live record,
    and its generation folder, copied whole into the victim's directory B. With the secret, a
    job in B refuses it naming the repair, ``fsdist status B`` calls it unreadable, and
    ``fsdist clean B`` removes nothing it names; the job in A runs on."""
    a, b = os.path.join(shared, "victim-a"), os.path.join(shared, "victim-b")
    keys = os.path.join(shared, "victim-keys")
    one(VICTIM, _make_secret_home, keys)
    env = {"FSDIST_LOCAL_DIR": shm, "FSDIST_SECRET_FILE": os.path.join(keys, "secret")}
    one(VICTIM, _mkdir_mode, b, 0o700)
    live = as_user(VICTIM, _live_job, a, env, 4.0)
    copied = one(0, _copy_record, a, b)
    in_b = job(VICTIM, 1, f"fsdist://{b}", env)
    status = one(VICTIM, cli, ["status", b], env=env)
    cleaned = one(VICTIM, cli, ["clean", b], env=env)
    return {"copied": copied, "in_b": in_b, "status": status, "cleaned": cleaned, "live": collect([live])[0],
            "left_in_b": one(VICTIM, lambda: sorted(os.listdir(b)))}  # fmt: skip


def _make_secret_home(home: str) -> None:
    os.mkdir(home, 0o700)
    with open(os.path.join(home, "secret"), "wb") as f:
        f.write(os.urandom(32))


def _live_job(home: str, env: dict[str, str], seconds: float) -> dict[str, Any]:
    os.environ.update(env)
    dist.init_process_group("fsdist", init_method=f"fsdist://{home}", rank=0, world_size=1)
    try:
        tensor = torch.full((4,), MARKER)
        dist.all_reduce(tensor)
        time.sleep(seconds)
        dist.all_reduce(tensor)
        return {"right": bool((tensor == MARKER).all())}
    finally:
        dist.destroy_process_group()


def _copy_record(a: str, b: str) -> list[str]:
    """Once job A's record names its generation: copy the record and that folder into ``b``."""
    record, end = os.path.join(a, layout.RENDEZVOUS_FILE), time.monotonic() + 10
    while time.monotonic() < end and not any(layout.is_generation_dir(n) for n in _names(a)):
        time.sleep(0.02)
    time.sleep(0.3)
    subprocess.run(["cp", "-a", record, *[os.path.join(a, n) for n in _names(a) if layout.is_generation_dir(n)], b],
                   check=True)  # fmt: skip
    return _names(b)


def _names(folder: str) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def scenario_forged_pickle(shared: str, shm: str) -> dict[str, Any]:
    """2 (root on another NFS client: root here): the victim's job has FSDIST_SECRET_FILE and
    nothing else set; rank 0 broadcasts an object. Root replaces its pickle, in rank 0's record
    (an inline slot, its CRC recomputed) or in its message file, by one of the same length that
    runs ``touch``, leaving the header and its MAC as they were; then rank 1 receives. Both
    ranks refuse it, naming the payload, and the command never runs; with FSDIST_MAC_PAYLOADS=0
    it runs, as the victim (which is what the default prevents)."""
    keys = os.path.join(shared, "victim-keys")
    one(VICTIM, _make_secret_home, keys)
    out = {}
    cases = (("inline", 100, ""), ("file", 1 << 20, ""), ("opted_out", 100, "0"))  # (the last: the attack is real)
    for form, extra, payloads in cases:
        path = os.path.join(shared, f"victim-objects-{form}")
        flag, ran = path + ".forged", os.path.join(shared, f"pwned-{form}")
        env = {"FSDIST_LOCAL_DIR": shm, "FSDIST_SECRET_FILE": os.path.join(keys, "secret"),
               "FSDIST_MAC_PAYLOADS": payloads}  # fmt: skip
        ranks = [as_user(VICTIM, _object_rank, r, path, env, extra, flag) for r in range(2)]
        forger = as_user(0, _forge_pickle, path, flag, ran)
        out[form] = {"ranks": collect(ranks, timeout=60), "forger": collect([forger])[0],
                     "ran": os.path.exists(ran)}  # fmt: skip
    return out


def _object_rank(rank: int, path: str, env: dict[str, str], extra: int, flag: str) -> dict[str, Any]:
    os.environ.update(env)
    dist.init_process_group("fsdist", init_method=f"fsdist://{path}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))  # fmt: skip
    try:
        if rank == 0:
            dist.broadcast_object_list([{"mark": "the-victims-own-object", "pad": "x" * extra}], src=0)
            dist.barrier()
            return {"sent": True}
        end = time.monotonic() + 20
        while not os.path.exists(flag) and time.monotonic() < end:
            time.sleep(0.01)
        received: list[Any] = [None]
        dist.broadcast_object_list(received, src=0)
        return {"received": repr(received[0])[:80]}
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _forge_pickle(path: str, flag: str, ran: str) -> str:
    """Find the victim's pickle (by its text) in the group's folder, and put in its place a pickle
    of the same length that runs ``touch RAN`` (trailing bytes after its STOP are never read)."""
    end = time.monotonic() + 20
    while time.monotonic() < end:
        for folder, _, names in os.walk(path):
            for name in names:
                file = os.path.join(folder, name)
                if not os.path.isfile(file) or os.path.islink(file):
                    continue
                with open(file, "r+b") as f:
                    data = bytearray(f.read())
                    mark = data.find(b"the-victims-own-object")
                    start = data.rfind(b"\x80\x04\x95", 0, max(mark, 0))
                    if mark < 0 or start < 0:
                        continue
                    length = data.find(b"u.", data.rfind(b"x" * 64)) + 2 - start  # (it ends after the padding)
                    evil = f"cos\nsystem\n(S'touch {ran}'\ntR.".encode()
                    data[start : start + length] = evil + bytes(length - len(evil))
                    if name.startswith("state."):  # an inline slot: recompute its CRC, as a forger would
                        slot = (start - state_record.HEADER_SIZE) // state_record.INLINE_SLOT_BYTES
                        at = state_record.slot_offset(slot)
                        seq, step, size, _ = struct.unpack_from("<qIII", data, at)
                        data[at : at + 20 + size] = state_record.encode_slot(
                            seq, step, bytes(data[at + 20 : at + 20 + size])
                        )
                    f.seek(0)
                    f.write(data)
                open(flag, "w").close()
                return "state record" if name.startswith("state.") else "message file"
        time.sleep(0.005)
    open(flag, "w").close()
    return "never found the pickle"


def users_of_this_run(base: str) -> None:
    """Give the uids names and the shared group members, in a mount namespace of this process's
    own (its children inherit it): /etc/passwd and /etc/group bound over with copies that add
    them, nothing on the machine itself changed. Each user has a group of their own (a
    user-private group); victim and colleague are also in ``projx``."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(b"none", b"/", None, 0x4000 | (1 << 18), None) != 0:  # MS_REC | MS_PRIVATE
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    users = {VICTIM: "victim", ATTACKER: "mallory", COLLEAGUE: "colleague"}
    extra = {
        "passwd": "".join(f"{n}:x:{u}:{u}::/nonexistent:/usr/sbin/nologin\n" for u, n in users.items()),
        "group": "".join(f"{n}:x:{u}:\n" for u, n in users.items()) + f"projx:x:{SHARED_GID}:victim,colleague\n",
    }
    if os.path.exists("/etc/fuse.conf"):  # what some clusters set: any user may mount FUSE for all to see
        extra["fuse.conf"] = "user_allow_other\n"
    for name, lines in extra.items():
        copy = os.path.join(base, name)
        with open(f"/etc/{name}") as source, open(copy, "w") as out:
            out.write(source.read().rstrip("\n") + "\n" + lines)
        os.chmod(copy, 0o644)
        _bind(libc, copy, f"/etc/{name}")
    if os.path.exists("/dev/fuse"):  # 0666, as on every distribution (a container may make it 0600)
        node = os.path.join(base, "fuse")
        os.mknod(node, 0o666 | stat.S_IFCHR, os.stat("/dev/fuse").st_rdev)
        os.chmod(node, 0o666)
        _bind(libc, node, "/dev/fuse")


def _bind(libc: Any, source: str, target: str) -> None:
    if libc.mount(source.encode(), target.encode(), None, 4096, None) != 0:  # MS_BIND
        raise OSError(ctypes.get_errno(), f"mount --bind {source} {target}")


def main() -> None:
    out_path = sys.argv[1]
    only = sys.argv[2:]
    base = tempfile.mkdtemp(prefix="fsdist-strangers-", dir="/tmp")
    os.chmod(base, 0o755)
    users_of_this_run(base)
    results: dict[str, Any] = {}
    try:
        for name, scenario in SCENARIOS.items():
            if only and name not in only:
                continue
            shared, shm = os.path.join(base, name, "shared"), os.path.join(base, name, "shm")
            os.makedirs(shared)
            os.makedirs(shm)
            os.chmod(os.path.dirname(shared), 0o755)
            os.chmod(shared, 0o1777)  # like /tmp
            os.chmod(shm, 0o1777)  # like /dev/shm
            started = time.monotonic()
            try:
                results[name] = {"result": scenario(shared, shm)}
            except Exception:  # noqa: BLE001 - reported, the test fails on it
                results[name] = {"crash": traceback.format_exc()}
            results[name]["seconds"] = time.monotonic() - started
    finally:
        subprocess.run(["rm", "-rf", base], check=False)
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1, default=str)


SCENARIOS: dict[str, Callable[[str, str], dict[str, Any]]] = {
    "adopted_run_directory": scenario_adopted_run_directory,
    "private_directory_in_shared_place": scenario_private_directory_in_shared_place,
    "predictable_node_folder": scenario_predictable_node_folder,
    "garbage_collection": scenario_garbage_collection,
    "node_local_sweep": scenario_node_local_sweep,
    "symlinked_run_directory": scenario_symlinked_run_directory,
    "group_access": scenario_group_access,
    "group_tricks": scenario_group_tricks,
    "umask_002": scenario_umask_002,
    "planted_fuse_mount": scenario_planted_fuse_mount,
    "folders_another_user_owns": scenario_folders_another_user_owns,
    "file_store": scenario_file_store,
    "secret_path": scenario_secret_path,
    "copied_record": scenario_copied_record,
    "forged_pickle": scenario_forged_pickle,
}

if __name__ == "__main__":
    main()
