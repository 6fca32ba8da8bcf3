"""The check field of every record and message: a CRC-32 against damage, or, with a shared secret,
a keyed MAC against forgery too.

A CRC-32 finds a flipped bit or a torn read, but anyone who can write a file can write a valid
CRC: on NFS with ``sec=sys`` that is root on any client, whatever the modes say. With
FSDIST_SECRET_FILE set on every rank, each check is instead a 16-byte BLAKE2b MAC keyed by that
secret and bound to the item's identity (which file it is, below its generation's folder), so
an item forged, altered, or moved from another file, group or job is refused. Every check field
is TAG_BYTES wide either way (the CRC-32 then zero bytes), so the formats do not change with the
setting; a rank whose setting differs from its peers' fails every check, naming the variable.

With a secret, message payloads are tagged too, in CHUNK_BYTES pieces so that a reader of part
of a tensor checks only what it reads (protocol/message.py): by default those of byte tensors,
which is how torch's ``*_object`` collectives carry pickles (a forged pickle runs code on every
rank that loads it); with FSDIST_MAC_PAYLOADS=1 every payload; with FSDIST_MAC_PAYLOADS=0 none,
which is warned about.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import struct
import warnings
import zlib

from ..defaults import ENV_GROUP, ENV_MAC_PAYLOADS, ENV_SECRET_FILE
from ..errors import FsdistError, UntrustedPathError
from .foreign_mounts import check_descriptor_mount
from .places import resolve_place
from .trust import OPEN_FLAGS, describe, refusal, sharing

__all__ = [
    "CHUNK_BYTES", "PAYLOADS_ALL", "PAYLOADS_BYTES", "PAYLOADS_NONE", "TAG_BYTES", "Seal", "Sealer", "macs_payloads",
    "seal", "sealer", "secret_key",
]  # fmt: skip

#: Bytes of every check field: a 16-byte (128-bit) MAC, or a CRC-32 and 12 zero bytes.
TAG_BYTES = 16
#: A tagged payload is tagged in pieces of this many bytes (the last may be shorter).
CHUNK_BYTES = 64 << 10
_CRC = struct.Struct("<I")
_PAD = bytes(TAG_BYTES - _CRC.size)
_SECRET_MIN, _SECRET_MAX = 16, 4096  # bytes of a secret file
_PERSON = b"fsdist-mac-v1"
#: Which message payloads carry tags: none, those of byte (uint8) tensors, all.
PAYLOADS_NONE, PAYLOADS_BYTES, PAYLOADS_ALL = "none", "bytes", "all"
Buffer = bytes | bytearray | memoryview


class Seal:
    """Computes and checks the tags of one item (``identity``: which item, see layout.identity)."""

    keyed = False
    #: which message payloads carry tags too (PAYLOADS_*; keyed seals only)
    payloads = PAYLOADS_NONE

    def tag(self, *data: Buffer) -> bytes:
        """The TAG_BYTES tag of ``data`` (the pieces in order, as if joined)."""
        return _CRC.pack(_crc(data)) + _PAD

    def verify(self, tag: Buffer, *data: Buffer) -> bool:
        """Whether ``tag`` is ``data``'s (compared in constant time where it is a MAC)."""
        return tag == _CRC.pack(_crc(data)) + _PAD

    def verify_at(self, raw: bytes, end: int) -> bool:
        """Whether the tag at ``raw[end : end + TAG_BYTES]`` is that of ``raw[:end]`` (the layout of
        every header: the tag right after what it covers; one call on the hot path, no slices)."""
        return (
            zlib.crc32(memoryview(raw)[:end]) == _CRC.unpack_from(raw, end)[0]
            and raw[end + 4 : end + TAG_BYTES] == _PAD
        )

    #: why a tag that does not match is refused
    reason = "checksum mismatch (corrupt, or written by another program)"

    def mismatch(self, where: str) -> str:
        return f"{where}: {self.reason}"


def _crc(data: tuple[Buffer, ...]) -> int:
    if len(data) == 1:  # (most checks: every state record read is one)
        return zlib.crc32(data[0])
    crc = 0
    for piece in data:
        crc = zlib.crc32(piece, crc)
    return crc


class _Keyed(Seal):
    """A keyed BLAKE2b-128 MAC over the item's identity and its bytes."""

    keyed = True

    def __init__(self, key: bytes, identity: str, payloads: str) -> None:
        self.payloads = payloads
        self._base = hashlib.blake2b(key=key, digest_size=TAG_BYTES, person=_PERSON)
        self._base.update(identity.encode() + b"\0")

    def tag(self, *data: Buffer) -> bytes:
        mac = self._base.copy()
        for piece in data:
            mac.update(piece)
        return mac.digest()

    def verify(self, tag: Buffer, *data: Buffer) -> bool:
        return hmac.compare_digest(bytes(tag), self.tag(*data))

    def verify_at(self, raw: bytes, end: int) -> bool:
        view = memoryview(raw)
        return self.verify(view[end : end + TAG_BYTES], view[:end])

    reason = (
        f"MAC mismatch: forged or altered (or not every rank uses the same {ENV_SECRET_FILE}, and "
        f"{ENV_MAC_PAYLOADS} alike)"
    )


_CRC_SEAL = Seal()
_loaded: tuple[tuple[str, str, int], bytes | None] | None = None


