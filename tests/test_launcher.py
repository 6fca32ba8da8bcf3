"""The port-free launcher: a 4-rank job with no network at all, and failure propagation."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")
TORCHRUN_EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "torchrun_ddp.py")


def _launch(directory: Path, *extra: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    command = [*prefix, sys.executable, "-m", "fsdist", "run", "--dir", str(directory), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _netns_and_strace() -> bool:
    if shutil.which("unshare") is None or shutil.which("strace") is None:
        return False
    return subprocess.run(["unshare", "-n", "strace", "-o", "/dev/null", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _netns_and_strace(), reason="needs root for unshare -n, and strace")
@pytest.mark.parametrize("init", ["default env://", "file://"])
def test_four_ranks_train_in_a_network_namespace_and_open_no_inet_socket(tmp_path, init: str) -> None:
    trace = tmp_path / "socket.trace"
    prefix = ("unshare", "-n", "strace", "-f", "--seccomp-bpf", "-e", "trace=socket", "-o", str(trace))
    if init == "file://":  # torch's own port-free init; fsdist keeps its files beside torch's file
        script = (TORCHRUN_EXAMPLE, "--init-method", f"file://{tmp_path}/initfile")
    else:  # init_process_group("fsdist") alone: env://, served through the launcher's FSDIST_DIR
        script = (EXAMPLE, "--steps", "20")
    proc = _launch(tmp_path / "run", "--nproc-per-node", "4", *script, prefix=prefix)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert "step    20/20" in out or out.count("backend fsdist params") == 4, out
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


def _children_by_rank(launcher_pid: int) -> dict[int, int]:
    """The launcher's rank processes, by their RANK, read from /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as environ:
                env = dict(v.split(b"=", 1) for v in environ.read().split(b"\0") if b"=" in v)
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        if b"RANK" in env:
            found[int(env[b"RANK"])] = int(entry)
    return found


def test_a_killed_rank_stops_both_nodes_and_is_named_by_each(tmp_path) -> None:
    common = ("--nproc-per-node", "2", "--nnodes", "2")
    script = (EXAMPLE, "--steps", "1000000", "--log-every", "20")
    nodes = [_launch(tmp_path / "run", *common, "--node-rank", str(node), *script) for node in (0, 1)]
    assert nodes[0].stdout is not None
    first_progress = nodes[0].stdout.readline()  # rank 0 trains: the 4-rank job is formed
    assert "step" in first_progress, first_progress
    victim = _children_by_rank(nodes[1].pid)[3]
    os.kill(victim, 9)
    killed = time.monotonic()
    results = [node.communicate(timeout=120) for node in nodes]
    print(f"both launchers exited {time.monotonic() - killed:.2f} s after kill -9 of rank 3")
    for node, (proc, (_, err)) in enumerate(zip(nodes, results, strict=True)):
        assert proc.returncode != 0, f"node {node} exited 0"
        assert "the first failure was rank 3" in err, f"node {node}: {err[-2000:]}"
        assert "killed by signal 9" in err, f"node {node}: {err[-2000:]}"


EXAMPLES = Path(EXAMPLE).parent


def test_fsdp_example_trains_and_round_trips_its_sharded_checkpoint(tmp_path) -> None:
    script = (str(EXAMPLES / "train_fsdp.py"), "--steps", "10", "--checkpoint", str(tmp_path / "ckpt"))
    proc = _launch(tmp_path / "run", "--nproc-per-node", "4", *script)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert "step    10/10" in out and "every shard identical" in out, out


def test_two_nodes_under_slurm_take_their_node_index_from_slurm(tmp_path) -> None:
    nodes = []
    for node in (0, 1):
        env = {**os.environ, "SLURM_NNODES": "2", "SLURM_NODEID": str(node), "SLURM_PROCID": str(node)}
        command = [sys.executable, "-m", "fsdist", "run", "--dir", str(tmp_path / "run"), "--nproc-per-node", "2",
                   EXAMPLE, "--steps", "10"]  # fmt: skip
        nodes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    results = [node.communicate(timeout=300) for node in nodes]
    for node, (proc, (out, err)) in enumerate(zip(nodes, results, strict=True)):
        assert proc.returncode == 0, f"node {node}: {out + err}"
    assert "step    10/10" in results[0][0] and "(4 ranks)" in results[0][0], results[0][0]


