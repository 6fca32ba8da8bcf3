"""The one multi-process harness every test uses: real rank processes, many cases per spawn.

Starting a rank costs 1–3 s (spawn + ``import torch``), so a ``RankPool`` spawns N ranks once,
forms one fsdist job over a fresh temporary directory, and then runs test cases in it: the
parent sends ``(function, args)`` to every rank, each rank runs ``function(*args)`` and sends
back its result or its traceback. Every case has a deadline; on a hang each rank first dumps
the stacks of all its threads (faulthandler), then the pool is killed and the case fails.
fcntl locks belong to processes, which is why these are processes and not threads.
"""

from __future__ import annotations

import faulthandler
import importlib
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

CASE_TIMEOUT = float(os.environ.get("FSDIST_TEST_CASE_TIMEOUT", "120"))
#: fsdist's own group timeout inside tests: shorter than the case timeout, so fsdist's own
#: error (naming rank, op and sequence number) wins over the harness's kill.
GROUP_TIMEOUT = CASE_TIMEOUT / 2


class RankError(AssertionError):
    """A case raised in at least one rank; the message holds every rank's traceback."""


class RankPool:
    """``world_size`` live rank processes in one fsdist job, ready to run cases."""

    def __init__(
        self,
        world_size: int,
        init: bool = True,
        env: dict[str, str] | None = None,
        group_timeout: float = GROUP_TIMEOUT,
        mount_tmpfs_size: str | None = None,
        directories: list[str] | None = None,
        init_method: str = "fsdist",
        nodes: tuple[int, ...] | None = None,
    ) -> None:
        """``mount_tmpfs_size`` (root only): run in a tmpfs of that size, to test a full disk.
        ``directories``: each rank's path to the (existing) run directory, e.g. the same folder
        through two mounts ("two nodes"); the first is the one checked and removed at the end.
        ``init_method``: how the ranks form the group, one of INIT_METHODS.
        ``nodes``: simulated nodes, as ranks per node (``(3, 1)``: ranks 0–2 on node 0, rank 3 on
        node 1): each node's ranks get its FSDIST_NODE_ID and a node-local directory of its own
        (``node<k>`` in a fresh folder on /dev/shm: memory, as by default), as on machines of
        their own."""
        if init_method not in INIT_METHODS:
            raise ValueError(f"init_method {init_method!r}: expected one of {sorted(INIT_METHODS)}")
        self.world_size = world_size
        self.init_method = init_method
        paths = directories or [tempfile.mkdtemp(prefix=f"fsdist-test-w{world_size}-")] * world_size
        self.directory = paths[0]
        self._mounted = False
        if mount_tmpfs_size:
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={mount_tmpfs_size},mode=0700", "tmpfs", self.directory],
                check=True,
            )
            self._mounted = True
        port = _free_port() if init_method == "tcp" else 0
        rank_envs = [dict(env or {}) for _ in range(world_size)]
        self.node_dirs: list[str] = []
        self._node_root: str | None = None
        if nodes is not None:
            if sum(nodes) != world_size:
                raise ValueError(f"nodes {nodes} do not hold {world_size} ranks")
            node_of = [node for node, count in enumerate(nodes) for _ in range(count)]
            shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
            self._node_root = tempfile.mkdtemp(prefix="fsdist-test-nodes-", dir=shm)
            self.node_dirs = [os.path.join(self._node_root, f"node{node}") for node in range(len(nodes))]
            for path in self.node_dirs:
                os.mkdir(path, 0o700)
            for rank, node in enumerate(node_of):
                rank_envs[rank].update(FSDIST_NODE_ID=f"node{node}", FSDIST_TEST_NODE_DIR=self.node_dirs[node])
        ctx = mp.get_context("spawn")
        self._conns = []
        self.processes = []
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_rank_main,
                args=(rank, world_size, paths[rank], child, init and init_method, rank_envs[rank], group_timeout, port),
                daemon=True,
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self.processes.append(proc)
        self.broken = False
        self._collect("startup", CASE_TIMEOUT)

    def run(self, function: Callable[..., Any], *args: Any, timeout: float = CASE_TIMEOUT) -> list[Any]:
        """Run ``function(*args)`` in every rank; return the per-rank results (rank order)."""
        return self.run_each(function, [args] * self.world_size, timeout=timeout)

    def run_each(
        self,
        function: Callable[..., Any],
        per_rank_args: list[tuple[Any, ...]],
        timeout: float = CASE_TIMEOUT,
        deaths_expected: bool = False,
    ) -> list[Any]:
        """Like ``run``, with each rank's own arguments.

        With ``deaths_expected`` a rank that exits gives ``None`` instead of failing the case
        (fault-injection tests); the pool is then broken and must not be reused.
        """
        name = self.start_each(function, per_rank_args, timeout)
        return self.results(name, timeout, deaths_expected)

    def start_each(
        self, function: Callable[..., Any], per_rank_args: list[tuple[Any, ...]], timeout: float = CASE_TIMEOUT
    ) -> str:
        """Start ``function`` in every rank and return at once, so the test can act while the
        ranks run (kill one, say); ``results`` then waits for them. Returns the case's name."""
        if self.broken:
            raise RuntimeError("this pool is broken; make a new one")
        name = f"{function.__module__}:{function.__qualname__}"
        for conn, args in zip(self._conns, per_rank_args, strict=True):
            conn.send(("call", name, args, timeout))
        return name

    def results(self, what: str, timeout: float = CASE_TIMEOUT, deaths_expected: bool = False) -> list[Any]:
        """Every rank's answer to the case started last (see ``run_each`` for ``deaths_expected``)."""
        return self._collect(what, timeout, deaths_expected)

    def _collect(self, what: str, timeout: float, deaths_expected: bool = False) -> list[Any]:
        deadline = time.monotonic() + timeout + 5
        results: list[Any] = [None] * self.world_size
        errors: dict[int, str] = {}
        for rank, conn in enumerate(self._conns):
            remaining = max(0.0, deadline - time.monotonic())
            if not conn.poll(remaining):
                self.kill(dump=True)
                raise TimeoutError(f"{what}: rank {rank} gave no answer within {timeout:.0f} s (stacks dumped above)")
            try:
                status, value = conn.recv()
            except EOFError:
                if deaths_expected:
                    self.broken = True
                    continue
                self.kill()
                raise RankError(f"{what}: rank {rank} died (exit code {self.processes[rank].exitcode})") from None
            if status == "ok":
                results[rank] = value
            else:
                errors[rank] = value
        if errors:
            self.broken = True  # a failed collective may leave the group broken: start afresh
            self.kill()
            text = "\n".join(f"--- rank {rank} ---\n{tb}" for rank, tb in sorted(errors.items()))
            raise RankError(f"{what} raised in rank(s) {sorted(errors)}:\n{text}")
        return results

    def close(self) -> list[str]:
        """Destroy the process group in every rank, join them, and check nothing was left.

        Returns what the directory held afterwards (before it is removed)."""
        self.ask_to_close()
        return self.finish_close()

    def ask_to_close(self) -> None:
        """Tell every rank to destroy its group and exit (``finish_close`` waits for them): the
        session's pools close side by side, not one after another (~2 s each)."""
        if not self.broken:
            for conn in self._conns:
                conn.send(("exit", "", (), CASE_TIMEOUT))

    def finish_close(self) -> list[str]:
        if self.broken:
            self.kill()
            return []
        try:
            self._collect("shutdown", CASE_TIMEOUT)
            for proc in self.processes:
                proc.join(10)
            remaining = left_in(self.directory)
            remaining += [f"{os.path.basename(d)}/{n}" for d in self.node_dirs for n in left_in(d)]
        finally:
            self.kill()
        leftovers = [n for n in remaining if n != "fsdist-rendezvous.json"]
        if leftovers:
            raise AssertionError(f"destroy_process_group left files behind: {leftovers}")
        return remaining

    def kill(self, dump: bool = False) -> None:
        """Stop every rank now (after asking for a stack dump when ``dump``); remove the directory."""
        self.broken = True
        if dump:
            for proc in self.processes:
                if proc.is_alive() and proc.pid:
                    os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(1.0)
        for proc in self.processes:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        for conn in self._conns:
            conn.close()
        if self._mounted:
            subprocess.run(["umount", "-l", self.directory], check=False)
            self._mounted = False
        shutil.rmtree(self.directory, ignore_errors=True)
        if self._node_root is not None:
            shutil.rmtree(self._node_root, ignore_errors=True)


