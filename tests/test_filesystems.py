"""fsdist on more real filesystems, each brought up from packages on this host, ranks split across
two mounts ("two nodes"): ``make test-fs FS=moosefs`` (or juicefs, seaweedfs, cephfs; several: FS=a,b).
``FSDIST_FS=mounted FSDIST_FS_STATE=DIR`` runs the same on mounts the caller made, laid out as
below (the NFS VM's Ganesha phases: scripts/nfs-vm/guest.sh).

``scripts/fs/<fs>-up.sh STATE`` starts the filesystem and mounts it as ``STATE/<setting>/{A,B}``
for each setting it knows, and says in ``STATE/settings`` what each setting should be:

- ``safe``: doctor finds nothing unsafe across the two mounts; the collective cases and a
  20-step DDP run with ranks 0-1 on A and 2-3 on B are correct; a rank SIGKILLed in the middle
  of a collective is reported on every survivor, and the next job in the same directory starts
  (the dead rank's locks went with it); every lock kind of ``bench locks`` loses no update;
- ``local-only`` (locks stay inside one mount) and ``unsafe`` (locks that exclude but do not
  cohere): doctor says UNSAFE, and a job across the two mounts does not start: each rank fails
  with an error naming the filesystem (a refusal, or the rendezvous' own evidence), never a
  silent result;
- ``hangs`` (an open through one mount waits in the kernel, unkillably, while another mount
  holds the file open): doctor reports the stalled measurement as UNSAFE, and a job of several
  ranks is refused before it opens a file. Nothing else runs there: it would hang the suite.

Each case prints what it measured; docs/filesystems.md has the table. Root only (mounts); the
module is skipped without FSDIST_FS, and FSDIST_FS names what must come up (no skipping then).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest
from two_mounts import CASES, kill_one_and_start_the_next, no_failures, split_pool

from harness import RankError
from in_rank import training as cases_training

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "fs")
WANTED = [f.strip() for f in os.environ.get("FSDIST_FS", "").split(",") if f.strip()]
KNOWN = ("moosefs", "juicefs", "seaweedfs", "cephfs", "mounted")

pytestmark = pytest.mark.skipif(not WANTED, reason="set FSDIST_FS (make test-fs FS=moosefs|juicefs|seaweedfs|cephfs)")


def _settings(state: str) -> dict[str, str]:
    with open(os.path.join(state, "settings")) as listing:
        return dict(line.split() for line in listing if line.strip())


def _up(fs: str) -> Iterator[tuple[str, dict[str, str]]]:
    if fs not in KNOWN:
        raise ValueError(f"FSDIST_FS={fs}: one of {', '.join(KNOWN)}")
    if fs == "mounted":  # brought up, and taken down, by the caller
        state = os.environ.get("FSDIST_FS_STATE", "")
        if not os.path.isfile(os.path.join(state, "settings")):
            pytest.fail(f"FSDIST_FS=mounted: FSDIST_FS_STATE={state!r} has no settings file")
        yield state, _settings(state)
        return
    if os.geteuid() != 0:
        pytest.fail("make test-fs needs root (daemons, FUSE mounts)")
    state = tempfile.mkdtemp(prefix=f"fsdist-{fs}-", dir="/var/tmp")  # never under the suite's TMPDIR
    start = time.monotonic()
    up = subprocess.run([os.path.join(SCRIPTS, f"{fs}-up.sh"), state], capture_output=True, text=True)
    try:
        assert up.returncode == 0, f"{fs}-up.sh failed ({up.returncode}):\n{up.stdout}\n{up.stderr}"
        print(f"\n{up.stdout.strip()} in {time.monotonic() - start:.1f} s")
        yield state, _settings(state)
    finally:
        down = subprocess.run([os.path.join(SCRIPTS, "down.sh"), state], capture_output=True, text=True)
        assert down.returncode == 0, f"down.sh failed: {down.stderr}"


@pytest.fixture(scope="module", params=WANTED or ["none"])
def filesystem(request) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(name, state folder, {setting: expected}) of one running filesystem."""
    for state, settings in _up(request.param):
        yield request.param, state, settings


def _job_folders(state: str, setting: str) -> tuple[str, str]:
    """A fresh run directory of the setting, through mount A and through mount B."""
    job = tempfile.mkdtemp(prefix="job-", dir=os.path.join(state, setting, "A"))
    os.chmod(os.path.dirname(job), 0o755)  # (a volume's root may be 0777: fsdist would refuse below it)
    through_b = os.path.join(state, setting, "B", os.path.basename(job))
    end = time.monotonic() + 10
    while not os.path.isdir(through_b):
        assert time.monotonic() < end, f"{through_b} did not appear through mount B"
        time.sleep(0.05)
    return job, through_b


