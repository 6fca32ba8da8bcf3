"""No hangs, no silent corruption, no poisoned or overflowing directories.

Timing numbers are printed (pytest -s shows them), never asserted: a test must not depend on
how loaded the machine is. What is asserted is *what* each rank raised; the group timeout is
set far above the harness's case deadline, so only dead-peer detection can pass in time.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib

import pytest

import cases_reliability as cases
from harness import RankPool


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
