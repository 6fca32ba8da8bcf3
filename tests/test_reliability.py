"""No hangs, no silent corruption, no poisoned or overflowing directories.

Timing numbers are printed (pytest -s shows them), never asserted: a test must not depend on
how loaded the machine is. What is asserted is *what* each rank raised; the group timeout is
set far above the harness's case deadline, so only dead-peer detection can pass in time.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import pytest

from fsdist.files.locks import LockedRecord

from harness import RankPool
from in_rank import reliability as cases


def test_ten_thousand_small_all_reduces_keep_the_directory_small(pool_factory) -> None:
    results = pool_factory(2).run(cases.many_small_all_reduces, 10_000)
    most = max(r[0] for r in results)
    print(f"\nmost files in the run directory during 10,000 all_reduces: {most}")
    assert most <= 64, f"the run directory grew to {most} files"


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    probe = tempfile.mkdtemp()
    try:
        ok = (
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe], capture_output=True).returncode
            == 0
        )
        if ok:
            subprocess.run(["umount", probe], check=False)
        return ok
    finally:
        os.rmdir(probe)


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="mounting a small tmpfs needs root")
def test_a_full_filesystem_is_a_clear_error_and_leaves_no_partial_file() -> None:
    pool = RankPool(2, group_timeout=60, mount_tmpfs_size="24m")
    try:
        results = pool.run(cases.fill_the_disk, 32 << 20, timeout=40)
        # every rank has returned: nothing of theirs is still being written
        temps = [n for _, _, files in os.walk(pool.directory) for n in files if n.startswith(".tmp")]
    finally:
        pool.kill()
    assert not temps, f"half-written files left behind: {temps}"
    for rank, text in enumerate(results):
        assert "no error" not in text, f"rank {rank}: {text}"
    assert any("No space left on device" in t and "could not publish" in t for t in results), results


FAULT_OPS = ["all_reduce", "broadcast", "all_gather", "sendrecv", "barrier"]


@pytest.mark.parametrize("op", FAULT_OPS)
@pytest.mark.parametrize("trial", range(4))
def test_kill_one_rank_of_four_at_a_random_point(op: str, trial: int) -> None:
    seed = zlib.crc32(f"{op}-{trial}".encode()) % 10_000  # printed; reruns reproduce it
    rng = random.Random(seed)
    victim = rng.randrange(4)
    pool = RankPool(4, group_timeout=120)
    ready = os.path.join(pool.directory, "ready")
    try:
        case = pool.start_each(cases.loop_until_killed, [(op, ready)] * 4, timeout=60)
        deadline = time.monotonic() + 60
        while not all(os.path.exists(f"{ready}.{r}") for r in range(4)):
            assert time.monotonic() < deadline, "ranks never got going"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        killed_at = time.time()
        os.kill(pool.processes[victim].pid, signal.SIGKILL)
        results = pool.results(f"{case}: {op} trial {trial}", 60, deaths_expected=True)
    finally:
        pool.kill()
    survivors = {r: res for r, res in enumerate(results) if r != victim}
    latencies = {r: round(at - killed_at, 3) for r, (_, at) in survivors.items()}
    print(f"\n{op} trial {trial} (seed {seed}): killed rank {victim}; detection latency per survivor: {latencies}")
    for rank, (text, _) in survivors.items():
        assert text.startswith("PeerFailedError"), f"rank {rank} (seed {seed}): {text}"
        assert f"rank {victim}" in text, f"rank {rank} does not name the dead rank: {text}"


def _unshare_pid_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--pid", "--fork", "--kill-child", "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare_pid_works(), reason="unshare --pid needs root and util-linux")
def test_a_peer_on_another_machine_is_declared_dead_by_its_stalled_heartbeat(tmp_path) -> None:
    script = os.path.join(os.path.dirname(__file__), "other_machine_rank.py")
    env = {**os.environ, "FSDIST_HEARTBEAT_TIMEOUT": "2", "PYTHONUNBUFFERED": "1"}
    here = subprocess.Popen(
        [sys.executable, script, str(tmp_path), "0", "2"], stdout=subprocess.PIPE, text=True, env=env
    )
    there = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, script, str(tmp_path), "1", "2"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert here.stdout is not None and there.stdout is not None
        assert here.stdout.readline().strip() == "ready"
        assert there.stdout.readline().strip() == "ready"
        killed_at = time.time()
        there.kill()  # SIGKILL to unshare; --kill-child takes the rank with it
        line = here.stdout.readline().strip()
        here.wait(60)
    finally:
        for proc in (here, there):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    _, raised_at, text = line.split(" ", 2)
    print(f"\nother-machine peer killed; declared dead after {float(raised_at) - killed_at:.2f} s: {text}")
    assert text.startswith("PeerFailedError"), text
    assert "stopped its heartbeat" in text and "rank 1" in text, text


def _rank(directory: Path, rank: int, world: int, env: dict[str, str], other_machine: bool = False):
    script = os.path.join(os.path.dirname(__file__), "other_machine_rank.py")
    prefix = ["unshare", "--pid", "--fork", "--kill-child"] if other_machine else []
    command = [*prefix, sys.executable, script, str(directory), str(rank), str(world)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)


def _rank_pid(proc: subprocess.Popen[str], other_machine: bool) -> int:
    """The rank's own pid: ``unshare --fork``'s child where it runs in a pid namespace."""
    if not other_machine:
        return proc.pid
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as children:
        return int(children.read().split()[0])


@pytest.mark.parametrize("holding", ["nothing", "its locks"])
def test_a_rank_stopped_by_sigstop_is_reported_as_stalled(tmp_path, holding: str) -> None:
    """Alive to /proc but running nothing: its peer judges it by its heartbeat and fails cleanly,
    even where it stopped holding the lock on its record and its heartbeat (the test holds them
    for it: a stop inside a lock is otherwise a matter of luck) and the peer waits for the lock."""
    env = {**os.environ, "FSDIST_HEARTBEAT_TIMEOUT": "2", "PYTHONUNBUFFERED": "1"}
    ranks = [_rank(tmp_path, rank, 2, env) for rank in (0, 1)]
    try:
        with contextlib.ExitStack() as held:
            assert [p.stdout.readline().strip() for p in ranks if p.stdout] == ["ready", "ready"]
            if holding == "its locks":
                names = ("state.r1", "heartbeat.r1")
                paths = [os.path.join(d, n) for d, _, files in os.walk(tmp_path) for n in files if n in names]
                assert len(paths) == 2, paths
                for path in paths:
                    held.enter_context(held.enter_context(LockedRecord(path, create=False)).held())
            stopped_at = time.time()
            os.kill(ranks[1].pid, signal.SIGSTOP)
            assert ranks[0].stdout is not None
            _, raised_at, text = ranks[0].stdout.readline().strip().split(" ", 2)
            ranks[0].wait(60)
        print(f"\nstopped rank declared stalled after {float(raised_at) - stopped_at:.2f} s: {text}")
        assert text.startswith("PeerFailedError") and "rank 1" in text, text
        assert "its process is stopped" in text and "stopped its heartbeat" in text, text
        os.kill(ranks[1].pid, signal.SIGCONT)  # resumed: it learns the group broke, and ends
        assert ranks[1].stdout is not None
        assert ranks[1].stdout.readline().startswith("error "), "the resumed rank went on as if nothing happened"
        ranks[1].wait(60)
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.skipif(not _unshare_pid_works(), reason="unshare --pid needs root and util-linux")
def test_a_stalled_rank_on_another_machine_resumed_after_the_next_job_started_leaves_it_alone(tmp_path) -> None:
    """The stalled rank's job fails; `fsdist clean --force` and a new job follow; then the stalled
    rank resumes, writes where its old generation was, and fails: the new job goes on, correct."""
    env = {**os.environ, "FSDIST_HEARTBEAT_TIMEOUT": "2", "PYTHONUNBUFFERED": "1"}
    first = [_rank(tmp_path, 0, 2, env), _rank(tmp_path, 1, 2, env, other_machine=True)]
    second: list[subprocess.Popen[str]] = []
    try:
        assert [p.stdout.readline().strip() for p in first if p.stdout] == ["ready", "ready"]
        stalled = _rank_pid(first[1], other_machine=True)
        os.kill(stalled, signal.SIGSTOP)
        assert first[0].stdout is not None
        text = first[0].stdout.readline().strip()
        assert "PeerFailedError" in text and "stopped its heartbeat" in text, text
        first[0].wait(60)
        cleaned = subprocess.run(
            [sys.executable, "-m", "fsdist", "clean", "--force", str(tmp_path)], capture_output=True, text=True
        )
        assert cleaned.returncode == 0, cleaned.stderr
        second = [_rank(tmp_path, rank, 2, env) for rank in (0, 1)]
        assert [p.stdout.readline().strip() for p in second if p.stdout] == ["ready", "ready"]
        os.kill(stalled, signal.SIGCONT)
        assert first[1].stdout is not None
        assert first[1].stdout.readline().startswith("error "), "the resumed rank went on as if nothing happened"
        time.sleep(3)  # the new job keeps checking its all_reduces meanwhile
        assert [p.poll() for p in second] == [None, None], "the new job stopped after the old rank resumed"
    finally:
        for proc in [*first, *second]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outputs = [p.stdout.read() if p.stdout else "" for p in second]
    assert not any("error" in out for out in outputs), outputs


@pytest.fixture(scope="module")
def write_fault(tmp_path_factory) -> str:
    """tests/faults/write_fault.c, built: an LD_PRELOAD shim whose writes under a prefix fail."""
    if shutil.which("gcc") is None:
        pytest.skip("building the write-fault shim needs gcc")
    built = str(tmp_path_factory.mktemp("shim") / "write_fault.so")
    source = os.path.join(os.path.dirname(__file__), "faults", "write_fault.c")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", built, source, "-ldl"], check=True)
    return built


@pytest.mark.parametrize(("errno_name", "numel"), [("EIO", 10), ("ENOSPC", 16384)], ids=["EIO-inline", "ENOSPC-file"])
def test_a_failing_write_is_a_clear_error_on_every_rank_and_clean_makes_the_directory_usable(
    tmp_path, write_fault, errno_name: str, numel: int
) -> None:
    """Rank 1's writes into the run directory start failing mid-job (the disk breaks, or fills)."""
    code = getattr(errno, errno_name)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FSDIST_HEARTBEAT_TIMEOUT": "5"}
    faulty = {**env, "LD_PRELOAD": write_fault, "FAULT_PREFIX": str(tmp_path / "run"), "FAULT_AFTER": "400",
              "FAULT_ERRNO": str(code)}  # fmt: skip
    script = os.path.join(os.path.dirname(__file__), "other_machine_rank.py")
    ranks = [
        subprocess.Popen(
            [sys.executable, script, str(tmp_path / "run"), str(r), "2", str(numel)],
            stdout=subprocess.PIPE,
            text=True,
            env=e,
        )
        for r, e in ((0, env), (1, faulty))
    ]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in ranks]
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
    errors = [next((line for line in out.splitlines() if line.startswith("error ")), "") for out in outputs]
    print(f"\n{errno_name}: {errors}")
    assert os.strerror(code) in errors[1] and "rank 1, operation #" in errors[1], errors[1]
    assert "rank 1" in errors[0] and ("PeerFailedError" in errors[0] or "GroupBrokenError" in errors[0]), errors[0]
    temps = [n for _, _, files in os.walk(tmp_path / "run") for n in files if n.startswith(".tmp")]
    assert not temps, f"half-written files left behind: {temps}"
    cleaned = subprocess.run([sys.executable, "-m", "fsdist", "clean", str(tmp_path / "run")], capture_output=True)
    assert cleaned.returncode == 0, cleaned.stderr
    after = [_rank(tmp_path / "run", r, 2, env) for r in (0, 1)]  # the same directory, a sound disk
    try:
        assert [p.stdout.readline().strip() for p in after if p.stdout] == ["ready", "ready"]
    finally:
        for proc in after:
            proc.kill()
            proc.wait()
