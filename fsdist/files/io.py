"""File primitives: atomic publish, reads into caller buffers, retries, private modes.

This layer knows nothing of tensors or collectives. Its one promise: a reader never sees a
half-written file, because a file only appears under its final name through ``rename`` of a
complete temporary file written in the same directory.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..defaults import DIR_MODE, FILE_MODE
from ..errors import FsdistError, ProtocolError

T = TypeVar("T")

_RETRYABLE = {errno.EINTR, errno.ESTALE, errno.EAGAIN}
_RETRIES = 20

#: O_NOFOLLOW: a symlink planted in the shared directory must never redirect our reads or writes.
OPEN_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def retrying(call: Callable[[], T]) -> T:
    """Run ``call``, retrying the transient errors network filesystems produce (ESTALE, EINTR)."""
    for attempt in range(_RETRIES):
        try:
            return call()
        except OSError as exc:
            if exc.errno not in _RETRYABLE or attempt == _RETRIES - 1:
                raise
            time.sleep(min(1e-3 * 2**attempt, 0.05))
    raise AssertionError("unreachable")


def make_private_dir(path: str) -> None:
    """Create ``path`` (and parents) with the private directory mode; an existing one is kept."""
    parent = os.path.dirname(path)
    if parent and parent != path and not os.path.isdir(parent):
        make_private_dir(parent)  # os.makedirs would give missing parents the default mode
    try:
        os.mkdir(path, DIR_MODE)  # the umask may take bits away, never add
    except FileExistsError:
        pass
    if os.path.islink(path):
        raise FsdistError(f"refusing to use {path!r}: it is a symbolic link")


def open_file(path: str, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` that never follows a symlink and retries transient errors."""
    return retrying(lambda: os.open(path, flags | OPEN_FLAGS, mode))


def publish(directory: str, name: str, buffers: Sequence[memoryview | bytes]) -> str:
    """Write ``buffers`` to ``directory/name`` atomically and return the final path.

    The data goes to a uniquely named temporary file first; ``rename`` then makes it visible
    complete or not at all. On any error (ENOSPC, EIO, ...) the temporary file is removed and
    the error names the path, so no reader can ever find a truncated message. (Rewriting a
    retired file instead of creating one: ``spares``.)
    """
    final = os.path.join(directory, name)
    temp = os.path.join(directory, f".tmp.{name}.{secrets.token_hex(4)}")
    try:
        fd = open_file(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            write_all(fd, buffers)
        finally:
            os.close(fd)
        retrying(lambda: os.rename(temp, final))
    except OSError as exc:
        unlink_quietly(temp)
        raise FsdistError(f"could not publish {final}: {os.strerror(exc.errno or 0)} ({exc})") from exc
    return final


def write_all(fd: int, buffers: Sequence[memoryview | bytes], offset: int = 0) -> int:
    """Write ``buffers`` one after the other at ``offset`` (``pwritev``, resumed where it was short);
    return how many bytes."""
    pending = [memoryview(b).cast("B") for b in buffers if len(b)]
    total = sum(len(b) for b in pending)
    position = offset
    while pending:
        written = retrying(lambda: os.pwritev(fd, pending[:1024], position))
        position += written
        while written and pending:
            if written >= len(pending[0]):
                written -= len(pending[0])
                pending.pop(0)
            else:
                pending[0] = pending[0][written:]
                written = 0
    return total


def read_exact(fd: int, buffer: memoryview, offset: int, path: str) -> None:
    """Fill ``buffer`` from ``fd`` at ``offset``; a short file is a protocol error, not a hang."""
    view = buffer.cast("B")
    done = 0
    while done < len(view):
        got = retrying(lambda: os.preadv(fd, [view[done:]], offset + done))
        if got == 0:
            raise ProtocolError(f"{path} ended after {offset + done} bytes; expected {offset + len(view)}")
        done += got


def unlink_quietly(path: str) -> None:
    """Remove a file that may already be gone (another rank may have collected it)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ESTALE:
            raise


def remove_tree(path: str) -> None:
    """Remove a directory tree, tolerating files that vanish while it runs."""
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):  # a straggling NFS silly-rename (.nfsXXXX) file; try once more
        time.sleep(0.05)
        shutil.rmtree(path, ignore_errors=True)
