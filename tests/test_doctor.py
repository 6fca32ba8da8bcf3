"""``fsdist doctor`` and the mount classification behind it (and behind the start-up refusal)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from fsdist.fs.hazards import classify
from fsdist.fs.mounts import OK, UNSAFE, WARN, find_mount


def _doctor(*args: str) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "fsdist", "doctor", *args, "--json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def _verdicts(report: dict) -> dict[str, str]:
    return {f["name"]: f["verdict"] for f in report["findings"]}


def _detail(report: dict, name: str) -> str:
    return next(f["detail"] for f in report["findings"] if f["name"] == name)


def test_doctor_passes_local_disk(tmp_path) -> None:
    rc, report = _doctor(str(tmp_path), "--peer-mount", str(tmp_path))
    assert rc == 0 and report["verdict"] == OK, report
    assert _verdicts(report)["lost updates"] == OK
    assert _verdicts(report)["lock semantics"] == OK
    assert _detail(report, "lock semantics") == (
        "fsdist's lock is ofd: a second descriptor of one process is excluded, released at close and at SIGKILL"
    )
    # the locks other tools take, measured side by side through both paths
    assert _detail(report, "other tools' locks") == (
        "across the two mounts: ofd, posix, flock, filelock, softfilelock lost no update (0.3 s each)"
    )
    assert os.listdir(tmp_path) == []  # its scratch folder is gone
    # which records FSDIST_IO=auto would give a job across clients here, and why
    records = _detail(report, "records (FSDIST_IO=auto)")
    assert records.startswith("direct: a direct write through A was read at once") or records.startswith(
        "locked: its filesystem refuses unaligned direct I/O"
    ), records


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm")
def test_doctor_passes_tmpfs(tmp_path) -> None:
    directory = os.path.join("/dev/shm", os.path.basename(tmp_path))
    os.mkdir(directory)
    try:
        rc, report = _doctor(directory)
        assert rc == 0 and report["verdict"] == OK, report
        assert report["mounts"]["A"]["fstype"] == "tmpfs"
        assert _detail(report, "records (FSDIST_IO=auto)").startswith("locked on one client; across clients a job")
    finally:
        shutil.rmtree(directory)


def test_doctor_explains_a_directory_that_is_not_the_peer(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "fsdist", "doctor", str(tmp_path / "a"), "--peer-mount", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "not the same directory" in done.stderr


def _bindfs_usable() -> bool:
    return os.geteuid() == 0 and shutil.which("bindfs") is not None and os.path.exists("/dev/fuse")


@pytest.mark.skipif(not _bindfs_usable(), reason="needs root, /dev/fuse and bindfs (apt-get install bindfs)")
def test_doctor_flags_two_bindfs_mounts_as_unsafe_with_lost_updates(tmp_path) -> None:
    src, a, b = (tmp_path / n for n in ("src", "a", "b"))
    for d in (src, a, b):
        d.mkdir()
    mounted = []
    try:
        for target in (a, b):
            subprocess.run(["bindfs", str(src), str(target)], check=True)
            mounted.append(target)
        rc, report = _doctor(str(a), "--peer-mount", str(b))
        print(json.dumps(report["findings"], indent=1))
        verdicts = _verdicts(report)
        assert rc == 1 and report["verdict"] == UNSAFE
        assert verdicts["locking (A)"] == UNSAFE  # from the mount: bindfs without lock forwarding
        assert verdicts["lock exclusion"] == UNSAFE  # measured
        lost = next(f for f in report["findings"] if f["name"] == "lost updates")
        assert lost["verdict"] == UNSAFE and not lost["detail"].startswith("0 of"), lost
    finally:
        for target in mounted:
            subprocess.run(["umount", str(target)], check=False)


# ---- classification from mount options (no mounts needed) ------------------------------


def _mountinfo(tmp_path, fstype: str, source: str, options: str) -> str:
    path = tmp_path / "mountinfo"
    path.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        f"50 27 0:50 / /shared rw,relatime - {fstype} {source} rw,{options}\n"
    )
    return str(path)


@pytest.mark.parametrize(
    ("fstype", "options", "locking"),
    [
        ("nfs", "vers=3,nolock,proto=tcp", UNSAFE),
        ("nfs4", "vers=4.2,local_lock=posix", UNSAFE),
        ("nfs4", "vers=4.2,local_lock=all", UNSAFE),
        ("nfs4", "vers=4.2,local_lock=flock", OK),  # fsdist takes fcntl locks, not flock
        ("nfs", "vers=3,local_lock=none", OK),
        ("lustre", "flock,lazystatfs", OK),
        ("lustre", "localflock", UNSAFE),
        ("lustre", "noflock", UNSAFE),
        ("gpfs", "", OK),
        ("fuse.sshfs", "user_id=0", UNSAFE),
        ("fuse.somethingnew", "user_id=0", WARN),
    ],
)
def test_mount_options_decide_the_locking_verdict(tmp_path, fstype: str, options: str, locking: str) -> None:
    mount = find_mount("/shared/run/job", _mountinfo(tmp_path, fstype, "srv:/export", options))
    assert mount.mount_point == "/shared" and mount.fstype == fstype
    found = {f.name: f for f in classify(mount)}
    assert found["locking"].verdict == locking, found
    if locking == UNSAFE:
        assert found["locking"].fix


def test_nfs_lookupcache_default_is_a_warning_with_the_fix(tmp_path) -> None:
    default = find_mount("/shared", _mountinfo(tmp_path, "nfs4", "srv:/", "vers=4.2"))
    assert {f.name: f.fix for f in classify(default)}["lookup cache"] == "mount with lookupcache=positive"
    positive = find_mount("/shared", _mountinfo(tmp_path, "nfs4", "srv:/", "vers=4.2,lookupcache=positive"))
    assert "lookup cache" not in {f.name for f in classify(positive)}


def test_mountinfo_escapes_are_decoded(tmp_path) -> None:
    path = tmp_path / "mountinfo"
    path.write_text("27 1 254:0 / / rw - ext4 /dev/vda rw\n51 27 0:51 / /mnt/a\\040b rw - tmpfs tmpfs rw\n")
    assert find_mount("/mnt/a b/x", str(path)).fstype == "tmpfs"


# ---- the start-up refusal (fsdist.fs.guard) -------------------------------------------


@pytest.fixture
def two_bindfs_mounts(tmp_path):
    if not _bindfs_usable():
        pytest.skip("needs root, /dev/fuse and bindfs (apt-get install bindfs)")
    src, a, b = (tmp_path / n for n in ("src", "a", "b"))
    for d in (src, a, b):
        d.mkdir()
    (src / "job").mkdir(mode=0o700)
    mounted = []
    try:
        for target in (a, b):
            subprocess.run(["bindfs", str(src), str(target)], check=True)
            mounted.append(target)
        yield str(a / "job"), str(b / "job")
    finally:
        for target in mounted:
            subprocess.run(["umount", str(target)], check=False)


def test_ranks_on_two_bindfs_mounts_refuse_to_start(two_bindfs_mounts) -> None:
    from harness import RankError, RankPool

    a, b = two_bindfs_mounts
    with pytest.raises(RankError) as error:
        RankPool(2, directories=[a, b], group_timeout=20)
    text = str(error.value)
    assert "rank(s) [0, 1]" in text, text  # both ranks fail
    # each names the mount's hazard and the override, however the race between their
    # non-excluding locks went: refused on seeing two clients, the file read back corrupt, an
    # entry lost to the other rank's write, or the other rank never seen (a timeout)
    for part in text.split("--- rank ")[1:]:
        assert "bindfs without --enable-lock-forwarding" in part and "FSDIST_ALLOW_UNSAFE_FS=1" in part, part


def test_ranks_on_one_bindfs_mount_start_and_the_override_works(two_bindfs_mounts) -> None:
    from harness import RankError, RankPool
    from in_rank import collectives as cases_collectives

    a, b = two_bindfs_mounts
    pool = RankPool(2, directories=[a, a])  # one client: its local locks are enough
    try:
        results = pool.run(cases_collectives.all_reduce, "SUM", "float32")
        assert not any(r["failures"] for r in results)
    finally:
        # not close(): FUSE keeps a file unlinked while another rank holds it open as
        # .fuse_hidden*, so the last rank's remove_tree can leave empty folders behind
        pool.kill()
    # the override: no rank refuses. The mounts may still lose a lock-guarded write as the job
    # starts (that is what makes them unsafe); then the error says what the override cost
    try:
        RankPool(2, directories=[a, b], env={"FSDIST_ALLOW_UNSAFE_FS": "1"}).kill()  # started: nothing more
    except RankError as error:
        assert "to start anyway" not in str(error) and "refusing" not in str(error), error


def test_bindfs_with_lock_forwarding_is_refused_even_on_one_mount(tmp_path) -> None:
    """Forwarded locks are all the bindfs daemon's own: two processes on one mount do not exclude."""
    if not _bindfs_usable():
        pytest.skip("needs root, /dev/fuse and bindfs (apt-get install bindfs)")
    from harness import RankError, RankPool

    src, a = tmp_path / "src", tmp_path / "a"
    src.mkdir()
    a.mkdir()
    (src / "job").mkdir(mode=0o700)
    subprocess.run(["bindfs", "--multithreaded", "--enable-lock-forwarding", str(src), str(a)], check=True)
    try:
        with pytest.raises(RankError) as error:
            RankPool(2, directories=[str(a / "job")] * 2, group_timeout=20)
        assert "refusing to start: this job has several ranks" in str(error.value)
    finally:
        subprocess.run(["umount", str(a)], check=False)


