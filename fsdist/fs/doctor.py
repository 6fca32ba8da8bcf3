"""Is this filesystem safe for fsdist? The diagnosis behind ``python -m fsdist doctor``.

First what the mount says (type and options: NFS ``nolock``/``local_lock``/``lookupcache``/
``actimeo``, Lustre ``flock``, FUSE, GlusterFS caches), then what it does: exclusive locking
across processes (and across the two mounts when ``--peer-mount`` names the same directory
through a second mount, i.e. a second client), lost lock-guarded updates, atomic rename,
how fast a new file and a rewrite become visible. One verdict per property, with a fix.
Exit status 0: nothing unsafe found; 1: fsdist would be unsafe here; 2: the check could not run.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from ..defaults import ENV_IO
from ..errors import UntrustedPathError
from ..files.direct import DirectRecord
from ..files.io import detach_standard_streams, remove_tree
from ..files.places import adopt_run_directory, resolve_place
from ..files.trust import make_private_dir
from . import lock_kinds, probes
from .contention import contend
from .hazards import classify
from .mounts import OK, UNSAFE, WARN, Finding, find_mount

__all__ = ["DoctorStalledError", "diagnose", "diagnose_within", "render"]

#: A read under the lock that lags a rewrite by more than this is not lock-coherent.
_COHERENT_SECONDS = 0.1
#: How long the other tools' locks are measured for at most (a filesystem whose clients write
#: over each other can stall each increment for 30 s: MooseFS's chunk locks, measured).
_OTHER_LOCKS_SECONDS = 10.0
#: A new name that ``stat`` does not see for this long: a negative lookup cache is at work.
_STAT_SLOW_SECONDS = 1.0


def diagnose(directory: str, peer: str | None = None) -> dict[str, Any]:
    """Every finding about ``directory`` (and ``peer``, the same directory through another mount)."""
    scratch_name = f".fsdist-doctor-{secrets.token_hex(4)}"
    # resolved as fsdist resolves a run directory's path (another user's link, or a folder anyone
    # may rename things in, is refused), the folder itself checked as the scratch's way in
    scratch_a = resolve_place(os.path.join(directory, scratch_name))
    directory = os.path.dirname(scratch_a)
    mounts = {"A": find_mount(directory)}
    if peer:
        peer = os.path.dirname(resolve_place(os.path.join(peer, scratch_name)))
        mounts["B"] = find_mount(peer)
    findings: list[Finding] = [_ownership(directory)]
    for label, mount in mounts.items():
        for f in classify(mount):
            findings.append(Finding(f"{f.name} ({label})" if peer else f.name, f.verdict, f.detail, f.fix))
    make_private_dir(scratch_a)
    try:
        scratch_b = _peer_scratch(peer, scratch_name) if peer else scratch_a
        findings += _measure(scratch_a, scratch_b, across=bool(peer), fix=_first_fix(findings))
    finally:
        remove_tree(scratch_a)
    verdict = (
        UNSAFE
        if any(f.verdict == UNSAFE for f in findings)
        else WARN
        if any(f.verdict == WARN for f in findings)
        else OK
    )
    return {
        "directory": directory,
        "peer_mount": peer,
        "mounts": {k: {**asdict(m), "options": m.option_text()} for k, m in mounts.items()},
        "findings": [asdict(f) for f in findings],
        "verdict": verdict,
    }


def _step(name: str) -> None:
    """Say which measurement runs now (``diagnose_within`` names it if it never returns)."""
    _on_step[0](name)


_on_step: list[Callable[[str], None]] = [lambda name: None]


def diagnose_within(directory: str, peer: str | None, stall_seconds: float) -> dict[str, Any]:
    """``diagnose`` in a child process, given up when one measurement runs ``stall_seconds``.

    A FUSE daemon may never answer a request (SeaweedFS ``-dlm``: an open through a second mount
    while the first holds the file open); the caller then sits in the kernel, unkillable, until
    the connection is aborted. Only a separate process can report that and return to the shell.
    Raises DoctorStalledError (naming the measurement) or what ``diagnose`` raised (as RuntimeError).
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, reporting each step and then the report, as JSON lines
        try:
            os.close(read_end)
            detach_standard_streams()  # a pipe reading doctor's output must end when doctor does
            _on_step[0] = lambda name: _tell(write_end, {"step": name})
            try:
                _tell(write_end, {"report": diagnose(directory, peer)})
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
                _tell(write_end, {"error": f"{type(exc).__name__}: {exc}"})
        finally:
            os._exit(0)  # never back into the caller's code (a forked copy of it)
    os.close(write_end)
    step, pending = "the start", b""
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while True:
            ready, _, _ = select.select([pipe], [], [], stall_seconds)
            if not ready:
                raise DoctorStalledError(step, stall_seconds, pid)
            chunk = pipe.read(65536)
            if not chunk:
                os.waitpid(pid, 0)
                raise RuntimeError("the measuring process ended without a report")
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "step" in message:
                    step = message["step"]
                elif "report" in message:
                    os.waitpid(pid, 0)
                    return message["report"]
                else:
                    os.waitpid(pid, 0)
                    raise RuntimeError(message["error"])


