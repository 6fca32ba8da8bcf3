"""Checksums for the directory's whole-file records: a flipped bit is refused, never read as
another value (a digit of a world size, a pid, a store value).

Two forms, one per kind of content:

- **JSON records** (the rendezvous record, failure reports, the restart history): the JSON
  text, then the line ``#crc32=<8 lowercase hex digits>`` (the CRC-32 of the JSON bytes) and a
  newline. They stay text: ``head -n 1`` of the file is the JSON.
- **Store values** (DirectoryStore key files, whose values are anyone's bytes): the value, then
  its CRC-32 as 4 bytes little-endian.

Both raise ``ValueError`` naming what is wrong; each format's parser turns it into its own error.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from typing import Any

__all__ = ["MAX_VALUE_BYTES", "SEAL_BYTES", "seal_json", "seal_value", "unseal_json", "unseal_value"]

#: The largest store value (torch's own are a few hundred bytes; a larger ``set`` is refused, and
#: a larger file is not read): what a reader may have to hold in memory.
MAX_VALUE_BYTES = 64 << 20

_JSON_SEAL = re.compile(rb"\n#crc32=([0-9a-f]{8})\n\Z")
_VALUE_CRC = struct.Struct("<I")
#: what the seal adds to a store value
SEAL_BYTES = _VALUE_CRC.size


def seal_json(obj: Any) -> bytes:
    """``obj`` as JSON with its checksum line."""
    body = json.dumps(obj).encode()
    return body + b"\n#crc32=%08x\n" % zlib.crc32(body)


def unseal_json(raw: bytes) -> bytes:
    """The JSON bytes of a sealed record, checked against its checksum line."""
    match = _JSON_SEAL.search(raw)
    if match is None:
        raise ValueError("no checksum line at its end (cut short, or not written by this fsdist)")
    body = raw[: match.start()]
    if zlib.crc32(body) != int(match.group(1), 16):
        raise ValueError("checksum mismatch (corrupt)")
    return body


def seal_value(value: bytes) -> bytes:
    """``value`` followed by its CRC-32."""
    if len(value) > MAX_VALUE_BYTES:
        raise ValueError(f"a store value of {len(value)} bytes: fsdist's store holds at most {MAX_VALUE_BYTES}")
    return value + _VALUE_CRC.pack(zlib.crc32(value))


def unseal_value(raw: bytes) -> bytes:
    """The value of a sealed store file, checked against its CRC-32."""
    if len(raw) < _VALUE_CRC.size:
        raise ValueError(f"{len(raw)} bytes: too short for a checksummed value")
    value = raw[: -_VALUE_CRC.size]
    if zlib.crc32(value) != _VALUE_CRC.unpack_from(raw, len(value))[0]:
        raise ValueError("checksum mismatch (corrupt)")
    return value