class Sealer:
    """The settings seals are made with (a key or none; payload tags or not), as they were when
    it was made: a group keeps the settings it was created with (``fsdist bench --mac`` runs
    groups with and without a secret side by side in one process)."""

    def __init__(self, key: bytes | None, payloads: str) -> None:
        self.key, self.payloads = key, payloads

    def seal(self, identity: str) -> Seal:
        """The seal of the item ``identity``: keyed where there is a key, else the CRC."""
        return _CRC_SEAL if self.key is None else _Keyed(self.key, identity, self.payloads)


def sealer() -> Sealer:
    """A Sealer with this process's settings now (FSDIST_SECRET_FILE, FSDIST_MAC_PAYLOADS)."""
    return Sealer(secret_key(), macs_payloads())


def seal(identity: str) -> Seal:
    """The seal of the item ``identity`` with this process's settings now."""
    return sealer().seal(identity)


def macs_payloads() -> str:
    """Which message payloads are tagged (PAYLOADS_*): with a secret, byte tensors' unless
    FSDIST_MAC_PAYLOADS says ``1`` (all) or ``0`` (none, warned about once); without, none."""
    setting = os.environ.get(ENV_MAC_PAYLOADS, "")
    if setting not in ("", "0", "1"):
        raise FsdistError(f"{ENV_MAC_PAYLOADS}={setting}: say 1 (tag every payload) or 0 (none)")
    if secret_key() is None:
        if setting == "1":
            raise FsdistError(f"{ENV_MAC_PAYLOADS}=1 tags payloads with the secret: set {ENV_SECRET_FILE} too")
        return PAYLOADS_NONE
    if setting == "0":
        _warn_once(
            f"fsdist: {ENV_MAC_PAYLOADS}=0: no payload is authenticated, not even the pickles torch's *_object "
            "collectives send (broadcast_object_list, all_gather_object, ...): whoever can write the run "
            "directory (root on any NFS client) can make every rank that loads one run their code"
        )
        return PAYLOADS_NONE
    return PAYLOADS_ALL if setting == "1" else PAYLOADS_BYTES


_warned: set[str] = set()


def _warn_once(text: str) -> None:
    if text not in _warned:
        _warned.add(text)
        warnings.warn(text, stacklevel=3)


def secret_key() -> bytes | None:
    """The MAC key derived from FSDIST_SECRET_FILE, or None where it is not set (read once per
    path and user).

    The file must be a regular file of this user's that nobody else can read (with FSDIST_GROUP,
    its group may read it if it is that group), of 16 to 4096 bytes: a secret others can read
    keys nothing. Keep it off the shared filesystem (docs/security.md): root on another NFS
    client can read what is there."""
    global _loaded
    path = os.environ.get(ENV_SECRET_FILE, "")
    if not path:
        return None
    cache = (path, os.environ.get(ENV_GROUP, ""), os.geteuid())
    if _loaded is not None and _loaded[0] == cache:
        return _loaded[1]
    resolved = path
    try:  # the rules of a run directory: links only the user's or root's, no folder on the way another may change
        resolved = resolve_place(path, _FIX_SECRET)
        fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | OPEN_FLAGS)
    except UntrustedPathError as exc:
        raise FsdistError(f"{ENV_SECRET_FILE}={path}: {exc}") from None
    except OSError as exc:
        raise FsdistError(f"{ENV_SECRET_FILE}={path}: {refusal(resolved, 'file', exc)}") from None
    try:
        st = os.fstat(fd)
        problem = _secret_problem(st)
        content = b"" if problem else os.read(fd, _SECRET_MAX + 1)
        problem = problem or _guessable(content)
        if problem:
            raise FsdistError(f"{ENV_SECRET_FILE}={path}: {problem}. It is {describe(st)}. {_FIX_SECRET}")
        check_descriptor_mount(fd, path, sharing().trusts, _FIX_SECRET)
    except UntrustedPathError as exc:
        raise FsdistError(f"{ENV_SECRET_FILE}={path}: {exc}") from None
    finally:
        os.close(fd)
    key = hashlib.blake2b(content, digest_size=64, person=b"fsdist-secret").digest()
    _loaded = (cache, key)
    return key


_FIX_SECRET = (
    f"Make it a file only you can read (chmod 600), of {_SECRET_MIN} to {_SECRET_MAX} random bytes "
    "(head -c 32 /dev/urandom > FILE), kept on each machine's own disk, in a folder only you (or root) can change"
)


def _guessable(content: bytes) -> str | None:
    """Why ``content`` keys nothing (it carries fewer than 128 bits anyone would have to guess), or None.

    Only what no generator of random bytes writes: one short run repeated (sixteen zero bytes, a
    byte pattern, a word typed over and over), ignoring a final newline."""
    body = content.rstrip(b"\n")
    if len(body) < _SECRET_MIN:
        return f"it holds {len(body)} bytes besides a final newline, fewer than {_SECRET_MIN} (128 bits)"
    for unit in range(1, 9):
        if body == (body[:unit] * (len(body) // unit + 1))[: len(body)]:
            what = f"one byte, {body[:1]!r}," if unit == 1 else f"the {unit} bytes {body[:unit]!r}"
            return f"it is {what} repeated: anyone could guess it"
    return None


def _secret_problem(st: os.stat_result) -> str | None:
    share = sharing()
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if not share.owns(st):
        return "another user owns it"
    group_may_read = share.gid is not None and st.st_gid == share.gid
    if st.st_mode & (0o007 | (0o030 if group_may_read else 0o070)):
        return "other users can read or write it"
    if not _SECRET_MIN <= st.st_size <= _SECRET_MAX:
        return f"it holds {st.st_size} bytes"
    return None