def _tell(fd: int, message: dict[str, Any]) -> None:
    """One JSON line to the parent; nothing if it stopped listening (it gave up on a stall)."""
    data = (json.dumps(message) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass


class DoctorStalledError(RuntimeError):
    """A measurement that never returned: the filesystem blocked a call (fsdist would hang)."""

    def __init__(self, step: str, seconds: float, pid: int) -> None:
        super().__init__(
            f"UNSAFE: the '{step}' measurement made no progress for {seconds:.0f} s: a call into the filesystem "
            f"(an open, a lock, a read) did not return, so fsdist's ranks would hang here. Its process {pid} may "
            "stay stuck in the kernel (on FUSE until the mount's connection is aborted: "
            "echo 1 > /sys/fs/fuse/connections/<minor>/abort), with its .fsdist-doctor-* scratch folder"
        )
        self.step, self.pid = step, pid


def _ownership(directory: str) -> Finding:
    """Whether fsdist would take ``directory`` as a run directory (files/trust.py): a folder of
    several users' (a filesystem's root, say) is fine to diagnose, but a job needs one of its own."""
    try:
        adopt_run_directory(directory, create=False)
    except UntrustedPathError as exc:
        return Finding(
            "run directory", WARN, f"fsdist would refuse it as a run directory: {exc}",
            "run jobs in a folder of your own inside it (a missing one is made 0700)",
        )  # fmt: skip
    return Finding("run directory", OK, "yours, and nobody else can write it: fsdist takes it as a run directory")


def _first_fix(findings: list[Finding]) -> str:
    return next((f.fix for f in findings if f.verdict == UNSAFE and f.fix), "")


def _peer_scratch(peer: str, name: str) -> str:
    """The scratch folder seen through the peer mount; it must appear there, or DIR2 is not DIR."""
    path = os.path.join(peer, name)
    end = time.monotonic() + 5
    while time.monotonic() < end:
        if name in os.listdir(peer):
            return path
        time.sleep(0.01)
    raise RuntimeError(f"{peer} does not show what was created in the first directory: not the same directory")


def _measure(a: str, b: str, across: bool, fix: str) -> list[Finding]:
    where = "through the two mounts" if across else "between processes"
    out: list[Finding] = []
    local_only = "locks are local only: fsdist would corrupt data here"

    _step("lock exclusion")
    excluded = probes.lock_exclusion(os.path.join(a, "lock"), os.path.join(b, "lock"))
    out.append(
        Finding("lock exclusion", OK, f"an exclusive lock excluded a second lock {where}")
        if excluded
        else Finding(
            "lock exclusion", UNSAFE, f"an exclusive lock did NOT exclude a second one {where}: {local_only}", fix
        )
    )

    _step("lost updates")
    result = contend([a, b], 4, 1.0, max_increments=500, min_increments=50)
    text = f"{result.lost_updates} of {result.increments} lock-guarded increments lost (4 processes)"
    out.append(
        Finding("lost updates", OK, text)
        if result.lost_updates == 0
        else Finding("lost updates", UNSAFE, f"{text}: fsdist would corrupt data here", fix)
    )

    _step("atomic rename")
    reads, torn, stale = probes.rename_atomicity(a, b)
    text = f"{reads} reads during renames, {torn} torn or missing, {stale} ESTALE (fsdist retries ESTALE)"
    out.append(
        Finding("atomic rename", OK if torn == 0 else UNSAFE, text, "" if torn == 0 else "use another filesystem")
    )

    _step("new file")
    by_stat, by_list = probes.new_file_visibility(a, b)
    if by_stat is None or by_stat > _STAT_SLOW_SECONDS:
        seen = "not within 3 s" if by_stat is None else f"after {by_stat:.2f} s"
        out.append(
            Finding(
                "new file (stat)",
                WARN,
                f"a new file was seen by stat {seen} (negative lookup cache); fsdist never waits on that",
                "mount with lookupcache=positive (NFS) or negative-timeout=0 (GlusterFS)",
            )
        )
    else:
        out.append(Finding("new file (stat)", OK, f"a new file was seen by stat after {by_stat * 1e3:.1f} ms"))
    if by_list is None:
        out.append(
            Finding("new file (listdir)", UNSAFE, "a new file was not listed within 3 s", "use another filesystem")
        )
    else:
        out.append(Finding("new file (listdir)", OK, f"a new file was listed after {by_list * 1e3:.1f} ms"))

    _step("lock semantics")
    out.append(_lock_semantics(a, b, across))
    _step("other tools' locks")
    out.append(_other_locks(a, b, across))
    _step("records")
    out.append(_records(a, b, across))
    _step("rewrite under lock")

    held, reopened = probes.rewrite_visibility(os.path.join(a, "record"), os.path.join(b, "record"))
    if held is None or held > _COHERENT_SECONDS:
        seen = "not within 3 s" if held is None else f"only after {held:.2f} s"
        out.append(
            Finding(
                "rewrite under lock",
                UNSAFE,
                f"a record rewritten under the lock was read {seen} through a held-open descriptor: "
                "locks are not a coherence point here, fsdist's records would be stale and counters lose updates",
                fix or "make the filesystem lock-coherent (see docs/filesystems.md)",
            )
        )
    else:
        out.append(Finding("rewrite under lock", OK, f"a rewrite was read under the lock after {held * 1e3:.1f} ms"))
    seen = "not within 3 s" if reopened is None else f"{reopened * 1e3:.1f} ms"
    out.append(
        Finding(
            "rewrite on re-open", OK if reopened is not None else WARN, f"a rewrite was read on re-open after {seen}"
        )
    )
    return out


def _lock_semantics(a: str, b: str, across: bool) -> Finding:
    """fsdist's lock measured as it is used: OFD (one per descriptor) or POSIX, released at
    close and at SIGKILL. FUSE hands OFD locks to its daemon as plain lock requests."""
    found = {"A": probes.lock_semantics(os.path.join(a, "semantics"))}
    if across:
        found["B"] = probes.lock_semantics(os.path.join(b, "semantics-b"))
    problems = [f"{p} ({label})" if across else p for label, s in found.items() for p in s.problems()]
    kind = found["A"].kind
    if problems:
        return Finding(
            "lock semantics", UNSAFE, f"fsdist's lock ({kind}): " + "; ".join(problems),
            "use another filesystem: a crashed rank's lock would stop the next job, or ranks would not exclude",
            within_one_mount=True,
        )  # fmt: skip
    own = "a second descriptor of one process is excluded, " if kind == "ofd" else "(POSIX: per process) "
    return Finding("lock semantics", OK, f"fsdist's lock is {kind}: {own}released at close and at SIGKILL")


def _other_locks(a: str, b: str, across: bool) -> Finding:
    """The locks other tools take (fs/lock_kinds.py), briefly: which of them hold here."""
    lost: list[str] = []
    safe: list[str] = []
    skipped: list[str] = []
    end = time.monotonic() + _OTHER_LOCKS_SECONDS
    for kind in lock_kinds.KINDS:
        if kind == "fsdist":
            continue  # ("lost updates" above)
        if time.monotonic() > end:
            skipped.append(kind)
            continue
        folder = f"kind-{kind}"
        make_private_dir(os.path.join(a, folder))
        folders = [os.path.join(a, folder), _peer_scratch(b, folder)] if across else [os.path.join(a, folder)]
        result = contend(folders, 4, 0.3, max_increments=100, kind=kind)
        (lost if result.lost_updates else safe).append(
            f"{kind} {result.lost_updates}/{result.increments} lost" if result.lost_updates else kind
        )
    where = "across the two mounts" if across else "between processes"
    if lost or skipped:
        unmeasured = (
            [f"{', '.join(skipped)} not measured (the kinds before them used doctor's {_OTHER_LOCKS_SECONDS:.0f} s "
             "for this row: slow locks, or slow process starts)"]
            if skipped else []
        )  # fmt: skip
        fix = (
            "tools locking those ways (filelock: flock; SoftFileLock: a lock file) would lose updates here; "
            if lost else ""
        )  # fmt: skip
        return Finding(
            "other tools' locks", WARN, f"{where}: {', '.join(lost + unmeasured)}; safe: {', '.join(safe) or 'none'} "
            "(fsdist's own lock is judged above)",
            f"{fix}`fsdist bench locks DIR --peer-mount DIR2 --kind all` measures every kind longer",
        )  # fmt: skip
    return Finding("other tools' locks", OK, f"{where}: {', '.join(safe)} lost no update (0.3 s each)")


def _records(a: str, b: str, across: bool) -> Finding:
    """Which records a job here gets under FSDIST_IO=auto (the default), and why."""
    name = f"records ({ENV_IO}=auto)"
    if not across:
        why = DirectRecord.refusal(a)
        taken = "it takes unaligned direct I/O" if why is None else why
        return Finding(
            name, OK, f"locked on one client; across clients a job measures whether direct records hold ({taken}); "
            "--peer-mount shows what it would find",
        )  # fmt: skip
    why = probes.direct_visibility(os.path.join(a, "direct"), os.path.join(b, "direct"))
    if why is None:
        return Finding(
            name, OK, "direct: a direct write through A was read at once through B, twice; a publish is one "
            "write and a look one read, no locks (docs/filesystems.md)",
        )  # fmt: skip
    return Finding(name, OK, f"locked: {why}", f"never force {ENV_IO}=direct here")


def render(report: dict[str, Any]) -> str:
    lines = [
        f"fsdist doctor: {report['directory']}"
        + (f"  (peer mount {report['peer_mount']})" if report["peer_mount"] else "")
    ]
    for label, m in report["mounts"].items():
        lines.append(f"  mount {label}: {m['fstype']} {m['source']} on {m['mount_point']} ({m['options']})")
    for f in report["findings"]:
        lines.append(f"  [{f['verdict']:^6}] {f['name']}: {f['detail']}")
        if f["fix"] and f["verdict"] != OK:
            lines.append(f"           fix: {f['fix']}")
    summary = {
        OK: "safe for fsdist",
        WARN: "usable by fsdist, with the warnings above",
        UNSAFE: "UNSAFE: fsdist would corrupt data or hang here across these clients",
    }[report["verdict"]]
    lines.append(f"verdict: {summary}")
    return "\n".join(lines)
