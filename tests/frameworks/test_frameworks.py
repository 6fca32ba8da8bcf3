"""Lightning, accelerate and the transformers Trainer train on fsdist, bit for bit as on Gloo.

Each test runs an example of examples/frameworks as a user would (real processes, 2 ranks, CPU):
the example itself checks that both replicas end bit-identical, and the test compares rank 0's
final parameters with the same example run over Gloo. Run with `make test-frameworks`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import left_in

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "frameworks"
STEPS = 5
TIMEOUT = 300


def _env(**extra: str) -> dict[str, str]:
    # one thread per rank: 2 ranks share the 2 cores, and every run (fsdist or Gloo) computes alike
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def _gloo_env() -> dict[str, str]:
    """A Gloo run under `fsdist run` meets through torch's own env:// (a TCPStore): the reference
    owes nothing to fsdist (with FSDIST_DIR set, fsdist would otherwise serve env:// itself)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), FSDIST_ENV_INIT="torch")


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (fsdist run starts each rank in a session of its own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive_in_group(pgid: int) -> list[int]:
    """Processes of process group ``pgid`` that have not exited (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a session of its own; then wait for every process it started to end
    (Lightning's launcher does not wait for the ranks it started), killing them after 60 s."""
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill([*_descendants(proc.pid), proc.pid])  # the ranks first: killed, a launcher cannot stop them
        out, err = proc.communicate()
        pytest.fail(f"{command} ran over {TIMEOUT} s:\n{out}{err}")
    deadline = time.monotonic() + 60
    while _alive_in_group(proc.pid):
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"processes of {command} outlived it by 60 s:\n{out}{err}")
        time.sleep(0.1)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _fsdist_run(cwd: Path, script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    launcher = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "2", "--dir", str(cwd / "run")]
    done = _run([*launcher, str(EXAMPLES / script), *args], cwd, env)
    if done.returncode == 0:  # the launcher's files only: every generation was left and removed
        left = set(os.listdir(cwd / "run")) - {".launch", "fsdist-rendezvous.json"}
        assert not left, f"the run directory kept {sorted(left)}"
    return done


def _check(done: subprocess.CompletedProcess[str], framework: str, backend: str) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    line = f"[rank 0] {framework}: {STEPS} steps on 2 ranks over {backend}; replicas bitwise equal"
    assert line in done.stdout, done.stdout + done.stderr


def _assert_same_bits(path: Path, reference: Path) -> None:
    ours, theirs = torch.load(path), torch.load(reference)
    assert list(ours) == list(theirs)
    # compare bits, not values (float32 parameters viewed as int32)
    differ = [name for name in ours if not torch.equal(ours[name].view(torch.int32), theirs[name].view(torch.int32))]
    assert not differ, f"parameters differ from the Gloo run's: {differ}"


def _only(directory: Path, *names: str) -> None:
    """Nothing but ``names`` was written in the run's working directory (no logs, no checkpoints)."""
    assert sorted(os.listdir(directory)) == sorted(names), os.listdir(directory)


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    """``gloo(framework)``: rank 0's final parameters of the example run over Gloo (one run each)."""
    done_by_framework: dict[str, Path] = {}

    def reference(framework: str) -> Path:
        if framework not in done_by_framework:
            cwd = tmp_path_factory.mktemp(f"gloo-{framework}")
            script, save = f"train_{framework}.py", str(cwd / "params.pt")
            if framework == "lightning":  # Lightning's own launcher, as a Gloo user would run it
                done = _run([sys.executable, str(EXAMPLES / script), "--backend", "gloo", "--save", save], cwd, _env())
            else:
                done = _fsdist_run(cwd, script, "--backend", "gloo", "--save", save, env=_gloo_env())
            _check(done, framework, "gloo")
            done_by_framework[framework] = Path(save)
        return done_by_framework[framework]

    return reference


def test_lightning_starts_its_own_second_rank_over_fsdist(tmp_path, gloo) -> None:
    local = tmp_path / "local"  # where fsdist keeps a TCPStore-formed job's files on this machine
    env = _env(FSDIST_LOCAL_DIR=str(local))
    done = _run([sys.executable, str(EXAMPLES / "train_lightning.py"), "--save", "params.pt"], tmp_path, env)
    _check(done, "lightning", "fsdist")
    _assert_same_bits(tmp_path / "params.pt", gloo("lightning"))
    assert not local.exists() or not left_in(str(local)), f"fsdist left files behind: {left_in(str(local))}"
    _only(tmp_path, "params.pt", *(["local"] if local.exists() else []))


# what `srun --nodes=1 --ntasks-per-node=1 python -m fsdist run ...` hands each rank: the launcher's
# SLURM task, which Lightning would detect and mistake for the rank's own (the example guards it)
SLURM = {"SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "train", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
         "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
         "SLURM_NODELIST": "localhost"}  # fmt: skip


@pytest.mark.parametrize("under", ["shell", "slurm"])
def test_lightning_under_fsdist_run(tmp_path, gloo, under) -> None:
    env = _env(**SLURM) if under == "slurm" else _env()
    done = _fsdist_run(tmp_path, "train_lightning.py", "--save", "params.pt", env=env)
    _check(done, "lightning", "fsdist")
    _assert_same_bits(tmp_path / "params.pt", gloo("lightning"))
    _only(tmp_path, "params.pt", "run")


def _netns_and_strace() -> bool:
    if shutil.which("unshare") is None or shutil.which("strace") is None:
        return False
    return subprocess.run(["unshare", "-n", "strace", "-o", "/dev/null", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _netns_and_strace(), reason="needs root for unshare -n, and strace")
def test_lightning_under_fsdist_run_needs_no_network(tmp_path, gloo) -> None:
    """In a network namespace with no interface; with MASTER_PORT set (to anything) Lightning does
    not even probe for a free port, so no rank opens an internet socket at all."""
    trace = tmp_path / "socket.trace"
    prefix = ["unshare", "-n", "strace", "-f", "--seccomp-bpf", "-e", "trace=socket", "-o", str(trace)]
    launcher = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "2", "--dir", str(tmp_path / "run")]
    script = [str(EXAMPLES / "train_lightning.py"), "--save", "params.pt"]
    done = _run([*prefix, *launcher, *script], tmp_path, _env(MASTER_PORT="1"))
    _check(done, "lightning", "fsdist")
    _assert_same_bits(tmp_path / "params.pt", gloo("lightning"))
    inet = [line for line in trace.read_text().splitlines() if "AF_INET" in line]
    assert not inet, f"{len(inet)} internet sockets opened, e.g. {inet[:3]}"


# env:// (the default): what a script written for torchrun does; fsdist:// names the directory
@pytest.mark.parametrize("init_method", [None, "fsdist://"])
def test_accelerate_adopts_an_fsdist_group_and_reports_gloo(tmp_path, gloo, init_method) -> None:
    init = ["--init-method", init_method] if init_method else []
    done = _fsdist_run(tmp_path, "train_accelerate.py", *init, "--save", "params.pt", env=_env())
    _check(done, "accelerate", "fsdist")
    assert "accelerate reports backend=gloo distributed_type=DistributedType.MULTI_CPU num_processes=2; " \
           "dist.get_backend()=fsdist" in done.stdout, done.stdout  # fmt: skip
    _assert_same_bits(tmp_path / "params.pt", gloo("accelerate"))
    _only(tmp_path, "params.pt", "run")


def test_transformers_trainer_adopts_an_fsdist_group(tmp_path, gloo) -> None:
    done = _fsdist_run(tmp_path, "train_transformers.py", "--save", "params.pt", env=_env())
    _check(done, "transformers", "fsdist")
    assert "accelerate reports backend=gloo num_processes=2; dist.get_backend()=fsdist" in done.stdout, done.stdout
    _assert_same_bits(tmp_path / "params.pt", gloo("transformers"))
    _only(tmp_path, "params.pt", "run")


# Why the examples create the group themselves: neither framework takes "fsdist" as its backend.
# If one of these starts to pass through, docs/frameworks.md's recipe can become a backend string.
REFUSALS = """
import sys
from accelerate import PartialState
from transformers import HfArgumentParser, TrainingArguments
try:
    PartialState(cpu=True, backend="fsdist")
except ValueError as exc:
    print("accelerate:", exc)
try:
    HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(["--ddp_backend", "fsdist"])
except SystemExit as exc:
    print("transformers argparse exit", exc.code)
"""


def test_accelerate_and_transformers_refuse_fsdist_as_their_backend(tmp_path) -> None:
    env = _env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")  # as under a launcher
    done = subprocess.run(
        [sys.executable, "-c", REFUSALS], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "accelerate: Your assigned backend fsdist is not available, please use gloo" in done.stdout, done.stdout
    assert "transformers argparse exit 2" in done.stdout, done.stdout
    assert "--ddp_backend" in done.stderr and "invalid choice: 'fsdist'" in done.stderr, done.stderr
