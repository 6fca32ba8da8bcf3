"""The port-free launcher: a 4-rank job with no network at all, and failure propagation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


def _launch(directory: Path, *extra: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    command = [*prefix, sys.executable, "-m", "fsdist", "run", "--dir", str(directory), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _netns_and_strace() -> bool:
    if shutil.which("unshare") is None or shutil.which("strace") is None:
        return False
    return subprocess.run(["unshare", "-n", "strace", "-o", "/dev/null", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _netns_and_strace(), reason="needs root for unshare -n, and strace")
def test_four_ranks_train_in_a_network_namespace_and_open_no_inet_socket(tmp_path) -> None:
    trace = tmp_path / "socket.trace"
    prefix = ("unshare", "-n", "strace", "-f", "--seccomp-bpf", "-e", "trace=socket", "-o", str(trace))
    proc = _launch(tmp_path / "run", "--nproc-per-node", "4", EXAMPLE, "--steps", "20", prefix=prefix)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert "step    20/20" in out, out
    calls = trace.read_text().splitlines()
    inet = [line for line in calls if "AF_INET" in line]  # AF_INET and AF_INET6
    assert not inet, f"{len(inet)} internet sockets opened, e.g. {inet[:3]}"
    assert os.listdir(tmp_path / "run") and not [n for n in os.listdir(tmp_path / "run") if n.startswith("gen-")], (
        "the finished job left its generation behind"
    )


def test_a_failing_rank_stops_both_nodes_and_is_reported_by_each(tmp_path) -> None:
    run = tmp_path / "run"
    common = ("--nproc-per-node", "2", "--nnodes", "2")
    script = (EXAMPLE, "--steps", "200", "--fail-at-step", "5")
    nodes = [_launch(run, *common, "--node-rank", str(node), *script) for node in (0, 1)]
    results = [node.communicate(timeout=180) for node in nodes]
    for node, (proc, (_, err)) in enumerate(zip(nodes, results, strict=True)):
        assert proc.returncode != 0, f"node {node} exited 0"
        assert "the first failure was rank 1" in err, f"node {node}: {err[-2000:]}"
        assert "RuntimeError: rank 1 failed on purpose at step 5" in err, f"node {node}: {err[-2000:]}"
