"""Every reader of the shared directory against random, truncated, bit-flipped and oversized input.

Whatever another process (or a full disk, or another user) left in a file, a parser answers
with its format's own error naming the fault, or with a value: never another kind of exception
(a struct.error, IndexError, UnicodeDecodeError, RecursionError), never a hang, never an
allocation sized by a field it has not checked. Where a format carries a checksum (a message
header, a state record's header and slots, a pair area's counters, a counter), a flipped bit is
an error, never a different value.

Bounded here (FSDIST_FUZZ_EXAMPLES per test, default 200: ~10 s); `make test-fuzz` runs 10,000
per format.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fsdist.c10d.store import DirectoryStore
from fsdist.c10d.store_rendezvous import _parse_member
from fsdist.errors import FsdistError, ProtocolError, RendezvousError
from fsdist.files.counters import Counter, decode_counter, encode_counter
from fsdist.files.seal import TAG_BYTES, seal
from fsdist.protocol import failure_report, layout, message, node_ranks, rendezvous_record, state_record
from fsdist.protocol.sealed import seal_json, seal_value, unseal_json
from fsdist.transport.incoming import FileMessage, InlineMessage, RingMessage

EXAMPLES = int(os.environ.get("FSDIST_FUZZ_EXAMPLES", "200"))
FUZZ = settings(  # no example database: nothing written beside the tests
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
)


def _mutations(valid: bytes) -> st.SearchStrategy[bytes]:
    """Random bytes; ``valid`` truncated; with bits flipped; with bytes appended or overwritten."""
    cut = st.integers(0, len(valid)).map(lambda n: valid[:n])
    flips = st.lists(st.integers(0, max(0, len(valid) * 8 - 1)), min_size=1, max_size=4).map(
        lambda bits: _flip(valid, bits)
    )
    overwrite = st.tuples(st.integers(0, max(0, len(valid) - 1)), st.binary(min_size=1, max_size=16)).map(
        lambda at: valid[: at[0]] + at[1] + valid[at[0] + len(at[1]) :]
    )
    grown = st.binary(min_size=1, max_size=4096).map(lambda extra: valid + extra)
    return st.one_of(st.binary(max_size=4096), cut, flips, overwrite, grown)


def _flip(raw: bytes, bits: list[int]) -> bytes:
    out = bytearray(raw)
    for bit in bits:
        if out:
            out[(bit // 8) % len(out)] ^= 1 << (bit % 8)
    return bytes(out)


# ---- message (files, inline slots, point-to-point slots) ------------------------------------

_TENSORS = [torch.arange(6, dtype=torch.float32).view(2, 3), torch.tensor(7, dtype=torch.int64), torch.zeros(0)]
CRC = seal("fuzz")  # the check without FSDIST_SECRET_FILE (tests/test_mac.py: with one)
VALID_MESSAGE = b"".join(bytes(b) for b in message.encode(12, 3, "all_reduce SUM float32[2, 3]", _TENSORS, CRC, 16))


def _with_crc(raw: bytes) -> bytes:
    """``raw`` with its header checksum made right again, so the checks behind it are reached."""
    if len(raw) < message._FIXED.size:
        return raw
    header_len = message._FIXED.unpack_from(raw)[5]
    if not message._FIXED.size + TAG_BYTES <= header_len <= len(raw):
        return raw
    body = raw[: header_len - TAG_BYTES]
    return body + CRC.tag(body) + raw[header_len:]


def _read_message(raw: bytes) -> None:
    msg = InlineMessage(raw, "fuzz", CRC)
    for index, part in enumerate(msg.parts):
        dest = torch.empty(part.nbytes, dtype=torch.uint8)
        msg.read_into(index, dest)


@FUZZ
@given(raw=_mutations(VALID_MESSAGE))
def test_a_message_is_read_or_refused_with_a_protocol_error(raw: bytes) -> None:
    try:
        msg = InlineMessage(raw, "fuzz", CRC)
    except ProtocolError:
        return
    # a header that passed its checksum is the one written: same seq, tag, description, parts
    assert (msg.seq, msg.tag, msg.description) == (12, 3, "all_reduce SUM float32[2, 3]")
    assert [p.shape for p in msg.parts] == [(2, 3), (), (0,)]


@FUZZ
@given(raw=_mutations(VALID_MESSAGE).map(_with_crc))
def test_a_message_with_a_forged_checksum_is_read_or_refused_with_a_protocol_error(raw: bytes) -> None:
    """Past the checksum (a forger, or a writer's bug): descriptors are still checked one by one."""
    try:
        _read_message(raw)
    except ProtocolError:
        pass


@FUZZ
@given(raw=_mutations(VALID_MESSAGE), name=st.sampled_from(["file"]))
def test_a_message_file_is_read_or_refused_with_a_protocol_error(tmp_path_factory, raw: bytes, name: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / name
    path.write_bytes(_with_crc(raw))
    try:
        with FileMessage(str(path), CRC) as msg:
            for index, part in enumerate(msg.parts):
                if 0 <= part.nbytes <= 1 << 20:  # what a reader would ask for: a tensor it owns
                    msg.read_into(index, torch.empty(part.nbytes, dtype=torch.uint8))
    except ProtocolError:
        pass
    except OSError as exc:
        pytest.fail(f"an OSError, not a ProtocolError: {exc}")


_RING = 8192
VALID_RING_REF = message.encode_ring_ref(128, len(VALID_MESSAGE))


@FUZZ
@given(ref=_mutations(VALID_RING_REF), raw=_mutations(VALID_MESSAGE).map(_with_crc))
def test_a_ring_reference_and_its_message_are_read_or_refused_with_a_protocol_error(
    tmp_path_factory, ref: bytes, raw: bytes
) -> None:
    """A slot pointing into a peer's ring (transport/rings.py): the reference is checked against
    the ring's size before anything is read, the message there like any other; the file may be
    shorter than the ring says (never an OSError or a read past what was checked)."""
    path = tmp_path_factory.mktemp("ring") / "ring"
    path.write_bytes(bytes(128) + raw)
    fd = os.open(path, os.O_RDONLY)
    try:
        found = message.parse_ring_ref(ref, _RING, "fuzz")
        if found is None:
            assert not ref.startswith(message.RING_MAGIC)
            return
        offset, length = found
        assert offset >= 0 and offset + length <= _RING
        msg = RingMessage(fd, offset, length, "fuzz", CRC)
        for index, part in enumerate(msg.parts):
            assert part.offset + part.nbytes <= length
            msg.read_into(index, torch.empty(part.nbytes, dtype=torch.uint8))
        msg.keep()
    except ProtocolError:
        pass
    except OSError as exc:
        pytest.fail(f"an OSError, not a ProtocolError: {exc}")
    finally:
        os.close(fd)


# ---- state records ----------------------------------------------------------------------------

VALID_RECORD = state_record.encode(41, 2, "broadcast float32[4] root=0", 0x1234, state_record.FLAG_CLOSED, CRC)
#: a record's position part as a peer reads it: the header, then slot 1 holding a message of step 1
VALID_POSITION = bytearray(state_record.POSITION_SIZE)
VALID_POSITION[: len(VALID_RECORD)] = VALID_RECORD
_SLOT = state_record.encode_slot(41, 1, VALID_MESSAGE)
VALID_POSITION[state_record.slot_offset(1) : state_record.slot_offset(1) + len(_SLOT)] = _SLOT
WRITTEN_STATE = state_record.decode(VALID_RECORD, "fuzz", CRC)


@FUZZ
@given(raw=_mutations(bytes(VALID_POSITION)))
def test_a_state_record_is_read_or_refused_with_a_protocol_error(raw: bytes) -> None:
    """Header and slots are checksummed: what is read is what was written, or refused."""
    try:
        state = state_record.decode(raw, "fuzz", CRC)
        assert state == WRITTEN_STATE or (state is state_record.NOT_STARTED and len(raw) < 32)
    except ProtocolError:
        pass
    for seq in (0, 41):
        try:
            found = state_record.find_inline(raw, seq, 1)
        except ProtocolError:
            continue
        assert found is None or (seq == 41 and found == VALID_MESSAGE)


VALID_PAIR = bytearray(state_record.PAIR_AREA)
state_record.put_p2p(VALID_PAIR, 5, 2, 4, VALID_MESSAGE, 1, CRC)


@FUZZ
@given(raw=_mutations(bytes(VALID_PAIR)), index=st.sampled_from([4, 6, 1 << 40]))
def test_a_pair_area_is_read_or_refused_with_a_protocol_error(raw: bytes, index: int) -> None:
    """The counters and each slot are checksummed: the written values, or refused."""
    try:
        counters = state_record.decode_pair(raw, 1, CRC)
        never_written = not any(raw[: state_record.PAIR_COUNTERS_SIZE])
        assert counters == (5, 2) or (counters == (0, 0) and never_written)
    except ProtocolError:
        pass
    try:
        found = state_record.find_p2p(raw, index)
    except ProtocolError:
        return
    assert found is None or (index == 4 and found == VALID_MESSAGE)


@FUZZ
@given(raw=_mutations(encode_counter(123456789, "heartbeat.r0")))
def test_a_counter_is_read_or_refused_with_a_protocol_error(raw: bytes) -> None:
    """A counter is checksummed: its value, 0 for an empty file, or refused."""
    try:
        value = decode_counter(raw, "heartbeat.r0")
    except ProtocolError:
        return
    assert value == 123456789 or (value == 0 and raw == b"")


# ---- JSON records: rendezvous, failure reports, store members ---------------------------------
# Each sealed record is tested two ways: damaged (mutations of a valid record: refused, or read as
# the very record written), and forged (any JSON under a valid seal: the parser's field checks).

_MEMBER = {"host": "h", "pid": 10, "start_time": 5, "nonce": "ab" * 8, "machine": "m", "node": "n"}
RENDEZVOUS_STATE = {
    "format": 1, "generation": "0123456789abcdef", "world_size": 2, "complete": True,
    "members": {"0": _MEMBER, "1": {**_MEMBER, "pid": 11}}, "replaced": ["fedcba9876543210"],
}  # fmt: skip
VALID_RENDEZVOUS = rendezvous_record.encode(RENDEZVOUS_STATE, "/")  # (the codec alone: no secret, no binding checked)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


def _json_variants(valid: dict, identity: str | None) -> st.SearchStrategy[bytes]:
    """``valid`` with one top-level or member field replaced by arbitrary JSON, or removed, under a
    valid seal of ``identity`` (the record's), or as plain JSON (None)."""
    keys = sorted(valid)
    dump = (lambda obj: seal_json(obj, identity)) if identity else (lambda obj: json.dumps(obj).encode())
    replaced = st.tuples(st.sampled_from(keys), _JSON).map(lambda kv: dump({**valid, kv[0]: kv[1]}))
    removed = st.sampled_from(keys).map(lambda k: dump({n: v for n, v in valid.items() if n != k}))
    return st.one_of(replaced, removed, _JSON.map(dump))


def _damaged_or_forged(valid: bytes, fields: dict, identity: str) -> st.SearchStrategy[tuple[bytes, bool]]:
    """(raw, damaged): ``valid`` mutated (True), or a forged record under a valid seal (False)."""
    return st.one_of(
        _mutations(valid).map(lambda raw: (raw, raw != valid)),
        _json_variants(fields, identity).map(lambda raw: (raw, False)),
    )


@FUZZ
@given(case=_damaged_or_forged(VALID_RENDEZVOUS, RENDEZVOUS_STATE, layout.RENDEZVOUS_FILE))
@example(
    case=(
        seal_json(json.loads(json.dumps(RENDEZVOUS_STATE).replace('"1": {', '"\\u00b2": {')), layout.RENDEZVOUS_FILE),
        False,
    )
)
def test_a_rendezvous_record_is_read_or_refused_as_corrupt(case: tuple[bytes, bool]) -> None:
    """(The example: a Unicode digit as a rank, found at 10,000.)"""
    raw, damaged = case
    try:
        state = rendezvous_record.parse(raw, "/")
    except rendezvous_record.CorruptRecordError:
        return
    assert not damaged or state == RENDEZVOUS_STATE or (state == {} and raw == b"")
    if state:  # what parse lets through is what the readers rely on
        assert isinstance(state["world_size"], int) and isinstance(state["members"], dict)
        for member in state["members"].values():
            assert isinstance(member["pid"], int) and isinstance(member["host"], str)


REPORT = {"rank": 3, "exit_code": 1, "type": "RuntimeError", "message": "x", "time": 1.5}
VALID_REPORT = failure_report.encode(REPORT)


@FUZZ
@given(case=_damaged_or_forged(VALID_REPORT, REPORT, "failure report"))
def test_a_failure_report_is_read_or_refused_with_a_value_error(case: tuple[bytes, bool]) -> None:
    raw, damaged = case
    try:
        report = failure_report.parse(raw)
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors too
        return
    assert not damaged or report == REPORT
    assert all(isinstance(report.get(k), int) for k in ("rank", "exit_code") if k in report)


NODE_RANKS_PATH = "/shared/run/.launch/gen-0123456789abcdef/nproc.n1.json"
VALID_NODE_RANKS = node_ranks.encode(NODE_RANKS_PATH, 1, 3)


@FUZZ
@given(case=_damaged_or_forged(VALID_NODE_RANKS, {"node": 1, "nproc": 3}, layout.identity(NODE_RANKS_PATH)))
def test_a_node_rank_count_is_read_or_refused_with_a_value_error(case: tuple[bytes, bool]) -> None:
    raw, damaged = case
    try:
        nproc = node_ranks.parse(raw, NODE_RANKS_PATH, 1)
    except ValueError:
        return
    assert not damaged or nproc == 3
    assert type(nproc) is int and 1 <= nproc <= node_ranks.MAX_RANKS_PER_NODE


def test_a_node_rank_count_is_bound_to_its_node() -> None:
    """Copied to another node's name, a valid record is refused (into another round's folder too,
    with FSDIST_SECRET_FILE: its MAC covers the file's identity, as every record's does)."""
    with pytest.raises(ValueError, match="is not node 0's record"):
        node_ranks.parse(VALID_NODE_RANKS, NODE_RANKS_PATH.replace("n1", "n0"), 0)


VALID_ROUNDS = failure_report.add_round(b"", "0123456789abcdef", 3, 0, {"rank": 2, "exit_code": -9, "host": "h"})
ROUNDS = failure_report.parse_rounds(VALID_ROUNDS)


@FUZZ
@given(
    case=_damaged_or_forged(VALID_ROUNDS, json.loads(unseal_json(VALID_ROUNDS, "restart history")), "restart history")
)
def test_a_restart_history_is_read_or_refused_with_a_value_error(case: tuple[bytes, bool]) -> None:
    raw, damaged = case
    try:
        history = failure_report.parse_rounds(raw)
    except ValueError:
        return
    assert not damaged or history == ROUNDS
    assert isinstance(history["job"], str) and isinstance(history["max_restarts"], int)
    for entry in history["rounds"]:
        assert isinstance(entry["round"], int) and entry["round"] >= 0
        assert all(isinstance(entry.get(k), int) for k in ("rank", "exit_code") if k in entry)
    # the launchers' update of it never fails either: a damaged history is started afresh
    assert failure_report.add_round(raw, "another job", 1, 0, {"rank": 0}) is not None


# ---- store values (DirectoryStore key files) ---------------------------------------------------

STORE_VALUE = json.dumps({"generation": "0123456789abcdef", "local_root": ""}).encode()


@FUZZ
@given(raw=_mutations(seal_value(STORE_VALUE, layout.key_to_filename("fsdist/generation"))))
def test_a_store_value_is_read_or_refused_with_a_protocol_error(tmp_path_factory, raw: bytes) -> None:
    """A key file holds its value and the value's CRC: what ``get`` returns is what was set."""
    store = DirectoryStore(str(tmp_path_factory.mktemp("store")), timedelta(seconds=1))
    with open(os.path.join(store.directory, layout.key_to_filename("fsdist/generation")), "wb") as key_file:
        key_file.write(raw)
    try:
        value = store.get("fsdist/generation")
    except ProtocolError as exc:
        assert "fsdist/generation" in str(exc)  # it names the key and its file
        return
    assert value == STORE_VALUE


_STORE_MEMBER = {"format": 1, "world_size": 2, "root": "/r", "host": "h", "pid": 1, "start_time": 2, "machine": "m",
                 "nonce": "cd" * 8, "node": "n"}  # fmt: skip


@FUZZ
@given(raw=st.one_of(_mutations(json.dumps(_STORE_MEMBER).encode()), _json_variants(_STORE_MEMBER, None)))
def test_a_store_member_entry_is_read_or_refused_with_a_rendezvous_error(raw: bytes) -> None:
    try:
        member = _parse_member(raw, 1)
    except RendezvousError:
        return
    assert isinstance(member["world_size"], int) and isinstance(member["pid"], int)


# ---- what lies at a path: another type, another owner, another mode, a huge sparse file ---------
#
# Every file fsdist opens goes through a handful of primitives (files/io.py ``open_file``,
# ``read_file``; files/locks.py records and ``read_locked``; files/trust.py ``make_private_dir``;
# files/doorbell.py's FIFOs; test_every_open_goes_through_the_checked_primitives holds that). Each
# reader below is a real consumer of one of them, and each swap is what another user, a damaged
# run or an accident could leave there. Every case runs in a forked child with a deadline: it must
# end, with the file's value or an FsdistError naming it; never a hang, a MemoryError, or
# another kind of exception.

SWAPS = ["fifo", "directory", "symlink", "socket", "sparse 16 GiB", "foreign owner", "mode 0666", "mode 0620"]
#: swaps that must be refused outright wherever fsdist expects its own regular file
REFUSED = {"fifo", "directory", "symlink", "socket", "foreign owner", "mode 0666", "mode 0620"}
_OTHERS = 12345  # a group that is not the user's own (root may give a file to it)
_CASE_SECONDS = 20.0


def _swap(path: str, kind: str, valid: bytes) -> None:
    """Put ``kind`` at ``path`` (where fsdist expects a file holding ``valid``)."""
    import socket

    if os.path.lexists(path):
        os.unlink(path)
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "directory":
        os.mkdir(path, 0o700)
    elif kind == "symlink":
        with open(path + ".real", "wb") as real:
            real.write(valid)
        os.symlink(path + ".real", path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(path)
    else:
        with open(path, "wb") as f:
            f.write(valid)
            if kind == "sparse 16 GiB":
                f.truncate(16 << 30)
        if kind == "foreign owner":
            os.chown(path, 1002, 1002)
        elif kind.startswith("mode"):
            os.chmod(path, int(kind.split()[1], 8))
            if kind == "mode 0620":  # a group of others (not the user's own private group)
                os.chown(path, -1, _OTHERS)


def _rendezvous(directory: str) -> object:
    from fsdist.job.rendezvous import rendezvous

    generation = rendezvous(directory, 0, 1, timedelta(seconds=5))
    generation.leave()
    return generation.generation_id


def _store_get(directory: str) -> object:
    return DirectoryStore(directory, timedelta(seconds=2)).get("key")


def _store_add(directory: str) -> object:
    return DirectoryStore(directory, timedelta(seconds=2)).add("count", 1)


def _message(directory: str) -> object:
    with FileMessage(os.path.join(directory, "m0.1.r0"), CRC) as msg:
        return msg.seq


def _state_record(directory: str) -> object:
    from fsdist.files.locks import LockedRecord

    with LockedRecord(os.path.join(directory, "state.r1"), create=False) as record:
        return len(record.read(0, state_record.POSITION_SIZE))


def _counter(directory: str) -> object:
    with Counter(os.path.join(directory, "heartbeat.r0")) as counter:
        return counter.get()


def _abort_record(directory: str) -> object:
    from fsdist.files.locks import LockedRecord

    with LockedRecord(os.path.join(directory, layout.ABORT_FILE)) as record:
        return len(record.read())


def _status(directory: str) -> object:
    from fsdist.inspect.status import read_status

    return read_status(directory).state


def _doorbell(directory: str) -> object:
    from fsdist.files.doorbell import Doorbell

    bell = Doorbell([os.path.join(directory, "wake.r0")], 0)
    bell.close()
    return "opened"


def _run_directory(directory: str) -> object:
    return _rendezvous(os.path.join(directory, "run"))


def _node_folder(directory: str) -> object:
    from fsdist.files.places import node_directory

    os.environ["FSDIST_LOCAL_DIR"] = directory
    return node_directory()


def _secret_file(directory: str) -> object:
    os.environ["FSDIST_SECRET_FILE"] = os.path.join(directory, "secret")
    return seal("x").keyed


_VALID_RECORD = rendezvous_record.encode(
    {"format": 1, "generation": "0123456789abcdef", "world_size": 1, "members": {}, "complete": False}, "/"
)  # (valid wherever it lies: without a secret the directory it is bound to is not checked)
#: reader: (the path it reads, relative to its directory; valid content there; the reader)
READERS = {
    "rendezvous record": (layout.RENDEZVOUS_FILE, _VALID_RECORD, _rendezvous),
    "store value": (layout.key_to_filename("key"), seal_value(b"v", layout.key_to_filename("key")), _store_get),
    "store lock": (layout.STORE_LOCK_FILE, b"", _store_add),
    "message file": ("m0.1.r0", VALID_MESSAGE, _message),
    "state record": ("state.r1", b"", _state_record),
    "counter": ("heartbeat.r0", encode_counter(3, "heartbeat.r0"), _counter),
    "abort record": (layout.ABORT_FILE, b"why", _abort_record),
    "status: rendezvous record": (layout.RENDEZVOUS_FILE, _VALID_RECORD, _status),
    "doorbell FIFO": ("wake.r0", b"", _doorbell),
    "run directory": ("run", b"", _run_directory),
    "node-local folder": (f"fsdist-{os.geteuid()}", b"", _node_folder),
    "secret file": ("secret", os.urandom(32), _secret_file),
}
#: where a directory, not a file, is expected: a directory is the valid thing, a file is a swap
_DIRECTORIES = {"run directory", "node-local folder"}
#: where a FIFO is expected
_FIFOS = {"doorbell FIFO"}


def _outcome(reader: str, kind: str, directory: str) -> dict[str, object]:
    """Swap, read, and say how it ended (in a forked child: a hang is killed at the deadline)."""
    name, valid, read = READERS[reader]
    path = os.path.join(directory, name)
    if (reader in _DIRECTORIES and kind == "directory") or (reader in _FIFOS and kind == "fifo"):
        return {"skip": "that is what belongs there"}
    if reader in _DIRECTORIES and kind in ("sparse 16 GiB", "foreign owner", "mode 0666", "mode 0620"):
        os.mkdir(path, 0o700)  # the same swaps, on a directory
        if kind == "foreign owner":
            os.chown(path, 1002, 1002)
        elif kind.startswith("mode"):
            os.chmod(path, int(kind.split()[1], 8) | 0o100)
            if kind == "mode 0620":
                os.chown(path, -1, _OTHERS)
        else:
            os.rmdir(path)
            _swap(path, kind, valid)
    else:
        _swap(path, kind, valid)
    try:
        return {"value": repr(read(directory))}
    except FsdistError as exc:
        return {"refused": f"{type(exc).__name__}: {exc}"}
    except BaseException as exc:  # noqa: BLE001 - the kind of error is what is checked
        return {"other": f"{type(exc).__name__}: {exc}"}


def _in_child(reader: str, kind: str, directory: str, write_end: int) -> None:
    os.write(write_end, json.dumps(_outcome(reader, kind, directory)).encode()[:60000])


@pytest.mark.parametrize("kind", SWAPS)
@pytest.mark.parametrize("reader", list(READERS))
def test_whatever_lies_where_a_file_belongs_ends_in_a_clear_error(tmp_path, reader: str, kind: str) -> None:
    import multiprocessing

    if kind in ("foreign owner", "mode 0620") and os.geteuid() != 0:
        pytest.skip("chown to another user or group needs root (CI runs as root)")
    read_end, write_end = os.pipe()
    child = multiprocessing.get_context("fork").Process(target=_in_child, args=(reader, kind, str(tmp_path), write_end))
    child.start()
    os.close(write_end)
    child.join(_CASE_SECONDS)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"{reader} with a {kind}: still running after {_CASE_SECONDS:.0f} s (a hang)")
    raw = os.read(read_end, 65536)
    os.close(read_end)
    assert raw, f"{reader} with a {kind}: the child died (exit code {child.exitcode})"
    outcome = json.loads(raw)
    if "skip" in outcome:
        return
    assert "other" not in outcome, f"{reader} with a {kind}: {outcome['other']}"
    followed = reader in _DIRECTORIES or reader == "secret file"  # (a link of the user's own may lead to it)
    if kind in REFUSED and not (followed and kind == "symlink"):
        assert "refused" in outcome, f"{reader} with a {kind} was adopted: {outcome}"
        assert str(tmp_path) in outcome["refused"], outcome["refused"]  # it names the path


def test_every_open_goes_through_the_checked_primitives() -> None:
    """No module opens a path in the shared places but through the primitives that check what
    they opened (files/io.py, files/trust.py, files/places.py, files/doorbell.py) or reads only /proc, its own
    reports, or files a command's user named."""
    import ast
    from pathlib import Path

    import fsdist

    allowed = {
        "files/io.py",
        "files/trust.py",
        "files/places.py",
        "files/doorbell.py",
        "files/locks.py",
        "files/seal.py",
    }
    # not the shared places: /proc and this machine's own files; the bench's and probes' own scratch
    elsewhere = {"job/liveness.py", "files/mountinfo.py", "fs/mounts.py", "fs/fuse_kinds.py", "c10d/intraop.py",
                 "cli/ranks.py", "cli/bench/report.py", "cli/bench/rank.py", "cli/bench/command.py",
                 "fs/probes.py"}  # fmt: skip
    package = Path(fsdist.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = str(path.relative_to(package))
        if relative in allowed | elsewhere:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name):
                    owner, name = "", func.id
                elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                    owner, name = func.value.id, func.attr
                else:
                    continue
                if (owner, name) in {("os", "open"), ("", "open"), ("os", "mkfifo"), ("os", "mkdir")}:
                    found.append(f"{relative}:{node.lineno} {owner + '.' if owner else ''}{name}")
    assert not found, f"opens outside the checked primitives: {found}"
