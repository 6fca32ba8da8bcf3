"""Torn reads of direct records, each region type: a reader racing its writer, and a writer cut off.

Usage: torn_ranks.py WRITER_DIR READER_DIR SECONDS LABEL
(one directory through two mounts in the NFS VM: the writer's client and the reader's; the same
path on tmpfs, where tests/test_direct.py runs it). Direct records have no lock: nothing stops a
read from meeting a write, and NFS promises no atomicity for a READ racing a WRITE. Each region a
reader acts on carries a check, and a read that fails it is read again; a value that passes must
be one the writer wrote whole. For each region type:

- **position** (a state record's header and an inline slot): the writer publishes operation
  after operation, each slot holding its own sequence number as its value; the reader takes
  every header and slot it finds, and the value must be the operation's.
- **pair** (a pair area's counters and a point-to-point slot): the writer raises ``sent`` and
  puts message ``sent`` in its slot, filled with its index; the reader's counters and slot must agree.
- **counter** (a heartbeat, OwnCounter): the writer counts up; each value read must be one
  written (never above the last one written, never below one read before).

Then a **writer cut off** mid-record (the first part of a write reached the file, the rest never
came, as when a write of more than one NFS request is interrupted): a header announcing a step
whose slot is the old one is waited for until the deadline, then an error, never the old value
taken; a counter whose value arrived without its tag is no value at all.
Prints one line per check, ``PASS``/``FAIL``, and exits 1 on a failure.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))  # record_support: one inline publish

import torch  # noqa: E402

from fsdist.errors import FsdistTimeoutError, ProtocolError  # noqa: E402
from fsdist.files.counters import OwnCounter  # noqa: E402
from fsdist.files.direct import DirectRecord  # noqa: E402
from fsdist.protocol import state_record  # noqa: E402
from fsdist.transport.incoming import InlineMessage  # noqa: E402
from fsdist.transport.progress import Progress  # noqa: E402

from record_support import AliveWatch, publish_inline  # noqa: E402

CTX = mp.get_context("fork")
_INDEX = struct.Struct("<q")


def _progress(directory: str, rank: int) -> Progress:
    return Progress(directory, rank, 2, AliveWatch(), 5.0, record_kind=DirectRecord)


def _publishing(directory: str, seconds: float) -> None:
    writer = _progress(directory, 1)
    end, seq = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        seq += 1
        while writer.peer_state(0).seq < seq - 2 and time.monotonic() < end + 30:
            pass  # a slot is reused only once the reader is past it
        publish_inline(writer, seq, 1, float(seq))
    writer.close()


def race_position(writer_dir: str, reader_dir: str, seconds: float) -> str:
    reader = _progress(reader_dir, 0)
    writer = CTX.Process(target=_publishing, args=(writer_dir, seconds))
    writer.start()
    checked, deadline = 0, time.monotonic() + seconds + 60
    try:
        while writer.is_alive() and time.monotonic() < deadline:
            state = reader.peer_state(1)
            if state.seq <= 0 or state.closed:
                continue
            while reader.seq < state.seq:  # every operation, so the histories agree
                reader.enter(reader.seq + 1, state.description)
            found = reader.inline_message(1, 1)
            assert found is not None, f"operation {state.seq}: the step's slot was never found"
            with InlineMessage(found, "slot", reader.collective_seal(1, 1)) as msg:
                value = torch.empty(1)
                msg.read_into(0, value)
            assert msg.seq == state.seq and value.item() == float(state.seq), "a torn read was acted on"
            checked += 1
            reader.flush()
    finally:
        writer.join(timeout=60)
    assert writer.exitcode == 0, f"the writer failed ({writer.exitcode})"
    assert checked > 20, f"only {checked} operations read"
    return f"{checked} operations read, each header and slot whole"


def _message(index: int) -> bytes:
    return _INDEX.pack(index) * 200  # 1600 bytes: most of a slot


def _sending(directory: str, seconds: float) -> None:
    writer = _progress(directory, 1)
    check, area, offset = writer.seals[1], bytearray(state_record.PAIR_AREA), state_record.pair_offset(0)
    end, sent = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        sent += 1
        end_of = state_record.put_p2p(area, sent, 0, sent, _message(sent), 0, check)
        writer.write_own(bytes(area[:end_of]), offset)
    writer.close()


def race_pair(writer_dir: str, reader_dir: str, seconds: float) -> str:
    reader = _progress(reader_dir, 0)
    check, offset = reader.seals[1], state_record.pair_offset(0)
    writer = CTX.Process(target=_sending, args=(writer_dir, seconds))
    writer.start()
    checked, last = 0, 0
    try:
        while writer.is_alive():
            raw, (sent, _), _ = reader.read_peer(
                1, offset, state_record.PAIR_AREA, lambda raw: state_record.decode_pair(raw, 0, check)
            )
            if sent == 0:
                continue
            assert sent >= last, f"sent went back from {last} to {sent}: an older write taken for newer"
            try:
                found = state_record.find_p2p(raw, sent)
            except ProtocolError:
                continue  # the slot torn by the next send (its CRC): read again
            if found is None:
                continue  # the slot already holds a later message: read again
            assert found == _message(sent), f"message {sent}'s slot holds other bytes"
            checked, last = checked + 1, sent
    finally:
        writer.join(timeout=60)
    assert writer.exitcode == 0, f"the writer failed ({writer.exitcode})"
    assert checked > 20, f"only {checked} messages read"
    return f"{checked} messages read, counters and slot agreeing"


def _counting(path: str, seconds: float, written: mp.Value) -> None:  # type: ignore[valid-type]
    counter, end = OwnCounter(path), time.monotonic() + seconds
    value = 0
    while time.monotonic() < end:
        value += 1
        written.value = value  # (before the write: a read can never be ahead of it)
        counter.set(value)
    counter.close()


def race_counter(writer_dir: str, reader_dir: str, seconds: float) -> str:
    name = "heartbeat.r1"
    written = CTX.Value("q", 0)
    OwnCounter(os.path.join(writer_dir, name)).close()  # (made before the reader opens it)
    writer = CTX.Process(target=_counting, args=(os.path.join(writer_dir, name), seconds, written))
    writer.start()
    reader = OwnCounter(os.path.join(reader_dir, name))
    reads, torn, last = 0, 0, 0
    try:
        while writer.is_alive():
            value = reader.try_get()
            reads += 1
            if value is None:
                torn += 1
                continue
            assert last <= value <= written.value, f"read {value} after {last}, {written.value} written"
            last = value
    finally:
        writer.join(timeout=60)
        reader.close()
    assert writer.exitcode == 0 and reads > 20, (writer.exitcode, reads)
    return f"{reads} reads, {torn} torn (taken as no beat), every other one a value written"


def cut_off_position(writer_dir: str, reader_dir: str) -> str:
    """Operation 2's header reached the record, its slot did not: rank 0 waits, then fails."""
    writer, reader = _progress(writer_dir, 1), _progress(reader_dir, 0)
    publish_inline(writer, 1, 1, 1.0)
    old = open(os.path.join(writer_dir, "state.r1"), "rb").read()
    publish_inline(writer, 2, 1, 2.0)
    new = open(os.path.join(writer_dir, "state.r1"), "rb").read()
    with open(os.path.join(writer_dir, "state.r1"), "r+b") as record:  # the old bytes but the new header
        record.write(new[: state_record.HEADER_SIZE] + old[state_record.HEADER_SIZE :])
    reader.timeout = 2.0
    reader.enter(1, writer.description)
    reader.enter(2, writer.description)
    start = time.monotonic()
    try:
        found = reader.inline_message(1, 1)
    except FsdistTimeoutError as exc:
        assert "slot" in str(exc), exc
        return f"refused after {time.monotonic() - start:.1f} s: {str(exc)[:90]}..."
    raise AssertionError(f"a header without its slot was taken: {found!r}")


