"""Starting and stopping this node's rank processes: what ``fsdist run`` and ``fsdist bench`` share.

Each rank is a process in a session of its own, so that stopping it stops whatever it started,
and gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK) with
FSDIST_DIR, so ``init_process_group("fsdist")`` needs nothing else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence

__all__ = ["GRACE_SECONDS", "rank_environment", "start", "stop"]

#: How long stopped ranks get between SIGTERM and SIGKILL.
GRACE_SECONDS = 5.0


def rank_environment(
    rank: int, local_rank: int, world: int, local_world: int, node_rank: int, directory: str, **extra: str
) -> dict[str, str]:
    """This process's environment plus what a rank of the job needs (and ``extra``)."""
    return {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(node_rank),
        "FSDIST_DIR": directory,
        **extra,
    }


def start(command: Sequence[str], env: dict[str, str], log_path: str | None = None) -> subprocess.Popen[bytes]:
    """Start one rank in its own session; its output goes to ``log_path`` if given, else ours."""
    if log_path is None:
        return subprocess.Popen(list(command), env=env, start_new_session=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(list(command), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(processes: Sequence[subprocess.Popen[bytes]], grace: float = GRACE_SECONDS) -> None:
    """SIGTERM every running rank's session, then SIGKILL what is still there after ``grace``."""
    for process in processes:
        if process.poll() is None:
            _signal_session(process, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_session(process, signal.SIGKILL)
            process.wait()


def _signal_session(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass  # it ended meanwhile
