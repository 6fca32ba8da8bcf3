"""torch's own distributed test suite, ``DistributedTest._DistTestBase``, run on fsdist.

This is our small replacement for torch's two driver files, which are not in the wheel:

- ``test/run_test.py`` (``test_distributed()`` and ``DISTRIBUTED_TESTS_CONFIG["gloo"]``) runs
  ``distributed/test_distributed_spawn.py`` once per init mode with ``BACKEND=gloo``,
  ``WORLD_SIZE=3`` on a machine without GPUs, ``TEMP_DIR`` a fresh directory holding ``barrier/``
  and ``test_dir/``, and, in its init-file mode, ``INIT_METHOD=file://<TEMP_DIR>/shared_init_file``
  (torch's newer run_test.py no longer sets ``INIT_METHOD``; we keep the init-file mode because it is
  the one in which ``test_barrier_timeout_global`` is selected).
- ``test/distributed/test_distributed_spawn.py`` builds the test class
  ``TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase)`` whose ``setUp``
  spawns the ranks; we build the same class below.

Every rank then calls ``dist.init_process_group(init_method="file://<per-test file>", backend=BACKEND)``
(``TestDistBackend._run``): torch's own default ``file://`` init, i.e. a c10d ``FileStore`` that the
backend must accept.

Selection: ``distributed_test`` decides at import, from ``BACKEND`` in the environment, which tests
it skips (decorators such as ``skip_but_pass_in_sandcastle_if(BACKEND != "gloo", ...)``). We import
it with ``BACKEND=gloo``, so exactly the tests torch selects for Gloo run, and only then set the
module's ``BACKEND`` to the backend under test, which ``TestDistBackend._run`` passes to
``init_process_group``. Spawned ranks re-import this module (it holds the test class) and so repeat
the same two steps.

Environment: ``FSDIST_TORCH_SUITE_BACKEND`` (``fsdist``, or ``gloo`` for the baseline) and
``FSDIST_TORCH_SUITE_WORLD_SIZE`` (default 3, torch's own for Gloo without GPUs). torch's variables
(``BACKEND``, ``WORLD_SIZE``, ``TEMP_DIR``, ``INIT_METHOD``) are set only around the import and
for the duration of each test, so the rest of the pytest session never sees them.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import torch

#: the backend every rank initialises; the selection is always Gloo's
BACKEND_UNDER_TEST = os.environ.setdefault("FSDIST_TORCH_SUITE_BACKEND", "fsdist")
#: world size; torch's run_test.py uses 3 for Gloo when there is no GPU
WORLD_SIZE = os.environ.setdefault("FSDIST_TORCH_SUITE_WORLD_SIZE", "3")
#: "file" (torch's own init, the default) or "fsdist" (fsdist:// over the test's TEMP_DIR, to
#: tell a problem of the store route from one of the backend)
INIT = os.environ.setdefault("FSDIST_TORCH_SUITE_INIT", "file")

_TORCH_VARIABLES = ("BACKEND", "WORLD_SIZE", "TEMP_DIR", "INIT_METHOD")


def _torch_import_environment() -> dict[str, str]:
    """What run_test.py puts in the environment before test_distributed_spawn.py imports the module."""
    init_method = os.environ.get("INIT_METHOD", "")
    if not init_method.startswith("file://"):
        # a spawned rank inherits the per-test file:// URL from its parent's setUp; the parent
        # itself only needs the scheme right, since the module reads INIT_METHOD when imported
        init_method = "file://" + os.path.join(tempfile.gettempdir(), "fsdist-torch-suite-init-unused")
    return {"BACKEND": "gloo", "WORLD_SIZE": WORLD_SIZE, "INIT_METHOD": init_method}


def _import_distributed_test():
    saved = {name: os.environ.get(name) for name in _TORCH_VARIABLES}
    os.environ.update(_torch_import_environment())
    try:
        # test_distributed_spawn.py sets this before it imports the suite
        torch.backends.cuda.matmul.allow_tf32 = False
        from torch.testing._internal.distributed import distributed_test
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    distributed_test.BACKEND = BACKEND_UNDER_TEST
    if BACKEND_UNDER_TEST == "fsdist":
        # torch checks a backend's profiler events (`<backend>:<op>`, their input shapes) only for
        # the backends on these lists; fsdist's are checked as Gloo's are. (The CUDA list stays
        # Gloo's: its tests need a GPU, and fsdist's events of staged CUDA tensors are CPU events.)
        for checked in (
            distributed_test.PROFILING_SUPPORTED_BACKENDS,
            distributed_test.SEND_RECV_PROFILING_SUPPORTED_BACKENDS,
        ):
            checked.append(BACKEND_UNDER_TEST)
    return distributed_test


distributed_test = _import_distributed_test()


class TestDistBackendWithSpawn(distributed_test.TestDistBackend, distributed_test.DistributedTest._DistTestBase):
    """torch's TestDistBackendWithSpawn (test_distributed_spawn.py), with its environment scoped to each test."""

    def setUp(self) -> None:
        self._saved_environ = dict(os.environ)
        # what the ranks read at run time (os.environ["WORLD_SIZE"], os.environ["BACKEND"], ...)
        os.environ["BACKEND"] = BACKEND_UNDER_TEST
        os.environ["WORLD_SIZE"] = WORLD_SIZE
        # TestDistBackend.setUp makes a fresh TEMP_DIR (barrier/, test_dir/, init_dir/) under
        # TMPDIR and points TEMP_DIR and INIT_METHOD at it; the spawned ranks inherit both
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    @property
    def init_method(self) -> str:
        if INIT == "fsdist":
            directory = os.path.join(os.environ["TEMP_DIR"], "fsdist-run")
            os.makedirs(directory, exist_ok=True)
            return f"fsdist://{directory}"
        return super().init_method

    def tearDown(self) -> None:
        processes = list(self.processes)
        leftover = ""
        try:
            super().tearDown()  # removes TEMP_DIR, terminates the ranks
            for proc in processes:
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
                    proc.join(10)
        finally:
            file_name = getattr(self, "file_name", None)
            if file_name:
                # MultiProcessTestCase makes the file:// init file with delete=False and never
                # removes it; fsdist's run directory for a file:// job sits beside it, and stays
                # only when a rank is killed (torch terminates the ranks of a test that hangs)
                if os.path.exists(file_name):
                    os.unlink(file_name)
                run_directory = file_name + ".fsdist"
                if os.path.exists(run_directory):
                    leftover = run_directory
                    shutil.rmtree(run_directory, ignore_errors=True)
            os.environ.clear()
            os.environ.update(self._saved_environ)
        # every rank exited by itself (after destroy_process_group, or through sys.exit as torch's
        # skips and errors do): fsdist must have removed its run directory, at exit at the latest
        if leftover and processes and all(proc.exitcode is not None and proc.exitcode >= 0 for proc in processes):
            raise AssertionError(f"fsdist left its run directory {leftover} although no rank was killed")
