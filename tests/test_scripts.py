"""The repository's own scripts fail early and clearly where they cannot work."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_nfs_vm_refuses_a_folder_the_guest_would_hide_before_booting_anything(tmp_path) -> None:
    work = "/tmp/fsdist-nfs-vm-under-tmp"  # the guest mounts its own tmpfs over /tmp
    result = subprocess.run([str(REPO / "scripts/nfs-vm/run.sh"), work], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "which the VM covers with its own tmpfs" in result.stderr and "/var/tmp" in result.stderr
    assert "qemu" not in result.stdout + result.stderr  # refused before installing or booting anything
    subprocess.run(["rmdir", work], check=False)