@pytest.mark.parametrize("forwarding", [True, False])
def test_only_bindfs_lock_forwarding_is_unsafe_even_within_one_mount(monkeypatch, forwarding: bool) -> None:
    """local_hazard (refuse a multi-rank job even on one machine) comes from the finding's own
    flag, and the same local-filesystem set decides both is_local and the verdict."""
    from fsdist.fs import fuse_kinds, hazards, mounts

    fuse = mounts.Mount("/mnt/b", "fuse", "src", {"rw": ""})
    argv = ["bindfs", "--multithreaded", *(["--enable-lock-forwarding"] if forwarding else []), "/src", "/mnt/b"]
    monkeypatch.setattr(hazards, "find_mount", lambda path: fuse)
    monkeypatch.setattr(fuse_kinds, "fuse_daemon", lambda point: argv)
    assert (hazards.local_hazard("/mnt/b/run") is not None) == forwarding
    assert hazards.cross_client_hazard("/mnt/b/run") is not None  # unsafe across clients either way
    for fstype in ("zfs", "bcachefs", "ext4", "tmpfs"):
        local = mounts.Mount("/data", fstype, "pool")
        monkeypatch.setattr(mounts, "find_mount", lambda path, local=local: local)
        assert mounts.is_local("/data/run") and classify(local)[0].verdict == OK, fstype


