"""Records with one writer, read and written with ``O_DIRECT`` and no lock: NFS in fewest calls.

On an NFS client every locked access of a record (files/locks.py) is LOCK + UNLOCK (+ FREE_STATEID
on v4.1+) and the GETATTR and READ that the lock's cache revalidation forces. A direct write that
fits one request is sent FILE_SYNC and is at the server when it returns; a direct read asks the
server and skips the revalidation: publishing is one WRITE, a look one READ (fs/nfs/direct.c).
Nothing excludes a reader from the writer's write, so only formats whose checks find a torn read
live here (state records: their header, slots and counters each carry one), read again until
whole, and never a value two writers change. ``FSDIST_IO=direct`` chooses it (transport/locality.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Callable
from typing import TypeVar

from ..defaults import ENV_IO
from ..errors import FsdistError, ProtocolError
from .io import open_file, unlink_quietly
from .locks import RECORD_MAX_BYTES, LockedRecord, OnWait, TornReads

T = TypeVar("T")

__all__ = ["DirectRecord", "io_setting", "takes_direct_io"]


class DirectRecord(LockedRecord):
    """A record with one writer, read and written with ``O_DIRECT`` and no lock (``update``, a
    compare-and-set, refuses). Its filesystem must take direct I/O of any size at any offset, as
    NFS and tmpfs do, not only aligned (ext4, xfs): ``refusal`` says which."""

    def __init__(
        self, path: str, create: bool = True, on_wait: OnWait | None = None, max_size: int = RECORD_MAX_BYTES
    ) -> None:
        super().__init__(path, create, on_wait, max_size)
        try:
            fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) | os.O_DIRECT)
        except OSError as exc:
            self.close()
            raise FsdistError(f"{ENV_IO}=direct: {path}'s filesystem has no direct I/O ({exc.strerror})") from None

    def _lock(self, kind: int) -> None:
        """No lock: one writer, and readers that check what they read."""

    reads_unlocked = True
    lockless = True

    def read_checked(
        self, offset: int, size: int, parse: Callable[[bytes], T], plausible: Callable[[T], bool] | None = None,
        locked: bool = False,
    ) -> tuple[bytes, T, bool]:  # fmt: skip
        """``size`` bytes at ``offset``, what ``parse`` makes of them, and True (read without a
        lock: there is none, whatever ``locked`` asks), read again while its checks (a
        ProtocolError, or ``plausible`` saying no) find them torn by the writer's write, for as
        long as ``TornReads`` allows: past that the bytes are damaged, not torn, and the check's
        error goes up (an implausible value is returned as read)."""
        torn = TornReads()
        while True:
            raw = self.read(offset, size)
            try:
                value = parse(raw)
            except ProtocolError:
                if torn.past():
                    raise
                continue
            if plausible is None or plausible(value) or torn.past():
                return raw, value, True

    @staticmethod
    def refusal(directory: str) -> str | None:
        """Why direct records cannot live in ``directory`` (None: they can): a private file there
        takes one byte written and read back at an unaligned offset with O_DIRECT, or not."""
        path = os.path.join(directory, f".tmp.direct.{secrets.token_hex(4)}")
        try:
            fd = open_file(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        except OSError as exc:
            return f"cannot make a probe file there ({exc})"
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
            os.pwrite(fd, b"\x5a", 1)
            if os.pread(fd, 1, 1) != b"\x5a":
                return "a byte written directly did not read back"
        except OSError as exc:  # EINVAL: alignment wanted (ext4, xfs), or no O_DIRECT at all
            return f"its filesystem refuses unaligned direct I/O ({exc.strerror})"
        finally:
            os.close(fd)
            unlink_quietly(path)
        return None

    def try_read(self, offset: int = 0, size: int | None = None) -> bytes | None:
        """A read, as every read of a direct record: no lock to find busy."""
        return self.read(offset, size)

    def held(self, kind: int = 0) -> contextlib._GeneratorContextManager[None]:
        raise FsdistError(f"{self.path}: a direct record takes no lock to hold")

    def update(self, change: Callable[[bytes], bytes | None]) -> bytes:
        raise FsdistError(f"{self.path}: a direct record has one writer; a compare-and-set needs the lock")


def io_setting() -> str:
    """FSDIST_IO as given: ``auto`` (the default: direct records where the job measures that they
    hold across its clients, job/io_choice.py), ``direct`` or ``locked``."""
    setting = os.environ.get(ENV_IO, "auto") or "auto"
    if setting not in ("auto", "direct", "locked"):
        raise ValueError(f"{ENV_IO}={setting!r}: expected auto, direct or locked")
    return setting


_TAKES_DIRECT_IO: set[str] = set()  # directories whose probe succeeded (a failure is asked again)


def takes_direct_io(directory: str) -> bool:
    """Whether ``directory``'s filesystem takes unaligned direct I/O (``DirectRecord.refusal``;
    asked until it says yes, once per directory then)."""
    if directory not in _TAKES_DIRECT_IO and DirectRecord.refusal(directory) is None:
        _TAKES_DIRECT_IO.add(directory)
    return directory in _TAKES_DIRECT_IO
