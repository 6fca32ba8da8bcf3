"""Restarts: ``fsdist run --max-restarts`` and torchrun's ``--max-restarts`` over the fsdist rendezvous.

A 4-rank job, 2 launchers × 2 ranks on simulated nodes (each its own FSDIST_NODE_ID and local
directory, so the job runs in two tiers), trains examples/train_restartable.py with DCP
checkpoints; one rank kills itself with SIGKILL at a random step. Each trial must finish with
parameters equal, bit for bit, to an uninterrupted run's, record the round in the restart
history, and leave only the documented files. ``FSDIST_RESTART_TRIALS`` sets the number of
trials (default 1; ``make test-restarts``: 20, and the elastic test), ``FSDIST_RESTART_SEED``
their random seed. torchrun's ``--max-restarts`` and ``--nnodes=MIN:MAX`` over the fsdist
rendezvous run the same script.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch

from fsdist.protocol import failure_report

from harness import left_in

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_restartable.py")
STEPS = 16
EVERY = 4  # checkpoint every EVERY steps
TRIALS = int(os.environ.get("FSDIST_RESTART_TRIALS", "1"))
SEED = int(os.environ.get("FSDIST_RESTART_SEED", "2026"))
#: What a finished job leaves in its run directory (docs/reliability.md, "Restarts")
DOCUMENTED = {"fsdist-rendezvous.json", ".launch", ".launch/fsdist-rendezvous.json", ".launch/rounds"}


def _script_args(tmp: Path, *extra: str) -> list[str]:
    return [EXAMPLE, "--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--checkpoint", str(tmp / "ckpt"),
            "--out", str(tmp / "params.pt"), *extra]  # fmt: skip


def _node_env(tmp: Path, node: int) -> dict[str, str]:
    local = tmp / f"local{node}"
    local.mkdir(exist_ok=True)
    return {**os.environ, "FSDIST_NODE_ID": f"node{node}", "FSDIST_LOCAL_DIR": str(local)}


def _fsdist_run(tmp: Path, restarts: int, *extra: str) -> list[subprocess.CompletedProcess[str]]:
    """Two launchers of 2 ranks each running the example, run to the end."""
    return _two_launchers(tmp, _script_args(tmp, *extra), restarts)


def _two_launchers(
    tmp: Path, script: list[str], restarts: int = 0, shared_local: Path | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """`fsdist run` twice, as nodes 0 and 1 (own local directories unless ``shared_local``)."""
    procs = []
    for node in (0, 1):
        env = _node_env(tmp, node)
        if shared_local is not None:
            env["FSDIST_LOCAL_DIR"] = str(shared_local)
        command = [sys.executable, "-m", "fsdist", "run", "--dir", str(tmp / "run"), "--nproc-per-node", "2",
                   "--nnodes", "2", "--node-rank", str(node), "--max-restarts", str(restarts), *script]  # fmt: skip
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def _left_behind(tmp: Path) -> tuple[set[str], list[str]]:
    """The run directory's files, and whatever the node-local directories still hold."""
    run = tmp / "run"
    files = {str(p.relative_to(run)) for p in run.rglob("*")}
    local = [f"local{node}/{name}" for node in (0, 1) for name in left_in(str(tmp / f"local{node}"))]
    return files, local


