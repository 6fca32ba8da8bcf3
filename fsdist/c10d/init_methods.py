"""torch rendezvous handlers: ``fsdist://``, a port-free ``env://``, and a checked ``file://``.

``fsdist://DIR`` forms the job in the directory (rendezvous.py) and hands torch a
DirectoryStore. ``env://`` is torch's default when ``init_process_group`` gets no init_method:
torch's own handler then needs MASTER_ADDR/MASTER_PORT and a TCPStore. Where ``FSDIST_DIR`` is
set (``fsdist run``, torchrun's fsdist rendezvous, a SLURM script) there is a directory every rank
shares, so ``env://`` meets there instead, exactly like ``fsdist://``, and a script written for
torchrun runs unchanged without a port. ``FSDIST_ENV_INIT=torch`` restores torch's handler.

Wherever torch's handler does run, ``MASTER_PORT=0`` with several ranks fails at once: no peer
can find a port chosen by the kernel (torchrun's fsdist rendezvous advertises port 0 because it
serves no store), and torch would retry the connection for the whole timeout.

``file://PATH`` stays torch's FileStore, but for an fsdist group its file is first made this
user's (``O_EXCL``, mode 0600), or the one in place checked, in a folder nobody else can change:
in a shared sticky folder such as /tmp another user could otherwise create the file first, and
hold its lock so that every rank hangs in torch's constructor, or read the store.
"""

from __future__ import annotations

import os
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ..defaults import DEFAULT_TIMEOUT, ENV_DIR, ENV_ENV_INIT, ENV_SLURM_NTASKS, ENV_SLURM_PROCID
from ..errors import RendezvousError
from ..files.places import adopt_file, resolve_place
from ..job.generation import Generation, in_use_here
from ..job.rendezvous import rendezvous
from ..protocol import layout
from .store import DirectoryStore

__all__ = [
    "env_handler", "file_handler", "fsdist_rendezvous_handler", "guard_file_store", "open_store", "parse_url",
    "serves_env_init",
]  # fmt: skip

#: c10d keeps only the C++ half of a Python store alive: the Python half of every store handed
#: to torch is held here until its generation is left.
LIVE_STORES: list[DirectoryStore] = []


def open_store(generation: Generation, timeout: timedelta) -> DirectoryStore:
    """The key-value store of ``generation``, carrying the generation for the backend to find."""
    store = DirectoryStore(layout.store_dir(generation.directory), timeout)
    store.generation = generation
    LIVE_STORES.append(store)
    generation.on_leave.append(lambda: LIVE_STORES.remove(store))
    return store


def parse_url(url: str) -> tuple[str, int, int]:
    """``fsdist:///dir?rank=R&world_size=W`` (or env fallbacks) → (dir, rank, world size)."""
    parsed = urllib.parse.urlparse(url)
    query = dict(urllib.parse.parse_qsl(parsed.query))
    root = (parsed.netloc + parsed.path) or os.environ.get(ENV_DIR, "")
    if not root:
        raise RendezvousError(f"no directory in {url!r}: use fsdist:///path/to/dir or set {ENV_DIR}")
    rank = _first_int(query.get("rank"), os.environ.get("RANK"), os.environ.get(ENV_SLURM_PROCID), what="rank")
    world = _first_int(
        query.get("world_size"), os.environ.get("WORLD_SIZE"), os.environ.get(ENV_SLURM_NTASKS), what="world size"
    )
    return os.path.abspath(root), rank, world


def _first_int(*candidates: str | None, what: str) -> int:
    for value in candidates:
        if value not in (None, ""):
            return int(value)
    raise RendezvousError(
        f"fsdist rendezvous needs the {what}: pass it to init_process_group, or set RANK/WORLD_SIZE "
        "(SLURM_PROCID/SLURM_NTASKS under SLURM)"
    )