#: How a pool's ranks may form their group: each is a way users start fsdist jobs.
INIT_METHODS = {
    "fsdist": "init_method='fsdist://DIR'",
    "file": "init_method='file://DIR/initfile' (torch's FileStore; files beside it)",
    "env": "no init_method (env://) with FSDIST_DIR, RANK and WORLD_SIZE set, as under `fsdist run`",
    "tcp": "no init_method (env://) with MASTER_ADDR/MASTER_PORT: torch's TCPStore; files node-local "
    "(or in FSDIST_DIR if the case sets it)",
    "store": "store= a user's FileStore (a HashStore for one rank)",
}


def unshare_works() -> bool:
    """Whether ``unshare -n`` can make a network namespace here (root, or user namespaces)."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


def left_in(directory: str) -> list[str]:
    """What ``directory`` holds, this user's node-local folder (``fsdist-<uid>``, which fsdist makes
    once and keeps: files/trust.py node_directory) looked into rather than listed itself."""
    own = f"fsdist-{os.geteuid()}"
    names = sorted(n for n in os.listdir(directory) if n != own)
    if os.path.isdir(os.path.join(directory, own)):
        names += [f"{own}/{n}" for n in sorted(os.listdir(os.path.join(directory, own)))]
    return names


def _free_port() -> int:
    import socket  # the test's own TCPStore route; fsdist itself never opens a socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def init_group(method: str, rank: int, world_size: int, directory: str, timeout: float, port: int = 0) -> None:
    """Form the world group in this rank the way ``method`` (see INIT_METHODS) does."""
    from datetime import timedelta

    import torch.distributed as dist

    import fsdist  # noqa: F401 - registers the backend

    kwargs: dict[str, Any] = {"rank": rank, "world_size": world_size, "timeout": timedelta(seconds=timeout)}
    # node-local directories stay inside the test's (a simulated node's: its own)
    os.environ["FSDIST_LOCAL_DIR"] = os.environ.get("FSDIST_TEST_NODE_DIR") or directory
    if method == "fsdist":
        dist.init_process_group("fsdist", init_method=f"fsdist://{directory}", **kwargs)
    elif method == "file":
        dist.init_process_group("fsdist", init_method=f"file://{directory}/initfile", **kwargs)
    elif method == "env":
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(name, None)
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), FSDIST_DIR=directory)
        dist.init_process_group("fsdist", timeout=kwargs["timeout"])
    elif method == "tcp":  # torch's own env:// (FSDIST_ENV_INIT=torch matters only if FSDIST_DIR is set)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), FSDIST_ENV_INIT="torch")
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
        dist.init_process_group("fsdist", timeout=kwargs["timeout"])
    else:
        store = dist.HashStore() if world_size == 1 else dist.FileStore(f"{directory}/storefile", world_size)
        dist.init_process_group("fsdist", store=store, **kwargs)


def _rank_main(
    rank: int, world_size: int, directory: str, conn: Any, init: str | bool, env: dict[str, str],
    group_timeout: float, port: int,
) -> None:  # fmt: skip
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ.update(env)
    os.environ["FSDIST_TEST_DIR"] = directory
    try:
        if init:
            init_group(str(init), rank, world_size, directory, group_timeout, port)
        conn.send(("ok", None))
    except BaseException:  # noqa: BLE001 - every error goes back to the parent
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        kind, name, args, timeout = conn.recv()
        if kind == "exit":
            try:
                if init:
                    import torch.distributed as dist

                    dist.destroy_process_group()
                conn.send(("ok", None))
            except BaseException:  # noqa: BLE001 - every error goes back to the parent
                conn.send(("error", traceback.format_exc()))
                return
            if init:  # a pool without a group may be testing what happens at a normal exit
                _exit_now()
            return
        faulthandler.dump_traceback_later(timeout, exit=False)
        try:
            module, qualname = name.split(":")
            function = getattr(importlib.import_module(module), qualname)
            conn.send(("ok", function(*args)))
        except BaseException:  # noqa: BLE001 - every error goes back to the parent
            conn.send(("error", traceback.format_exc()))
        finally:
            faulthandler.cancel_dump_traceback_later()
        sys.stdout.flush()


def torchs_import_folder() -> Any:
    """The TemporaryDirectory torch <= 2.7 makes at the import of torch.distributed.nn.jit and
    removes only at interpreter exit (None where this process has none)."""
    instantiator = sys.modules.get("torch.distributed.nn.jit.instantiator")
    return getattr(instantiator, "_TEMP_DIR", None)


def _exit_now() -> None:
    """End a rank whose pool's group is destroyed without finalising the interpreter.

    Tearing down a Python that imported torch takes ~0.5 s of CPU; the session's pools end
    together (~80 ranks: ~25 s of the suite on 2 cores). Nothing is lost: exit handlers are
    skipped (fsdist's own would only clean up after a rank that never left its job, and
    ``finish_close`` fails on any file left behind), stdio is flushed, and coverage, when it
    measures, saves its data here as it would at a normal exit.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    held = torchs_import_folder()  # (its finalizer at exit is what os._exit skips)
    if held is not None:
        held.cleanup()
    if "coverage" in sys.modules:
        import coverage

        current = coverage.Coverage.current()
        if current is not None:
            current.stop()
            current.save()
    os._exit(0)