def test_the_two_node_example_script_forms_one_four_rank_job() -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    script = [str(EXAMPLES / "multinode_local.sh"), EXAMPLE, "--steps", "10"]
    result = subprocess.run(script, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "step    10/10" in result.stdout and "(4 ranks)" in result.stdout, result.stdout


def _sealed(raw: bytes) -> bytes:
    """``raw`` with the checksum line fsdist's writers add (protocol/sealed.py)."""
    return raw + b"\n#crc32=%08x\n" % zlib.crc32(raw)


def test_failure_reports_are_parsed_not_trusted() -> None:
    """What a rank or another launcher wrote is checked field by field before it is reported."""
    from fsdist.protocol import failure_report

    raw = failure_report.encode({"rank": 2, "type": "ValueError", "message": "bad", "time": 5.0, "extra": [1]})
    assert failure_report.parse(raw) == {"rank": 2, "type": "ValueError", "message": "bad", "time": 5.0}
    wrong_types = b'{"rank": "0; rm -rf", "type": 3, "message": "m", "time": NaN, "exit_code": true}'
    with pytest.raises(ValueError, match="check line"):
        failure_report.parse(wrong_types)  # not sealed: not written by fsdist, or damaged
    assert failure_report.parse(_sealed(wrong_types)) == {"message": "m"}  # sealed, yet still checked
    for junk in (b"[1, 2]", b"{}", b"not json", b"{" + b" " * failure_report.MAX_BYTES + b"}"):
        for raw in (junk, _sealed(junk)):
            with pytest.raises(ValueError):
                failure_report.parse(raw)
    huge = failure_report.encode({"rank": 0, "type": "E", "message": "m", "traceback": "x" * (1 << 20)})
    assert len(huge) <= failure_report.MAX_BYTES and failure_report.parse(huge)["traceback"].endswith("x")


@pytest.mark.parametrize("while_", ["running", "waiting for the other node"])
def test_ctrl_c_is_one_line_and_exit_130(tmp_path, while_: str) -> None:
    """Paper cut (issue 36, 12): Ctrl-C was "the job failed ... launcher got signal 2", exit 1;
    torchrun and shells expect 130 and one line."""
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import time, torch.distributed as dist\n"
        "dist.init_process_group('fsdist')\n"
        "if dist.get_rank() == 0:\n"
        "    print('ready', flush=True)  # (one line: two ranks' prints may interleave)\n"
        "time.sleep(120)\n"
    )
    nodes = ["--nnodes", "2"] if while_ != "running" else []
    command = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "2", *nodes, "--dir", str(tmp_path / "run")]
    proc = subprocess.Popen([*command, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if while_ == "running":
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    else:
        time.sleep(3)  # in the launchers' rendezvous: the second node never comes
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("fsdist run: interrupted (SIGINT)"), err
    assert "failed" not in err and "Traceback" not in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root (CI runs as root)")
def test_a_read_only_run_directory_is_one_line_not_a_traceback(tmp_path) -> None:
    """Paper cut (issue 36, 5): a read-only --dir was an OSError traceback from deep inside."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    script = tmp_path / "hello.py"
    script.write_text("print('hi')\n")
    launch = f"{sys.executable} -m fsdist run --nproc-per-node 1 --dir {run} {script}"
    inner = f"mount --bind {run} {run} && mount -o remount,bind,ro {run} && exec {launch}"
    done = subprocess.run(["unshare", "-m", "sh", "-c", inner], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Read-only file system" in lines[0] and f"--dir {run} must be one" in lines[0], lines


def test_two_launchers_given_the_same_node_rank_are_both_told_so(tmp_path) -> None:
    """Paper cut (issue 36, 3): two nodes without --node-rank were told of "two jobs" and of "a
    slot a live process already holds", never that both were node 0."""
    script = tmp_path / "hello.py"
    script.write_text("print('hi')\n")
    command = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "1", "--nnodes", "2"]
    command += ["--timeout", "60", "--dir", str(tmp_path / "run"), str(script)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "run" / ".launch" / "fsdist-rendezvous.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the first launcher holds node rank 0 in the forming generation
    second = subprocess.run(command, capture_output=True, text=True, timeout=60)
    _, first_err = first.communicate(timeout=60)
    for code, err in ((first.returncode, first_err), (second.returncode, second.stderr)):
        assert code == 1, err
        assert "rank 0 was given twice" in err and "--node-rank" in err and "Traceback" not in err, err
    # the failed generation poisons nothing: the same two nodes, numbered right, run in that directory
    nodes = [subprocess.Popen([*command[:-3], "--node-rank", str(n), *command[-3:]], stderr=subprocess.PIPE, text=True)
             for n in (0, 1)]  # fmt: skip
    for node in nodes:
        _, err = node.communicate(timeout=120)
        assert node.returncode == 0, err


def test_clean_after_a_killed_launcher_leaves_only_the_documented_files(tmp_path) -> None:
    """Paper cut (issue 36, 11): after a launcher was killed, ``fsdist clean`` left its own
    generation (``.launch/gen-*``) behind."""
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import time, torch.distributed as dist\ndist.init_process_group('fsdist')\n"
        "if dist.get_rank() == 0:\n    print('ready', flush=True)  # (one line: two ranks' prints may interleave)\n"
        "time.sleep(120)\n"
    )
    run = tmp_path / "run"
    command = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "2", "--dir", str(run), str(script)]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert launcher.stdout is not None and launcher.stdout.readline().strip() == "ready"
    os.killpg(launcher.pid, signal.SIGKILL)  # the launcher, as a lost node would lose it
    launcher.wait(timeout=30)
    # its ranks (sessions of their own) go with it: they trained on, orphaned, and clean refused
    deadline = time.monotonic() + 30
    while _running(str(script)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(str(script)), "the ranks outlived their launcher"
    time.sleep(0.5)  # (the ranks' exits reach /proc)
    cleaned = subprocess.run([sys.executable, "-m", "fsdist", "clean", str(run)], capture_output=True, text=True)
    assert cleaned.returncode == 0, cleaned.stderr
    assert ".launch/gen-" in cleaned.stdout, cleaned.stdout
    left = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    assert left == [".launch", ".launch/fsdist-rendezvous.json", ".launch/rounds", "fsdist-rendezvous.json"], left


def test_a_failure_is_reported_with_its_traceback_only_where_its_rank_did_not_print_it(capsys) -> None:
    """Paper cut (issue 36, 13): a failing rank's traceback was printed twice on its own node,
    by the rank and again in its launcher's summary."""
    from fsdist.cli.run_failures import report as _report

    failure = {"rank": 1, "exit_code": 1, "host": "n0", "type": "RuntimeError", "message": "boom",
               "traceback": "Traceback (most recent call last):\n  ...\nRuntimeError: boom\n"}  # fmt: skip
    _report(failure, "", range(0, 2))  # rank 1 ran here: its traceback is above already
    here = capsys.readouterr().err
    assert "the first failure was rank 1" in here and "RuntimeError: boom" in here and "Traceback" not in here
    _report(failure, "", range(2, 4))  # another node's rank: this output never showed it
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_a_launcher_waiting_for_other_nodes_says_which_ones(tmp_path) -> None:
    """Paper cut (issue 36, 15): fsdist run said nothing while it waited for late nodes."""
    script = tmp_path / "hello.py"
    script.write_text("print('hi')\n")
    command = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "1", "--nnodes", "3", "--node-rank", "1"]
    proc = subprocess.Popen(
        [*command, "--dir", str(tmp_path / "run"), str(script)], stderr=subprocess.PIPE, text=True
    )  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()  # (after LAUNCH_NOTE_SECONDS)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert line.startswith("fsdist run: waiting for the launchers of node(s) 0, 2 of 3"), line


