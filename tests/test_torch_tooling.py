"""torch's own tools see fsdist as they see Gloo: profiler traces, ``_get_backend`` and
``device_id=``, ``torch.distributed._dist2``, fsdist as torch's default for a device, and
``monitored_barrier``'s answer (who never arrived)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from fsdist.c10d import compat

from harness import RankPool, unshare_works
from in_rank import tooling as cases

# ---- profiler ---------------------------------------------------------------------------------

SYNC_CALLS = {  # the user scope around each call → the fsdist events inside it, per rank
    "call:all_reduce": (["fsdist:all_reduce"], ["fsdist:all_reduce"]),
    "call:broadcast": (["fsdist:broadcast"], ["fsdist:broadcast"]),
    "call:all_gather": (["fsdist:all_gather"], ["fsdist:all_gather"]),
    "call:send_recv": (["fsdist:send"], ["fsdist:recv"]),
    "call:barrier": (["fsdist:barrier"], ["fsdist:barrier"]),
}


def _check_trace(rank: int, result: dict, shaped: bool) -> None:
    events, scopes = result["fsdist"], result["scopes"]
    names = [e["name"] for e in events]
    # one event per call: five synchronous ones, the token that lets rank 1 in, the async all_reduce
    expected = ["fsdist:all_reduce", "fsdist:broadcast", "fsdist:all_gather", "fsdist:send" if rank == 0 else
                "fsdist:recv", "fsdist:barrier"]  # fmt: skip
    expected += ["fsdist:all_reduce", "fsdist:send"] if rank == 0 else ["fsdist:recv", "fsdist:all_reduce"]
    assert sorted(names) == sorted(expected), names
    for scope, per_rank in SYNC_CALLS.items():
        start, end = scopes[scope]
        inside = [e["name"] for e in events if start <= e["ts"] and e["end"] <= end]
        # a synchronous call's event opens in the call and ends before the call returns
        assert inside == per_rank[rank], (scope, inside, events)
    for event in events:
        assert event["end"] >= event["ts"]
    if rank == 0:  # issued before the matmul, and it cannot complete before the matmul ended
        start, end = scopes["compute"]
        after_barrier = scopes["call:barrier"][1]
        (issued,) = [e for e in events if e["name"] == "fsdist:all_reduce" and e["ts"] >= after_barrier]
        assert issued["ts"] <= start and issued["end"] >= end, (issued, start, end)
    dims = {e["name"]: e["dims"] for e in events}
    if shaped:  # with record_shapes, each event lists its tensors' shapes, as Gloo's do
        assert [e["dims"] for e in events if e["name"] == "fsdist:broadcast"] == [[[cases.N]]]
        assert [e["dims"] for e in events if e["name"] == "fsdist:all_gather"] == [[[cases.N]]]
        assert sorted(e["dims"] for e in events if e["name"] == "fsdist:all_reduce") == [[[cases.N]], [[1 << 18]]]
        assert dims["fsdist:barrier"] in (None, [])
    else:
        assert all(not e["dims"] or e["dims"] == [[]] for e in events), events


@pytest.mark.parametrize("shaped", [True, False], ids=["with-shapes", "without-torchscript"])
def test_profiler_shows_one_fsdist_event_per_operation(pool_factory, tmp_path, shaped: bool) -> None:
    results = pool_factory(2).run(cases.profiled_operations, str(tmp_path), shaped)
    for rank, result in enumerate(results):
        assert result["value"] == [0.0, 2.0, 4.0] and result["async_value"] == 2.0
        _check_trace(rank, result, shaped)


def test_the_profiling_example_checks_its_trace(tmp_path) -> None:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "2", "--dir", str(tmp_path / "run"),
               os.path.join(repo, "examples", "profile_collectives.py")]  # fmt: skip
    traces = tmp_path / "traces"  # (missing: the example makes it)
    env = {**os.environ, "PROFILE_DIR": str(traces), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        trace = traces / f"trace-rank{rank}.json"
        assert f"rank {rank}: 15 fsdist events in {trace}" in result.stdout, result.stdout
        assert trace.stat().st_size > 0


# ---- the backend per device, device_id= ---------------------------------------------------------


def test_get_backend_answers_for_cpu_and_cuda(pool_factory) -> None:
    for answers in pool_factory(2).run(cases.backends_per_device):
        for group in ("world", "sub"):
            assert answers[group] == {
                "cpu_is_self": True, "cuda_is_self": True, "name": "fsdist", "splitting": False,
                "devices": ["cpu", "cuda"], "object_device": "cpu",
            }  # fmt: skip
        assert answers["default_device"] == "cpu"
        assert answers["meta"] == "No backend type associated with device type meta"


def test_init_with_device_id_takes_torchs_gpu_path() -> None:
    pool = RankPool(2, init=False)
    try:
        results = pool.run_each(cases.device_id_init, [(pool.directory, r, 2) for r in range(2)])
    finally:
        pool.close()
    for result in results:
        assert result == {"bound": "None", "backend": "fsdist", "value": [6.0] * 4, "sub_backend": "fsdist"}


# ---- what differs between torch releases (compat.py; make test-torch-versions runs the rest) ----


def test_the_premul_sum_factor_is_read_on_every_release() -> None:
    import torch
    import torch.distributed as dist

    for factor in (2.5, torch.tensor([3.0])):
        op = dist._make_nccl_premul_sum(factor)
        state = op.__getstate__()[1]  # the route of torch <= 2.10, which binds no ``factor``
        assert float(compat.premul_sum_factor(op)) == float(state) == float(factor)
        if hasattr(op, "factor"):
            assert float(op.factor) == float(factor)


def test_every_older_c10d_name_runs_fsdists_method() -> None:
    import torch.distributed as dist

    from fsdist.c10d.backend import ProcessGroupFsdist

    for older, current in compat.OLDER_METHOD_NAMES.items():
        assert hasattr(dist.ProcessGroup, older), f"this torch binds no {older}: is OLDER_METHOD_NAMES stale?"
        assert getattr(ProcessGroupFsdist, older) is getattr(ProcessGroupFsdist, current), older


def test_torchs_flight_recorder_hooks_no_fsdist_group() -> None:
    import torch.distributed as dist

    import fsdist  # noqa: F401 - registers

    c10d = dist.distributed_c10d
    if hasattr(c10d, "_maybe_attach_flight_recorder"):  # torch >= 2.15: every group depends on it
        assert "fsdist" in c10d._FR_SELF_RECORDING_BACKENDS


# ---- torch.distributed._dist2 -----------------------------------------------------------------


@pytest.mark.skipif(not compat.has_dist2(), reason="this torch has no torch.distributed._dist2 (2.10-2.13 have it)")
@pytest.mark.parametrize("outer_first", [False, True], ids=["nested-first", "world-first"])
def test_dist2_groups_run_beside_the_world_group(outer_first: bool) -> None:
    pool = RankPool(2, init=False)
    try:
        results = pool.run_each(cases.dist2_groups, [(pool.directory, r, 2, outer_first) for r in range(2)])
    finally:
        left = pool.close()
    assert left == ["fsdist-rendezvous.json"]
    for result in results:
        # (1 + 2) in the first group, x2 in the second and x2 again in the world group
        assert result["value"] == [12.0] * 3 and result["y"] == [2.0, 2.0]
        assert result["current"] and result["name"] == "fsdist"
        assert result["meta"] == "fsdist serves cpu and cuda tensors, not meta"


def test_a_second_rendezvous_never_replaces_the_running_group_of_its_own_process(pool_factory) -> None:
    pool = pool_factory(2)
    for answer in pool.run(cases.second_rendezvous_in_own_directory, pool.directory):
        assert answer.startswith(f"this process already runs an fsdist group in {os.path.realpath(pool.directory)}")
        assert answer.endswith("| [2.0, 2.0]"), answer


# ---- fsdist as torch's default for a device ----------------------------------------------------

MESH_SCRIPT = """
import os, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

