"""File primitives: atomic publish, reads into caller buffers, retries, private modes.

This layer knows nothing of tensors or collectives. Its one promise: a reader never sees a
half-written file. A file a reader may look up by name (``publish``) appears under that name
only through ``rename`` of a complete temporary file written in the same directory. A file a
reader opens only once a record written after it names it (``write_new``) is written under its
final name: nobody opens it before it is complete.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..errors import FsdistError, ProtocolError
from .trust import OPEN_FLAGS, check_open, refusal, sharing, size_checked

T = TypeVar("T")

_RETRYABLE = {errno.EINTR, errno.ESTALE, errno.EAGAIN}
_RETRIES = 20


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


def retried(error: OSError, call: Callable[[], T]) -> T:
    """``call`` again, its first try (made in place, where the hot paths need no closure) having
    failed with ``error``: raised at once unless it is transient, else ``retrying``."""
    if error.errno not in _RETRYABLE:
        raise error
    return retrying(call)


def open_file(path: str, flags: int, max_size: int | None = None, what: str = "") -> int:
    """``os.open`` that never follows a symlink, never blocks, and retries transient errors.

    With ``O_EXCL`` the file is made here (this user's, or the group's with FSDIST_GROUP, under
    any umask). Without, it already existed and may not be fsdist's: it must be a regular file
    that this user (or the group) owns and nobody else can write (files/trust.py), checked on
    the descriptor, and no larger than ``max_size`` (``what`` names the format in the error).
    ``O_NONBLOCK``: a FIFO planted where a file belongs opens at once, and is then refused.
    """
    share = sharing()
    try:
        fd = retrying(lambda: os.open(path, flags | OPEN_FLAGS | os.O_NONBLOCK, share.file_mode))
    except OSError as exc:
        raise refusal(path, "file", exc) from None
    try:
        if flags & os.O_EXCL:
            if share.gid is not None:  # the group's, whatever the umask took away and whatever the
                os.fchown(fd, -1, share.gid)  # folder's group (one made without the set-group-ID bit)
                os.fchmod(fd, share.file_mode)
        else:
            st = check_open(fd, path)
            if max_size is not None:
                size_checked(st, path, max_size, what or "this file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file(path: str, max_size: int, what: str) -> bytes:
    """A whole small file (checked as ``open_file`` checks it), refused before it is read if it is
    larger than ``max_size``."""
    fd = open_file(path, os.O_RDONLY)
    try:
        size = size_checked(os.fstat(fd), path, max_size, what)
        buffer = bytearray(size)
        done = 0
        while done < size:  # (a file that shrinks meanwhile reads short: its checksum refuses it)
            got = retrying(lambda: os.preadv(fd, [memoryview(buffer)[done:]], done))
            if got == 0:
                break
            done += got
        return bytes(buffer[:done])
    finally:
        os.close(fd)


def publish(directory: str, name: str, buffers: Sequence[memoryview | bytes]) -> str:
    """Write ``buffers`` to ``directory/name`` atomically and return the final path.

    The data goes to a uniquely named temporary file first; ``rename`` then makes it visible
    complete or not at all. On any error (ENOSPC, EIO, ...) the temporary file is removed and
    the error names the path, so no reader can ever find a truncated message. (Rewriting a
    retired file instead of creating one: ``spares``.)
    """
    final = os.path.join(directory, name)
    temp = os.path.join(directory, f".tmp.{name}.{secrets.token_hex(4)}")
    write_new(temp, buffers, shown_as=final)
    try:
        retrying(lambda: os.rename(temp, final))
    except OSError as exc:
        unlink_quietly(temp)
        raise _not_published(final, exc) from exc
    return final


def write_new(path: str, buffers: Sequence[memoryview | bytes], shown_as: str | None = None) -> str:
    """Write ``buffers`` to a new file ``path`` (made exclusively) and return ``path``.

    For a message that a record announces once it is complete (its readers open it only then),
    where files are not reused, so on network filesystems: a ``rename`` changes the file's ctime
    on the server, and an NFS client drops the cached pages of a file whose change attribute
    moved, so readers on the writer's own client would fetch again what it just wrote (in the
    NFS VM, v3 and v4.2: a renamed 4 MiB file was read back from the server whole every time, one
    written in place 38–62 % of the time: scripts/nfs-vm/page_cache.py). One RENAME per message fewer,
    too. ``publish`` writes its temporary file through it. On any error the file is removed (if
    this call made it) and the error names ``shown_as`` (default ``path``).
    """
    try:
        fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except OSError as exc:
        raise _not_published(shown_as or path, exc) from exc
    try:
        try:
            write_all(fd, buffers)
        finally:
            os.close(fd)  # (on NFS, close is where the data reaches the server: its errors count)
    except OSError as exc:
        unlink_quietly(path)
        raise _not_published(shown_as or path, exc) from exc
    return path


def _not_published(path: str, exc: OSError) -> FsdistError:
    return FsdistError(f"could not publish {path}: {os.strerror(exc.errno or 0)} ({exc})")


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


def detach_standard_streams() -> None:
    """Point this process's stdin, stdout and stderr at /dev/null: a child that may outlive its
    caller (stuck in a filesystem call) must not hold the caller's pipes open."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