def _params(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    results = _fsdist_run(tmp, 0)
    assert all(r.returncode == 0 for r in results), results[0].stderr[-3000:] + results[1].stderr[-3000:]
    return _params(tmp / "params.pt")


#: the elastic test takes ~1 min: it runs with `make test-restarts` (which sets the trials)
FULL = "FSDIST_RESTART_TRIALS" in os.environ


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_killed_rank_restarts_the_job_which_ends_as_if_uninterrupted(tmp_path, uninterrupted, trial) -> None:
    rng = random.Random(SEED + trial)
    rank, step = rng.randrange(4), rng.randint(1, STEPS)
    results = _fsdist_run(tmp_path, 3, "--kill-rank", str(rank), "--kill-at-step", str(step))
    logs = "\n".join(r.stdout[-2000:] + r.stderr[-3000:] for r in results)
    where = f"trial {trial}: rank {rank} killed at step {step}"
    assert [r.returncode for r in results] == [0, 0], f"{where}\n{logs}"
    for result in results:
        assert f"the first failure was rank {rank} (exit code -9" in result.stderr, f"{where}\n{logs}"
        assert "restarting the job (restart 1 of 3)" in result.stderr, f"{where}\n{logs}"
    resumed = (step - 1) // EVERY * EVERY  # the newest checkpoint written before the kill
    assert (f"resuming after step {resumed}" in logs) == (resumed > 0), f"{where}\n{logs}"
    got = _params(tmp_path / "params.pt")
    assert got.keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        assert torch.equal(got[name], value), f"{where}: parameter {name} differs from the uninterrupted run"
    files, local = _left_behind(tmp_path)
    assert files == DOCUMENTED and not local, f"{where}: left behind {sorted(files - DOCUMENTED)} and {local}"
    history = failure_report.parse_rounds((tmp_path / "run" / ".launch" / "rounds").read_bytes())
    assert history["max_restarts"] == 3
    assert [(e["round"], e["rank"], e["exit_code"]) for e in history["rounds"]] == [(0, rank, -9)], history
    status = subprocess.run([sys.executable, "-m", "fsdist", "status", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "fsdist run --max-restarts 3" in status.stdout and "restarted 1 time" in status.stdout, status.stdout
    assert f"round 0 ended by rank {rank} (exit code -9" in status.stdout, status.stdout


def test_without_restarts_left_the_job_fails_and_leaves_nothing_behind(tmp_path) -> None:
    results = _fsdist_run(tmp_path, 0, "--kill-rank", "1", "--kill-at-step", "3")
    for result in results:
        assert result.returncode == 1, result.stderr[-3000:]
        assert "the job failed; the first failure was rank 1 (exit code -9" in result.stderr, result.stderr[-3000:]
        assert "restarting" not in result.stderr
    files, local = _left_behind(tmp_path)
    assert files == DOCUMENTED and not local, f"left behind {sorted(files - DOCUMENTED)} and {local}"
    status = subprocess.run([sys.executable, "-m", "fsdist", "status", "--json", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    history = json.loads(status.stdout)["restarts"]
    assert history["max_restarts"] == 0 and [e["rank"] for e in history["rounds"]] == [1], history


def test_restart_history_is_parsed_not_trusted() -> None:
    good = failure_report.add_round(b"", "job1", 2, 0, {"rank": 3, "exit_code": -9, "traceback": "x" * 10})
    assert good is not None
    assert failure_report.parse_rounds(good)["rounds"] == [{"rank": 3, "exit_code": -9, "round": 0}]
    assert failure_report.add_round(good, "job1", 2, 0, {"rank": 1}) is None  # the round's first failure stays
    again = failure_report.add_round(good, "job2", 2, 0, {"rank": 1})  # another job: a new history
    assert again is not None and failure_report.parse_rounds(again)["job"] == "job2"
    consequence = failure_report.add_round(b"", "j", 2, 0, {"rank": 0, "type": "PeerFailedError"})
    assert consequence is not None
    cause = failure_report.add_round(consequence, "j", 2, 0, {"rank": 3, "exit_code": -9})
    assert cause is not None and failure_report.parse_rounds(cause)["rounds"][0]["rank"] == 3
    history = b""
    for index in range(failure_report.MAX_ROUNDS + 5):  # long non-ASCII texts: 6 bytes a character in JSON
        history = failure_report.add_round(history, "j", 1000, index, {"rank": 1, "message": "é" * 100_000}) or history
    assert len(failure_report.parse_rounds(history)["rounds"]) == failure_report.MAX_ROUNDS
    assert failure_report.add_round(b"", "j", 1, None, {}) is not None  # a job starting its history
    bad_rounds = b'{"format": 1, "job": "j", "max_restarts": 1, "rounds": [{"round": -1}]}'
    bad_budget = b'{"format": 1, "job": "j", "max_restarts": true, "rounds": []}'
    for bad in (b"[" * 100_000, b"[]", b'{"format": 1}', bad_rounds, bad_budget, b"\xff" * 10):
        for raw in (bad, bad + b"\n#crc32=%08x\n" % zlib.crc32(bad)):  # unsealed, and sealed as if by fsdist
            with pytest.raises(ValueError):
                failure_report.parse_rounds(raw)


def _torchrun(tmp: Path, node: int, nnodes: str, *rest: str) -> list[str]:
    """torchrun for agent ``node`` over the fsdist rendezvous, 2 workers, up to 3 restarts."""
    return [sys.executable, "-m", "torch.distributed.run", f"--log-dir={tmp / f'logs{node}'}", "--rdzv-backend=fsdist",
            f"--rdzv-endpoint={tmp / 'endpoint'}", "--rdzv-id=job", f"--nnodes={nnodes}", "--nproc-per-node=2",
            "--max-restarts=3", "--monitor-interval=0.2", *rest]  # fmt: skip


def test_torchrun_max_restarts_over_the_fsdist_rendezvous(tmp_path, uninterrupted) -> None:
    """torch's own agents restart the job: the one whose worker died, and the other one on its
    ``num_nodes_waiting``; the run ends as if uninterrupted."""
    procs = [
        subprocess.Popen(
            _torchrun(tmp_path, node, "2", *_script_args(tmp_path, "--kill-rank", "2", "--kill-at-step", "7")),
            env=_node_env(tmp_path, node),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    logs = "\n".join(out[-2000:] + err[-3000:] for out, err in outputs)
    assert [proc.returncode for proc in procs] == [0, 0], logs
    assert "resuming after step 4" in logs, logs
    got = _params(tmp_path / "params.pt")
    for name, value in uninterrupted.items():
        assert torch.equal(got[name], value), f"parameter {name} differs from the uninterrupted run"
    workers = tmp_path / "endpoint" / "job" / "workers"
    assert not [p.name for p in workers.iterdir() if p.name.startswith("gen-")], "a generation was left behind"
    assert not [n for node in (0, 1) for n in left_in(str(tmp_path / f"local{node}"))], "node tiers left behind"


def _wait_for(paths: list[Path], pattern: str, after: int = 0, seconds: float = 120) -> re.Match[str]:
    """The first match of ``pattern`` in the logs' text past offset ``after`` (their join)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = "\n".join(p.read_text(errors="replace") for p in paths if p.exists())
        found = re.compile(pattern).search(text, after)
        if found:
            return found
        time.sleep(0.2)
    tails = "\n".join(p.read_text()[-3000:] for p in paths if p.exists())
    raise AssertionError(f"no {pattern!r} within {seconds} s in:\n{tails}")


@pytest.mark.skipif(not FULL, reason="~1 min: make test-restarts runs it")
def test_torchrun_elastic_range_reforms_when_a_node_joins_and_when_it_leaves(tmp_path) -> None:
    """``--nnodes=1:2``: one agent forms a 2-rank job; a second agent arriving mid-run makes it
    re-form with 4 ranks; that agent stopped (SIGTERM) makes it re-form with 2, which finishes."""
    logs = [tmp_path / f"agent{node}.log" for node in (0, 1)]

    def agent(node: int) -> subprocess.Popen[bytes]:
        with open(logs[node], "wb") as log:
            return subprocess.Popen(
                _torchrun(
                    tmp_path,
                    node,
                    "1:2",
                    "--rdzv-conf=last_call_timeout=1",
                    EXAMPLE,
                    "--steps",
                    "400",
                    "--checkpoint-every",
                    "2",
                    "--step-seconds",
                    "0.05",
                    "--checkpoint",
                    str(tmp_path / "ckpt"),
                ),
                env=_node_env(tmp_path, node),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    first = agent(0)
    second = None
    try:
        _wait_for(logs, r"2 ranks, from step 1\b")
        second = agent(1)
        joined = _wait_for(logs, r"4 ranks, from step (\d+)")
        time.sleep(2)  # train a little with both nodes
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=60)
        left = _wait_for(logs, r"2 ranks, from step (\d+)", after=joined.end())
        assert int(left.group(1)) > int(joined.group(1)), "the job did not resume from a later checkpoint"
        assert first.wait(timeout=300) == 0, logs[0].read_text()[-5000:]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert "trained to step 400" in logs[0].read_text(), logs[0].read_text()[-3000:]
    workers = tmp_path / "endpoint" / "job" / "workers"
    assert not [p.name for p in workers.iterdir() if p.name.startswith("gen-")], "a generation was left behind"
    assert not [n for node in (0, 1) for n in left_in(str(tmp_path / f"local{node}"))], "node tiers left behind"


def test_the_first_failure_record_keeps_root_causes_and_finality(tmp_path) -> None:
    from fsdist.cli.run_failures import claim as _claim
    from fsdist.files.locks import LockedRecord

    with LockedRecord(str(tmp_path / "abort")) as abort:
        peer = {"rank": 0, "exit_code": 1, "type": "PeerFailedError", "message": "rank 2 died"}
        assert _claim(abort, peer)["type"] == "PeerFailedError"
        killed = {"rank": 2, "exit_code": -9, "message": "rank 2 killed by signal 9"}
        assert _claim(abort, killed)["rank"] == 2  # the root cause replaces the consequence
        assert _claim(abort, {**peer, "rank": 1})["rank"] == 2  # and a consequence never replaces it
        signalled = _claim(abort, {"rank": -1, "reason": "launcher got signal 15", "final": 1})
        assert signalled["rank"] == 2 and signalled["final"] == 1  # the first failure stays, now final


LATE_LEAVER = """
import time, torch, torch.distributed as dist
dist.init_process_group("fsdist")
t = torch.ones(4)
dist.all_reduce(t)  # two tiers: both nodes' tiers exist now
assert t[0].item() == dist.get_world_size()
if dist.get_rank() >= 2:
    time.sleep(3)  # node 1 leaves well after node 0
    dist.all_reduce(t, group=dist.new_group([2, 3]))
dist.destroy_process_group()
"""


def test_nodes_sharing_a_local_directory_remove_only_their_own_tiers(tmp_path) -> None:
    """Two simulated nodes, one FSDIST_LOCAL_DIR: the node leaving first keeps the other's tiers."""
    script = tmp_path / "late_leaver.py"
    script.write_text(LATE_LEAVER)
    shared = tmp_path / "local"
    shared.mkdir()
    results = _two_launchers(tmp_path, [str(script)], shared_local=shared)
    assert [r.returncode for r in results] == [0, 0], "\n".join(r.stderr[-3000:] for r in results)
    assert not left_in(str(shared)), "node tiers left behind"


def test_a_launcher_waiting_for_the_other_nodes_stops_on_sigterm(tmp_path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fsdist",
            "run",
            "--dir",
            str(tmp_path / "run"),
            "--nproc-per-node",
            "1",
            "--nnodes",
            "2",
            "--max-restarts",
            "2",
            EXAMPLE,
            "--checkpoint",
            str(tmp_path / "ckpt"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3)  # in the launchers' rendezvous: the second node never comes
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode != 0