def test_a_launcher_stopped_by_a_signal_is_named_on_the_other_nodes(capsys) -> None:
    """Paper cut (issue 36): Ctrl-C on one node was "the first failure was the launcher /
    launcher got signal 2" on the others, naming neither the node nor the signal."""
    from fsdist.cli.run_failures import report as _report
    from fsdist.cli.run_failures import signalled as _signalled
    from fsdist.job.liveness import hostname

    _report(_signalled([signal.SIGINT], 1), "", range(0, 2))  # as node 0 prints it
    err = capsys.readouterr().err
    assert err == f"fsdist run: the job failed; the first failure was the launcher of node 1 (on {hostname()}), "\
        "stopped by SIGINT\n", err  # fmt: skip


def test_a_second_job_in_the_directory_is_told_of_launchers_and_nodes_not_ranks(tmp_path) -> None:
    """Paper cut (issue 36, 5): the second job heard of "world size 1" and "rank 0" (the first job's
    one launcher) while its user had started 2 ranks; launchers given different --nnodes likewise."""
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import time, torch.distributed as dist\ndist.init_process_group('fsdist')\n"
        "if dist.get_rank() == 0:\n    print('ready', flush=True)\ntime.sleep(120)\n"
    )
    run = tmp_path / "run"
    base = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "2", "--dir", str(run)]
    first = subprocess.Popen([*base, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "ready"
        second = subprocess.run([*base, str(script)], capture_output=True, text=True, timeout=120)
        assert second.returncode == 1, second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert line.startswith("fsdist run: another job is running in this directory (generation "), line
        assert "1 node (--nnodes); the launcher of node 0 is pid" in line and "world size" not in line, line
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    other = tmp_path / "other"
    nodes = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "1", "--dir", str(other)]
    waiting = subprocess.Popen([*nodes, "--nnodes", "2", "--node-rank", "0", str(script)], stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while not (other / ".launch" / "fsdist-rendezvous.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    late = subprocess.run([*nodes, "--nnodes", "3", "--node-rank", "1", str(script)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    _, waiting_err = waiting.communicate(timeout=120)
    for code, err in ((late.returncode, late.stderr), (waiting.returncode, waiting_err)):
        assert code == 1 and "the launchers disagree on --nnodes" in err and "world size" not in err, err


def test_one_failure_prints_one_traceback_and_a_line_per_rank_it_stopped(tmp_path) -> None:
    """Paper cut (issue 36, 13): one failing rank printed ~120 lines: its traceback through the
    launcher's own frames, a log line per rank that its group broke, and every other rank's
    PeerFailedError traceback."""
    script = tmp_path / "fails.py"
    script.write_text(
        "import torch, torch.distributed as dist\ndist.init_process_group('fsdist')\ndist.barrier()\n"
        "if dist.get_rank() == 1:\n    raise ValueError('rank 1 fails on purpose')\ndist.all_reduce(torch.ones(3))\n"
    )
    command = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "4", "--dir", str(tmp_path / "run")]
    done = subprocess.run([*command, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[:4] == [
        "[rank1]: Traceback (most recent call last):",
        f'[rank1]:   File "{script}", line 5, in <module>',
        "[rank1]:     raise ValueError('rank 1 fails on purpose')",
        "[rank1]: ValueError: rank 1 fails on purpose",
    ], lines
    stopped = [line for line in lines[4:] if line.startswith("[rank")]
    # the others, each in one line, if they got to fail before the launcher stopped them
    assert all("PeerFailedError" in line and "(stopped because another rank failed)" in line for line in stopped)
    assert lines[-2:] == ["fsdist run: the job failed; the first failure was rank 1 (exit code 1 on "
                          f"{os.uname().nodename})", "ValueError: rank 1 fails on purpose"], lines  # fmt: skip
    assert len(lines) <= 4 + 3 + 2 and "broke" not in done.stderr, lines


def test_nodes_may_start_different_numbers_of_ranks(tmp_path) -> None:
    """Paper cut (issue 36, 4): --nproc-per-node 2 and 1 on two nodes gave ~80 lines each, ending
    in "a job of world size 2 ... this rank was started with world size 4"; torchrun allows it."""
    script = tmp_path / "who.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\ndist.init_process_group('fsdist')\n"
        "x = torch.ones(1)\ndist.all_reduce(x)\n"
        "print(f\"rank {dist.get_rank()}/{dist.get_world_size()} local {os.environ['LOCAL_RANK']}/"
        "{os.environ['LOCAL_WORLD_SIZE']} node {os.environ['GROUP_RANK']} sum {x.item()}\", flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    base = [sys.executable, "-m", "fsdist", "run", "--nnodes", "2", "--dir", str(tmp_path / "run")]
    nodes = [
        subprocess.Popen([*base, "--nproc-per-node", str(nproc), "--node-rank", str(node), str(script)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node, nproc in ((0, 2), (1, 1))
    ]  # fmt: skip
    outputs = [node.communicate(timeout=120) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err
    said = [sorted(re.findall(r"rank \d/\d local \d/\d node \d sum [\d.]+", out)) for out, _ in outputs]
    # (two ranks print into one pipe: their lines may interleave, "...3.0rank 1/3 ...")
    assert said[0] == ["rank 0/3 local 0/2 node 0 sum 3.0", "rank 1/3 local 1/2 node 0 sum 3.0"], outputs[0][0]
    assert said[1] == ["rank 2/3 local 0/1 node 1 sum 3.0"], outputs[1][0]


def _running(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


def test_a_peer_failure_torch_wrapped_is_still_one_line() -> None:
    """Paper cut (issue 36, 13), as a newcomer met it: under DDP, the others' PeerFailedError
    arrived wrapped by torch ("Got the following error when running the callback: ..."), and
    each printed a 30-line traceback."""
    from fsdist.cli.run_rank import _consequence
    from fsdist.errors import GroupBrokenError, PeerFailedError

    wrapped = RuntimeError(
        "Got the following error when running the callback: PeerFailedError: rank 2, operation #10 'all_reduce': "
        "the group was aborted: rank 1 died\n\nAt:\n  /x.py(3): f\n"
    )
    assert _consequence(wrapped) == ("PeerFailedError", "rank 2, operation #10 'all_reduce': the group was aborted: "
                                     "rank 1 died")  # fmt: skip
    assert _consequence(GroupBrokenError("g")) == ("GroupBrokenError", "g")
    try:
        try:
            raise PeerFailedError("rank 1 died")
        except PeerFailedError as inner:
            raise ValueError("the script's own") from inner
    except ValueError as chained:
        assert _consequence(chained) == ("PeerFailedError", "rank 1 died")
    assert _consequence(ValueError("rank 1 fails on purpose")) is None


def test_the_launcher_sets_one_omp_thread_per_rank_unless_told(tmp_path) -> None:
    """Found by a newcomer: 4 ranks under fsdist run ran a DDP step 15x slower than under torchrun,
    which sets OMP_NUM_THREADS=1 for several ranks per node."""
    script = tmp_path / "omp.py"
    script.write_text("import os\nprint(f\"OMP={os.environ.get('OMP_NUM_THREADS')}\", flush=True)\n")  # (one write)
    command = [sys.executable, "-m", "fsdist", "run", "--dir", str(tmp_path / "run")]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    for nproc, user, expected in (("2", None, "1"), ("2", "3", "3"), ("1", None, "None")):
        run_env = env if user is None else {**env, "OMP_NUM_THREADS": user}
        done = subprocess.run([*command, "--nproc-per-node", nproc, str(script)], capture_output=True, text=True,
                              env=run_env, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        # (two ranks print into one pipe: lines may interleave)
        assert re.findall(r"OMP=(None|\d+)", done.stdout) == [expected] * int(nproc), done.stdout


def test_when_only_consequences_were_recorded_the_report_says_so(capsys) -> None:
    """Found by a newcomer: after node 1's launcher was killed with SIGKILL, node 0 said "the first
    failure was rank 1", a rank whose own line said it stopped because another rank failed."""
    from fsdist.cli.run_failures import report as _report

    failure = {"rank": 1, "exit_code": 1, "host": "n0", "type": "PeerFailedError",
               "message": "rank 1, operation #921 'all_reduce': rank 2 (pid 8680 on n1) died"}  # fmt: skip
    _report(failure, "", range(0, 2))
    first, second = capsys.readouterr().err.strip().splitlines()
    assert first.startswith("fsdist run: the job failed; the first failure recorded was rank 1 (exit code 1 on n0), "
                            "which only stopped because another rank failed"), first  # fmt: skip
    assert second == "PeerFailedError: rank 1, operation #921 'all_reduce': rank 2 (pid 8680 on n1) died"


def test_ctrl_c_reaches_a_launcher_that_inherited_it_ignored_and_blocked(tmp_path) -> None:
    """A launcher started from a script in the background inherits SIGINT ignored, or blocked:
    it sat in the launchers' rendezvous through Ctrl-C (seen in a full run of the suite)."""

    def ignore_and_block() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

    script = tmp_path / "hello.py"
    script.write_text("print('hi')\n")
    command = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "1", "--nnodes", "2", "--dir",
               str(tmp_path / "run"), str(script)]  # fmt: skip
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=ignore_and_block)
    deadline = time.monotonic() + 60
    while not (tmp_path / "run" / ".launch" / "fsdist-rendezvous.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # in the launchers' rendezvous: the second node never comes
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted (SIGINT)" in err, err
