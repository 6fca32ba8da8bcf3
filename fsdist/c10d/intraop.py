"""OpenMP threads for fsdist's own tensor work (copies, reductions): per thread, nobody else's.

Several ranks share a machine's cores, and OpenMP workers spinning after each parallel copy or
``add_`` steal them from the peers (docs/design.md: a 1 MiB all_reduce on two cores took 2.6×
as long with them as with one thread). So the
group's worker thread, and a caller's thread while it runs an operation itself, use
``REDUCE_THREADS`` threads.

Not through ``torch.set_num_threads``: besides the calling thread's OpenMP setting it stores a
process-wide default that every thread adopts on its first parallel operation, so a worker
calling it left the user's main thread (if it had not run parallel work before
``init_process_group``) and every later thread single-threaded. OpenMP's own
``omp_set_num_threads`` changes the calling thread only; it is called here through the OpenMP
runtime torch loaded. Where torch runs on another parallel backend (no OpenMP runtime in the
process) nothing is changed.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

__all__ = ["SERIAL_BYTES", "limit_this_thread", "limited"]

#: An operation of fewer bytes (inputs and outputs) never reaches torch's intra-op threads: a
#: parallel_for splits its range only above at::internal::GRAIN_SIZE, 32768 elements. A caller
#: running such an operation itself skips ``limited`` (two ctypes calls into OpenMP, ~1-2 µs).
SERIAL_BYTES = 32 << 10

_RUNTIMES = ("libgomp", "libiomp5", "libomp")


@functools.cache
def _openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded (found among this process's mappings), or None."""
    torch.get_num_threads()  # loads and initialises it, if torch uses one
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if os.path.basename(path).startswith(_RUNTIMES):
            try:
                library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
                library.omp_set_num_threads.argtypes = [ctypes.c_int]
                library.omp_get_max_threads.restype = ctypes.c_int
            except (OSError, AttributeError):
                continue
            return library
    return None


def limit_this_thread(threads: int) -> None:
    """Let the calling thread's tensor operations use at most ``threads`` threads from now on."""
    openmp = _openmp()
    if openmp is None or threads <= 0:
        return
    torch.get_num_threads()  # torch's first-use setup of this thread first, or it undoes ours
    openmp.omp_set_num_threads(threads)


class limited:  # noqa: N801 - used as a function: ``with limited(threads):``
    """The calling thread's tensor operations use at most ``threads`` threads inside the block.

    A class, not a generator context manager: it wraps every small operation a caller runs
    itself, where contextlib's machinery cost ~1.5 µs.
    """

    __slots__ = ("_before", "_openmp", "_threads")

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._openmp: ctypes.CDLL | None = None
        self._before = 0

    def __enter__(self) -> None:
        openmp = _openmp()
        if openmp is None or self._threads <= 0:
            return
        before = torch.get_num_threads()  # (also torch's first-use setup of this thread)
        if before > self._threads:
            openmp.omp_set_num_threads(self._threads)
            self._openmp, self._before = openmp, before

    def __exit__(self, *exc: object) -> None:
        if self._openmp is not None:
            self._openmp.omp_set_num_threads(self._before)