def cut_off_counter(writer_dir: str, reader_dir: str) -> str:
    path = os.path.join(writer_dir, "heartbeat.r2")
    counter = OwnCounter(path)
    counter.set(7)
    with open(path, "r+b") as f:  # the value of 8 arrived, its tag did not
        f.write(_INDEX.pack(8))
    seen = OwnCounter(os.path.join(reader_dir, "heartbeat.r2")).try_get()
    assert seen is None, f"a counter without its tag read as {seen}"
    return "a value without its tag is no value"


def main() -> int:
    writer_dir, reader_dir, seconds, label = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    failed = 0
    checks = [
        ("position", lambda w, r: race_position(w, r, seconds)),
        ("pair", lambda w, r: race_pair(w, r, seconds)),
        ("counter", lambda w, r: race_counter(w, r, seconds)),
        ("cut-off position", cut_off_position),
        ("cut-off counter", cut_off_counter),
    ]
    for number, (name, check) in enumerate(checks):
        folder = f"torn-{number}"
        os.makedirs(os.path.join(writer_dir, folder), mode=0o700)
        try:
            what = check(os.path.join(writer_dir, folder), os.path.join(reader_dir, folder))
            print(f"torn {name} PASS ({label}): {what}", flush=True)
        except (AssertionError, ProtocolError, OSError) as exc:
            failed += 1
            print(f"torn {name} FAIL ({label}): {type(exc).__name__}: {exc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