def fsdist_rendezvous_handler(url: str, timeout: timedelta = DEFAULT_TIMEOUT, **_: Any) -> Iterator[Any]:
    """torch's rendezvous-handler protocol for ``init_method="fsdist://..."``."""
    root, rank, world_size = parse_url(url)
    running = in_use_here(resolve_place(root))
    if running:  # a second job of this process (torch's _dist2 meets through env:// per group)
        generation = rendezvous(running[-1].nested_root(), rank, world_size, timeout)
        generation.owns_root = True  # inside the running generation's folder: removed with it too
    else:
        generation = rendezvous(root, rank, world_size, timeout)
    yield (open_store(generation, timeout), rank, world_size)
    raise RuntimeError("fsdist rendezvous handler cannot be re-used")


def serves_env_init() -> bool:
    """Whether ``env://`` meets through the directory here (see the module docstring)."""
    return bool(os.environ.get(ENV_DIR)) and os.environ.get(ENV_ENV_INIT, "directory") != "torch"


def env_handler(torch_handler: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """torch's ``env://`` handler, served through ``FSDIST_DIR`` where one is set."""

    def env_rendezvous_handler(url: str, timeout: timedelta = DEFAULT_TIMEOUT, **kwargs: Any) -> Iterator[Any]:
        if serves_env_init():
            return fsdist_rendezvous_handler(url, timeout)  # env://?rank=R&world_size=W parses alike
        _refuse_port_zero(url)
        return _with_hint(torch_handler(url, timeout=timeout, **kwargs))

    return env_rendezvous_handler


def _refuse_port_zero(url: str) -> None:
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(url).query))
    world = query.get("world_size") or os.environ.get("WORLD_SIZE", "")
    if os.environ.get("MASTER_PORT") == "0" and world.isdigit() and int(world) > 1:
        raise ValueError(
            "env:// rendezvous: MASTER_PORT=0 cannot work for several ranks (no peer can learn a port the "
            f"kernel picks; torchrun's fsdist rendezvous serves no TCPStore). Set {ENV_DIR} to a directory "
            f"every rank shares to meet there without a port"
            + (f" (and unset {ENV_ENV_INIT})" if os.environ.get(ENV_ENV_INIT) else "")
            + ", or set MASTER_PORT to a real port"
        )


def _with_hint(inner: Iterator[Any]) -> Iterator[Any]:
    """torch's handler, its "MASTER_ADDR expected" error extended by the port-free way out."""
    try:
        first = next(inner)
    except ValueError as exc:
        if "MASTER_ADDR" in str(exc) or "MASTER_PORT" in str(exc):
            raise ValueError(f"{exc} (or set {ENV_DIR} to a directory every rank shares: fsdist then meets "
                             "there, with no port)") from exc  # fmt: skip
        raise
    yield first
    yield from inner


FIX_FILE_STORE = (
    "Keep torch's FileStore file in a folder of your own (file:///tmp/<a folder of yours>/initfile), "
    "or meet with fsdist:///<dir>, which needs no file of torch's"
)


def file_handler(torch_handler: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """torch's ``file://`` handler, its file made safe first for a group of fsdist's (the module
    docstring); other backends' groups are left exactly as torch makes them."""

    def file_rendezvous_handler(url: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        path = urllib.parse.urlparse(url).path
        if path and _initializing_fsdist():
            guard_file_store(path)
        return torch_handler(url, *args, **kwargs)

    return file_rendezvous_handler


def guard_file_store(path: str) -> str:
    """Make the FileStore file ``path`` this user's (or the named group's) before torch opens it:
    made exclusively, or the one in place checked (files/places.py ``adopt_file``)."""
    return adopt_file(path, FIX_FILE_STORE)


def _initializing_fsdist() -> bool:
    """Whether the rendezvous is one ``init_process_group`` runs for an fsdist group (torch hands
    a handler no backend: it is read from the caller's frame, or torch's default where none is named)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "init_process_group" and "backend" in frame.f_locals:
            backend = frame.f_locals["backend"]
            if backend is None:
                backend = getattr(dist.Backend, "default_device_backend_map", {}).get("cpu", "")
            return "fsdist" in str(backend).lower()
        frame = frame.f_back  # type: ignore[assignment]
    return False
