"""fsdist's own tensor work runs on one OpenMP thread, and nobody else's thread count changes.

Each case runs in a fresh interpreter whose process-wide default is set to 3 threads from a
throwaway thread (torch caps OMP_NUM_THREADS at the core count), so it differs from fsdist's
setting (1) on any machine, and the main thread has not set itself up yet.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

_DEFAULT_OF_THREE = textwrap.dedent(
    """
    import threading, torch
    _t = threading.Thread(target=torch.set_num_threads, args=(3,))
    _t.start(); _t.join()
    """
)


def _run(body: str, tmp_path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    script = _DEFAULT_OF_THREE + textwrap.dedent(body).replace("DIR", str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_user_threads_keep_torchs_default_after_init(tmp_path):
    """torch.set_num_threads on the worker would store 1 as every new thread's default (and the
    main thread's, if it had run no parallel work yet)."""
    out = _run(
        """
        import threading, torch, torch.distributed as dist
        import fsdist
        dist.init_process_group("fsdist", init_method="file://DIR/init", rank=0, world_size=1)
        x = torch.ones(1 << 20)
        dist.all_reduce(x)
        work = dist.all_reduce(x, async_op=True)  # (world 1: the worker may run it)
        work.wait()
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start(); t.join()
        print(torch.get_num_threads(), seen[0])
        dist.destroy_process_group()
        """,
        tmp_path,
    )
    assert out == ["3", "3"]


def test_limits_apply_to_the_calling_thread_only(tmp_path):
    out = _run(
        """
        import threading, torch
        from fsdist.c10d.intraop import limit_this_thread, limited
        with limited(1):
            inside = torch.get_num_threads()
        after = torch.get_num_threads()
        seen = []
        def worker():
            limit_this_thread(1)
            seen.append(torch.get_num_threads())
        t = threading.Thread(target=worker); t.start(); t.join()
        fresh = []
        t = threading.Thread(target=lambda: fresh.append(torch.get_num_threads())); t.start(); t.join()
        print(inside, after, seen[0], fresh[0], torch.get_num_threads())
        """,
        tmp_path,
    )
    assert out == ["1", "3", "1", "3", "3"]