class Pools:
    """Session-wide cache of one live pool per world size; broken pools are replaced."""

    def __init__(self) -> None:
        self._pools: dict[tuple[int, str, tuple[int, ...] | None], RankPool] = {}

    def get(self, world_size: int, init_method: str = "fsdist", nodes: tuple[int, ...] | None = None) -> RankPool:
        """The live pool of ``world_size`` ranks formed by ``init_method`` (on simulated ``nodes``)."""
        key = (world_size, init_method, nodes)
        pool = self._pools.get(key)
        if pool is None or pool.broken:
            if pool is not None:
                pool.close()  # a broken pool: kill what is left and remove its directory
            pool = self._pools[key] = RankPool(world_size, init_method=init_method, nodes=nodes)
        return pool

    def close_all(self) -> None:
        errors = []
        for pool in self._pools.values():
            pool.ask_to_close()
        for pool in self._pools.values():
            try:
                pool.finish_close()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
        self._pools.clear()
        if errors:
            raise errors[0]


def run_forked(target: Callable[..., Any], per_process_args: list[tuple[Any, ...]], timeout: float = 120) -> list[int]:
    """Run ``target(*args)`` in one forked process per entry (lock tests: no torch import cost);
    return the exit codes."""
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=target, args=args) for args in per_process_args]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return [proc.exitcode for proc in procs]  # type: ignore[misc]
