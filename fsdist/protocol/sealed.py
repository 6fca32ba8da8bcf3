"""Checks for the directory's whole-file records, so that a damaged or forged one is refused.

A flipped bit is never read as another value (a digit of a world size, a pid, a store value),
and with FSDIST_SECRET_FILE a forged or altered record is refused too (files/seal.py).

Two forms, one per kind of content:

- **JSON records** (the rendezvous record, failure reports, the restart history, a group's
  abort reason as a JSON string): the JSON text, then a check line and a newline: ``#crc32=<8 lowercase hex
  digits>`` (the CRC-32 of the JSON bytes), or with a secret ``#mac=<32 lowercase hex digits>``
  (the keyed MAC of the record's identity and the JSON bytes). They stay text: ``head -n 1`` of
  the file is the JSON.
- **Store values** (DirectoryStore key files, whose values are anyone's bytes): the value, then
  its TAG_BYTES tag (a CRC-32 little-endian and zero bytes, or the MAC).

``identity`` names which record it is (layout.identity of its path, or its kind), so a valid
record copied into another file does not pass there. Both raise ``ValueError`` naming what is
wrong; each format's parser turns it into its own error.
"""

from __future__ import annotations

import hmac
import json
import os
import re
from typing import Any

from ..files.seal import TAG_BYTES, Seal, seal

__all__ = [
    "MAX_VALUE_BYTES", "SEAL_BYTES", "bound_to_directory", "seal_json", "seal_text", "seal_value", "unseal_json",
    "unseal_text", "unseal_value",
]  # fmt: skip

#: The largest store value (torch's own are a few hundred bytes; a larger ``set`` is refused, and
#: a larger file is not read): what a reader may have to hold in memory.
MAX_VALUE_BYTES = 64 << 20
#: what the seal adds to a store value
SEAL_BYTES = TAG_BYTES

_JSON_SEAL = re.compile(rb"\n#(?:crc32|mac)=[0-9a-f]+\n\Z")


def bound_to_directory(identity: str, directory: str) -> str:
    """``identity`` (a record at the top of a run directory, outside every generation) bound to
    ``directory``'s inode number: every client of a cluster filesystem sees the same one (NFS's
    fileid) and nobody can choose it, so under FSDIST_SECRET_FILE a record copied whole from
    another run directory fails its MAC there (a CRC, without the secret, ignores identities).
    Read once per path and process: moving the directory keeps it, copying it does not."""
    inode = _INODES.get(directory)
    if inode is None:
        inode = _INODES[directory] = os.stat(directory).st_ino
    return f"{identity}@{inode}"


_INODES: dict[str, int] = {}


def _line(body: bytes, check: Seal) -> bytes:
    tag = check.tag(body)
    return (
        b"\n#mac=%s\n" % tag.hex().encode() if check.keyed else b"\n#crc32=%08x\n" % int.from_bytes(tag[:4], "little")
    )


def seal_json(obj: Any, identity: str) -> bytes:
    """``obj`` as JSON with its check line."""
    body = json.dumps(obj).encode()
    return body + _line(body, seal(identity))


def unseal_json(raw: bytes, identity: str) -> bytes:
    """The JSON bytes of a sealed record, checked against its check line."""
    match = _JSON_SEAL.search(raw)
    if match is None:
        raise ValueError("no check line at its end (cut short, or not written by this fsdist)")
    body, check = raw[: match.start()], seal(identity)
    if not hmac.compare_digest(raw[match.start() :], _line(body, check)):
        raise ValueError(check.reason)
    return body


def seal_text(text: str, identity: str, limit: int = 64 << 10) -> bytes:
    """A text record (a group's ``abort`` reason): the text as a JSON string, sealed; a text
    longer than ``limit`` characters keeps its start."""
    return seal_json(text[:limit], identity)


def unseal_text(raw: bytes, identity: str) -> str:
    """The text of a sealed text record (``ValueError`` if it is not one)."""
    text = json.loads(unseal_json(raw, identity))
    if not isinstance(text, str):
        raise ValueError("not a text record")
    return text


def seal_value(value: bytes, identity: str) -> bytes:
    """``value`` followed by its tag."""
    if len(value) > MAX_VALUE_BYTES:
        raise ValueError(f"a store value of {len(value)} bytes: fsdist's store holds at most {MAX_VALUE_BYTES}")
    return value + seal(identity).tag(value)


def unseal_value(raw: bytes, identity: str) -> bytes:
    """The value of a sealed store file, checked against its tag."""
    if len(raw) < TAG_BYTES:
        raise ValueError(f"{len(raw)} bytes: too short for a checked value")
    value, check = raw[:-TAG_BYTES], seal(identity)
    if not check.verify(raw[-TAG_BYTES:], value):
        raise ValueError(check.reason)
    return value