def _fsdist(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsdist", *args], capture_output=True, text=True, timeout=timeout)


def test_each_setting_gets_the_doctors_verdict_it_should(filesystem) -> None:
    name, state, settings = filesystem
    for setting, expected in settings.items():
        a, b = _job_folders(state, setting)
        start = time.monotonic()
        stall = "20" if expected == "hangs" else "120"  # (MooseFS's colliding writes stall 30 s each)
        doctor = _fsdist("doctor", a, "--peer-mount", b, "--json", "--stall-timeout", stall)
        took = time.monotonic() - start
        report = json.loads(doctor.stdout) if doctor.stdout.startswith("{") else {}
        findings = {f["name"]: f for f in report.get("findings", [])}
        summary = {k: v["verdict"] for k, v in findings.items()}
        print(f"\n{name} {setting}: doctor rc {doctor.returncode} verdict {report.get('verdict')} ({took:.0f} s)")
        for finding in findings.values():
            print(f"  [{finding['verdict']}] {finding['name']}: {finding['detail']}")
        if doctor.stderr.strip():
            print(f"  stderr: {doctor.stderr.strip()[:600]}")
        if expected == "hangs":
            assert doctor.returncode == 1 and "measurement made no progress for 20 s" in doctor.stderr, doctor
        elif expected == "safe":
            assert doctor.returncode == 0 and report["verdict"] != "unsafe", (setting, summary, doctor.stderr)
            assert summary["lock semantics"] == "ok", findings["lock semantics"]
        else:
            assert doctor.returncode == 1, (setting, summary, doctor.stderr)


def test_safe_settings_run_the_collectives_and_ddp_across_two_mounts(filesystem) -> None:
    name, state, settings = filesystem
    for setting in [s for s, e in settings.items() if e == "safe"]:
        a, b = _job_folders(state, setting)
        pool = split_pool(a, b)
        try:
            for case, args in CASES:
                start = time.monotonic()
                no_failures(pool.run(case, *args))
                print(f"\n{name} {setting}: {case.__name__}{args}: {time.monotonic() - start:.1f} s", end="")
            start = time.monotonic()
            assert max(pool.run(cases_training.ddp_matches_reference, "plain")) <= 1e-6
            print(f"\n{name} {setting}: DDP 20 steps matches the reference: {time.monotonic() - start:.1f} s")
        finally:
            pool.close()


def test_safe_settings_report_a_killed_rank_and_start_the_next_job(filesystem) -> None:
    """SIGKILL mid-collective: every survivor names the dead rank; the next job starts."""
    name, state, settings = filesystem
    for setting in [s for s, e in settings.items() if e == "safe"]:
        print(f"\n{name} {setting}: {kill_one_and_start_the_next(*_job_folders(state, setting))}")


def test_unsafe_settings_do_not_start_a_job_across_two_mounts(filesystem) -> None:
    name, state, settings = filesystem
    for setting in [s for s, e in settings.items() if e != "safe"]:
        a, b = _job_folders(state, setting)
        start = time.monotonic()
        with pytest.raises(RankError) as error:
            pool = split_pool(a, b, group_timeout=30)
            pool.close()
        text = str(error.value)
        print(f"\n{name} {setting}: refused after {time.monotonic() - start:.0f} s: {text[-1500:]}")
        assert "refusing to start" in text or "fsdist doctor" in text, text
        assert any(n in text for n in ("MooseFS", "JuiceFS", "SeaweedFS", "CephFS", "juicefs", "seaweedfs")), text


def test_bench_locks_across_the_mounts(filesystem) -> None:
    """Every lock kind side by side: no lost update on a safe setting; the table for the docs."""
    name, state, settings = filesystem
    for setting, expected in settings.items():
        if expected == "hangs":
            print(f"\n{name} {setting}: bench locks not run (its opens would hang in the kernel)")
            continue
        a, b = _job_folders(state, setting)
        bench = _fsdist("bench", "locks", a, "--peer-mount", b, "--kind", "all", "--seconds", "1", "--json")
        assert bench.returncode in (0, 1), bench.stderr
        rows = json.loads(bench.stdout)
        print(f"\n{name} {setting} ({expected}): bench locks --kind all, 4 processes x 1 s across A and B")
        for r in rows:
            print(f"  {r['kind']:<13} {r['increments']:>6} increments {r['lost_updates']:>5} lost "
                  f"{r['acquisitions_per_s']:>8.0f}/s p50 {r['p50_us']:>8.0f} us")  # fmt: skip
        if expected == "safe":
            assert bench.returncode == 0 and all(r["lost_updates"] == 0 for r in rows), rows
        elif expected == "local-only":
            assert rows[0]["kind"] == "fsdist" and rows[0]["lost_updates"] > 0, rows


def test_bench_two_ranks_through_one_mount(filesystem) -> None:
    """What a small and a large all_reduce cost here (one mount: a job fsdist starts on every
    setting), beside Gloo in the same run; docs/filesystems.md puts it beside tmpfs."""
    name, state, settings = filesystem
    setting = next((s for s, e in settings.items() if e == "safe"), list(settings)[-1])  # (never one that hangs)
    a, _ = _job_folders(state, setting)
    os.environ["FSDIST_ALLOW_UNSAFE_FS"] = "1"  # (SeaweedFS refuses even one mount: its locks outlive a crash)
    try:
        bench = _fsdist(
            "bench", "--ranks", "2", "--dir", a, "--ops", "all_reduce,broadcast", "--sizes", "8,1M", "--iters",
            "small", "--out", "", timeout=600,
        )  # fmt: skip
    finally:
        del os.environ["FSDIST_ALLOW_UNSAFE_FS"]
    assert bench.returncode == 0, bench.stderr[-3000:]
    table = [line for line in bench.stdout.splitlines() if not line.startswith("fsdist bench:")]
    print(f"\n{name} {setting}, one mount:\n" + "\n".join(table))
