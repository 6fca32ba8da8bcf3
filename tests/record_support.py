"""Support for tests that drive state records in one process: a watch that finds every peer
alive, one inline publish, a record's position bytes, and reads replaced by torn bytes."""

from __future__ import annotations

import os
from typing import Any

import torch

from fsdist.protocol import message, state_record
from fsdist.transport.progress import Progress


class AliveWatch:
    """A PeerWatch whose peers never die."""

    def dead_reason(self, rank: int) -> str | None:
        return None

    def close(self) -> None:
        pass


def publish_inline(progress: Progress, seq: int, step: int, value: float) -> bytes:
    """Rank ``progress`` enters ``seq`` and publishes ``value`` inline at ``step``; the message."""
    progress.enter(seq, "all_reduce SUM float32[1]")
    check = progress.collective_seal(progress.rank, step)
    encoded = b"".join(
        message.encode(seq, 0, progress.description, [torch.tensor([value])], check, message.INLINE_ALIGN)
    )
    progress.advance_inline(step, seq % state_record.INLINE_SLOTS, encoded)
    return encoded


def position_bytes(directory: Any, rank: int) -> bytes:
    """``rank``'s record's position part (header and inline slots), as on disk now."""
    with open(os.path.join(str(directory), f"state.r{rank}"), "rb") as record:
        return record.read()[: state_record.POSITION_SIZE]


def queue_reads(monkeypatch: Any, cls: type, name: str) -> tuple[list[bytes], list[str]]:
    """Make ``cls.name`` (a record's read method) return the queued bytes first, then the file's
    own again; returns the queue and the paths every call read."""
    queued: list[bytes] = []
    calls: list[str] = []
    real = getattr(cls, name)

    def read(self: Any, offset: int = 0, size: int | None = None) -> bytes:
        calls.append(self.path)
        return queued.pop(0) if queued else real(self, offset, size)

    monkeypatch.setattr(cls, name, read)
    return queued, calls


def direct_io_folder() -> str:
    """A fresh private folder on /dev/shm for direct records (tmpfs takes unaligned O_DIRECT from
    Linux 6.6 on); the test is skipped, saying why, on a kernel whose tmpfs refuses it."""
    import tempfile

    import pytest

    from fsdist.files.direct import DirectRecord

    path = tempfile.mkdtemp(prefix="fsdist-direct-", dir="/dev/shm")
    why = DirectRecord.refusal(path)
    if why is not None:
        os.rmdir(path)
        pytest.skip(f"/dev/shm cannot hold direct records on this kernel: {why}")
    return path
