"""After installing fsdist, `import torch` alone makes the backend available (entry point)."""

from __future__ import annotations

import os
import subprocess
import sys

CHECK = """
import sys, torch, torch.distributed as dist
assert "fsdist" in sys.modules, "the torch.backends entry point did not load fsdist"
dist.init_process_group("fsdist", init_method="fsdist://{dir}", rank=0, world_size=1)
t = torch.ones(3)
dist.all_reduce(t)
dist.destroy_process_group()
print("ok", t.tolist())
"""


def test_backend_is_there_without_import_fsdist(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECK.format(dir=tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "ok [1.0, 1.0, 1.0]" in result.stdout


def test_autoload_can_be_switched_off() -> None:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    code = "import sys, torch; print('fsdist' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


def test_a_failing_hook_never_breaks_import_torch(monkeypatch) -> None:
    from fsdist.c10d import autoload as _autoload

    monkeypatch.setitem(sys.modules, "fsdist.c10d.registration", None)  # its import now raises ImportError
    _autoload.hook()  # must not raise