def inet_sockets():
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    found = 0
    for table in ("tcp", "tcp6", "udp", "udp6"):
        with open(f"/proc/self/net/{table}") as f:
            found += sum(line.split()[9] in mine for line in list(f)[1:])
    return found

mesh = init_device_mesh("cpu", (2,))          # no group yet: torch picks the CPU default
x = torch.ones(3) * (dist.get_rank() + 1)
dist.all_reduce(x, group=mesh.get_group())
# (the world group's backend name is "undefined" to torch, as with Gloo: none was named)
print(f"rank {dist.get_rank()}: backend={dist.group.WORLD.name()} mesh={mesh.get_group().name()} "
      f"value={x.tolist()} inet_sockets={inet_sockets()}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.skipif(not unshare_works(), reason="unshare -n needs root (or user namespaces) and util-linux")
def test_default_for_cpu_makes_a_device_mesh_with_no_port(tmp_path) -> None:
    script = tmp_path / "mesh.py"
    script.write_text(textwrap.dedent(MESH_SCRIPT))
    env = {**os.environ, "FSDIST_DEFAULT_FOR": "cpu", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "2", "--dir", str(tmp_path / "run"),
               str(script)]  # fmt: skip
    result = subprocess.run(["unshare", "-n", *command], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert f"rank {rank}: backend=fsdist mesh=fsdist value=[3.0, 3.0, 3.0] inet_sockets=0" in result.stdout, (
            result.stdout
        )


def test_make_default_names_the_devices_it_serves() -> None:
    import torch.distributed as dist

    import fsdist

    saved = dict(dist.Backend.default_device_backend_map)
    try:
        fsdist.make_default(("cpu",))
        assert dist.Backend.default_device_backend_map["cpu"] == "fsdist"
        assert dist.distributed_c10d.get_default_backend_for_device("cpu") == "fsdist"
        with pytest.raises(ValueError, match=r"fsdist can be the default for cpu and cuda, not \['xpu'\]"):
            fsdist.make_default(("cpu", "xpu"))
    finally:
        dist.Backend.default_device_backend_map.clear()
        dist.Backend.default_device_backend_map.update(saved)


def test_a_bad_default_for_value_warns_at_import_torch() -> None:
    code = "import torch, torch.distributed as dist; print(dist.Backend.default_device_backend_map['cpu'])"
    good = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "FSDIST_DEFAULT_FOR": "cpu"})  # fmt: skip
    assert good.stdout.strip() == "fsdist", good.stderr
    bad = subprocess.run([sys.executable, "-W", "always", "-c", "import fsdist; " + code], capture_output=True,
                         text=True, env={**os.environ, "FSDIST_DEFAULT_FOR": "tpu"})  # fmt: skip
    assert bad.returncode == 0 and bad.stdout.strip() == "gloo", bad.stderr
    assert "FSDIST_DEFAULT_FOR='tpu' ignored: fsdist can be the default for cpu and cuda, not ['tpu']" in bad.stderr


# ---- monitored_barrier ------------------------------------------------------------------------


def test_monitored_barrier_names_who_never_arrived() -> None:
    pool = RankPool(4)
    try:
        first = pool.run(cases.monitored_barriers, 1)
        several = pool.run(cases.monitored_barrier_all_ranks, (1, 3))
        alone = pool.run(cases.monitored_barrier_zero_timeout)
    finally:
        pool.close()
    assert all(r["passed"] == "yes" for r in first)
    assert first[0]["error"].startswith("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms"), first[0]
    for rank in (2, 3):
        assert first[rank]["error"].startswith(
            f"Rank {rank} successfully reached monitoredBarrier, but received errors while waiting for send/recv "
            "from rank 0. Please check rank 0 logs for faulty rank."
        ), first[rank]
    assert "error" not in first[1]
    # every absent rank named, and only those (rank 2 came: its token of the earlier call is passed over)
    assert several[0] == "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 1000 ms", several
    assert several[2].startswith("Rank 2 successfully reached monitoredBarrier"), several
    assert alone[0].startswith("Rank 0 timed out in monitoredBarrier after 0 ms."), alone