def test_a_measurement_that_never_returns_is_reported_unsafe_naming_it(tmp_path, monkeypatch) -> None:
    """A FUSE daemon that never answers (SeaweedFS -dlm: an open through a second mount) leaves
    the caller stuck in the kernel: doctor measures in a child and reports the stall."""
    import time

    from fsdist.fs import doctor, probes

    monkeypatch.setattr(probes, "rename_atomicity", lambda a, b: time.sleep(4) or (0, 0, 0))
    start = time.monotonic()
    with pytest.raises(doctor.DoctorStalledError) as stalled:
        doctor.diagnose_within(str(tmp_path), None, 1.0)
    assert time.monotonic() - start < 4, "waited for the stuck measurement"
    assert stalled.value.step == "atomic rename"
    assert "UNSAFE: the 'atomic rename' measurement made no progress for 1 s" in str(stalled.value)
    assert "fsdist's ranks would hang here" in str(stalled.value)
    # the stuck child holds none of the caller's output: `doctor | tee` and subprocess pipes end
    assert [os.readlink(f"/proc/{stalled.value.pid}/fd/{fd}") for fd in (1, 2)] == [os.devnull] * 2
    os.waitpid(stalled.value.pid, 0)  # (it finishes once the sleep is over: before tmp_path goes)
    report = doctor.diagnose_within(str(tmp_path), None, 60.0)  # and a measurement that returns: the report
    assert report["directory"] == str(tmp_path) and report["findings"]


def test_doctor_returns_after_a_stall_even_if_the_mount_findings_block(tmp_path, monkeypatch, capsys) -> None:
    """After reporting a stall doctor adds what the mounts say, touching the stalled filesystem
    for none of it but a finding's own look (GlusterFS's .meta), and gives that up in 5 s."""
    import argparse
    import threading
    import time

    from fsdist.cli import doctor as cli_doctor
    from fsdist.fs.doctor import DoctorStalledError

    def stalled(*args: object) -> None:
        raise DoctorStalledError("lock semantics", 120, 12345)

    monkeypatch.setattr(cli_doctor, "diagnose_within", stalled)
    monkeypatch.setattr(os.path, "realpath", lambda path: pytest.fail("resolved a path on the stalled mount"))
    monkeypatch.setattr(cli_doctor, "classify", lambda mount: threading.Event().wait() and [])
    monkeypatch.setattr(cli_doctor, "_FINDINGS_SECONDS", 0.5)
    args = argparse.Namespace(directory=str(tmp_path), peer_mount=None, json=False, stall_timeout=120.0)
    monkeypatch.setattr(cli_doctor, "directory_problem", lambda *a: None)
    start = time.monotonic()
    assert cli_doctor.run(args) == 1
    assert time.monotonic() - start < 3
    err = capsys.readouterr().err
    assert "'lock semantics' measurement made no progress for 120 s" in err, err
    assert "the mounts' own findings did not return either" in err, err


@pytest.mark.parametrize(
    ("argv", "verdict"),
    [
        (["ceph-fuse", "--id", "x", "-r", "/d", "/mnt/c"], UNSAFE),
        (["ceph-fuse", "--id", "x", "--fuse_disable_pagecache=true", "/mnt/c"], OK),
        (["ceph-fuse", "--fuse-disable-pagecache=true", "/mnt/c"], OK),
        (["ceph-fuse", "--fuse_disable_pagecache=false", "/mnt/c"], UNSAFE),
    ],
)
def test_ceph_fuse_is_trusted_only_with_its_page_cache_off(monkeypatch, argv, verdict) -> None:
    """With the kernel's page cache on, ceph-fuse served a rewrite old for > 3 s even on re-open
    (make test-fs FS=cephfs); the option shows only on its command line (or in ceph.conf)."""
    from fsdist.fs import fuse_kinds, mounts

    monkeypatch.setattr(fuse_kinds, "fuse_daemon", lambda point: argv)
    (found,) = classify(mounts.Mount("/mnt/c", "fuse.ceph-fuse", "ceph-fuse", {"rw": ""}))
    assert found.verdict == verdict, found
    if verdict == UNSAFE:  # (refused at start across clients, with the fix and the override)
        assert "--fuse_disable_pagecache=true" in found.fix and "FSDIST_ALLOW_UNSAFE_FS=1" in found.fix, found


def test_a_rewrite_is_judged_by_the_first_read_after_it_not_by_how_long_a_lock_takes(tmp_path, monkeypatch) -> None:
    """Ganesha v3 in a busy VM: a lock round trip of 0.10 s made a coherent server fail doctor's
    0.1 s. What counts is how long old data was served: 0 when the first read shows the rewrite."""
    import time

    from fsdist.files.locks import LockedRecord
    from fsdist.fs import probes

    read = LockedRecord.read
    monkeypatch.setattr(LockedRecord, "read", lambda self, *a: (time.sleep(0.15), read(self, *a))[1])
    held, reopened = probes.rewrite_visibility(str(tmp_path / "a"), str(tmp_path / "a"), rounds=2)
    assert held is not None and reopened is not None and held < 0.01 and reopened < 0.01, (held, reopened)
    stale = {"left": 3}

    def old_for_three_reads(self: LockedRecord, *a: object) -> bytes:
        if stale["left"] and self.path.endswith("b"):
            stale["left"] -= 1
            time.sleep(0.05)
            return b""
        return read(self, *a)

    monkeypatch.setattr(LockedRecord, "read", old_for_three_reads)
    os.link(tmp_path / "a", tmp_path / "b")
    held, _ = probes.rewrite_visibility(str(tmp_path / "a"), str(tmp_path / "b"), rounds=1)
    assert held is not None and held >= 0.1, held  # three stale reads: served old for ~0.15 s


def test_other_tools_locks_name_what_lost_and_what_was_not_measured_apart(tmp_path, monkeypatch) -> None:
    """A kind that lost updates is a warning with its fix; kinds left out when the row's time ran
    out (NFS v4's polled blocking locks in the VM) are named as not measured, not as losing."""
    from fsdist.fs import doctor
    from fsdist.fs.contention import Contention

    clock = [0.0]
    monkeypatch.setattr(doctor.time, "monotonic", lambda: clock[0])

    def contend(folders, procs, seconds, max_increments, kind):
        clock[0] += 6.0  # two kinds use up the row's 10 s
        lost = 3 if kind == "posix" else 0
        return Contention(4, 0.3, 40, 40 - lost, lost, 100.0, 1.0, 2.0, 3.0, [10] * 4, 1.0, folders[0], None, kind)

    monkeypatch.setattr(doctor, "contend", contend)
    finding = doctor._other_locks(str(tmp_path), str(tmp_path), across=False)
    assert finding.verdict == WARN
    assert "posix 3/40 lost" in finding.detail and "safe: ofd" in finding.detail
    assert "flock, filelock, softfilelock not measured" in finding.detail
    assert "would lose updates" in finding.fix

    clock[0] = 0.0
    monkeypatch.setattr(doctor, "contend", lambda folders, *a, kind, **k: contend(folders, 4, 0.3, 0, "ofd"))
    unmeasured = doctor._other_locks(str(tmp_path / "again"), str(tmp_path), across=False)
    assert unmeasured.verdict == WARN and "not measured" in unmeasured.detail
    assert "would lose updates" not in unmeasured.fix and "--kind all" in unmeasured.fix
