"""The on-disk formats (fsdist/protocol/): message encoding, state record slots and pair areas,
flags, every dtype; parsed from bytes, with damaged and lying fields refused."""

from __future__ import annotations

import struct

import pytest
import torch

from fsdist.errors import ProtocolError
from fsdist.files.io import publish
from fsdist.files.seal import seal
from fsdist.protocol import message, state_record
from fsdist.transport.incoming import FileMessage, InlineMessage

CRC = seal("test")  # the check without FSDIST_SECRET_FILE: a CRC-32 (tests/test_mac.py tries the MAC)


def test_inline_messages_round_trip_and_damaged_slots_are_refused() -> None:
    """Small messages in a state record's slots: found by (seq, step), parsed and bounded."""
    tensors = [torch.arange(5, dtype=torch.int16), torch.tensor(2.5, dtype=torch.float64), torch.empty(0)]
    raw = b"".join(message.encode(9, 0, "all_gather float64[]", tensors, CRC, message.INLINE_ALIGN))
    assert len(raw) == message.encoded_size("all_gather float64[]", tensors, CRC, message.INLINE_ALIGN)
    assert len(raw) <= state_record.INLINE_MAX
    record = bytearray(state_record.POSITION_SIZE)
    slot = state_record.encode_slot(9, 2, raw)
    record[state_record.slot_offset(3) : state_record.slot_offset(3) + len(slot)] = slot
    assert state_record.find_inline(bytes(record), 9, 1) is None  # other step
    assert state_record.find_inline(bytes(record), 8, 2) is None  # a stale slot of another operation
    found = state_record.find_inline(bytes(record), 9, 2)
    assert found == raw
    msg = InlineMessage(found, "record", CRC)
    assert (msg.seq, msg.description, [p.shape for p in msg.parts]) == (9, "all_gather float64[]", [(5,), (), (0,)])
    out = torch.empty(5, dtype=torch.int16)
    msg.read_into(0, out)
    assert out.equal(tensors[0])
    with msg.mapped(1, torch.empty((), dtype=torch.float64)) as value:
        assert value.item() == 2.5
    with pytest.raises(ValueError):
        state_record.encode_slot(1, 1, bytes(state_record.INLINE_MAX + 1))
    lying = bytearray(record)
    struct.pack_into("<qII", lying, state_record.slot_offset(3), 9, 2, state_record.INLINE_SLOT_BYTES * 4)
    with pytest.raises(ProtocolError, match="claims"):
        state_record.find_inline(bytes(lying), 9, 2)
    with pytest.raises(ProtocolError):
        InlineMessage(raw[:-8], "record", CRC)  # a part now ends outside the message
    with pytest.raises(ProtocolError):
        InlineMessage(raw[:40], "record", CRC)  # the header itself is cut


def test_pair_areas_carry_both_counters_and_small_point_to_point_messages() -> None:
    """A pair area: (sent, received), then message i in slot i mod P2P_SLOTS, found by index."""
    first = b"".join(message.encode(4, 7, "send tag=7", [torch.arange(3)], CRC, message.INLINE_ALIGN))
    second = b"".join(message.encode(5, 7, "send tag=7", [torch.ones(2)], CRC, message.INLINE_ALIGN))
    area = bytearray(state_record.PAIR_AREA)
    end = state_record.put_p2p(area, 5, 2, 4, first, 1, CRC)
    assert end == state_record.p2p_slot_end(4) - state_record.P2P_SLOT_BYTES + 20 + len(first)
    state_record.put_p2p(area, 6, 3, 5, second, 1, CRC)
    assert state_record.decode_pair(bytes(area), 1, CRC) == (6, 3)
    assert state_record.find_p2p(bytes(area), 4) == first and state_record.find_p2p(bytes(area), 5) == second
    assert state_record.find_p2p(bytes(area), 6) is None  # slot 0 holds message 4: 6 is a file
    assert state_record.decode_pair(b"", 1, CRC) == (0, 0)  # never written: nothing sent, nothing received
    assert state_record.find_p2p(b"", 0) is None
    counters = state_record.PAIR_COUNTERS_SIZE
    lying = bytearray(area)
    struct.pack_into("<qII", lying, counters, 4, 0, state_record.P2P_SLOT_BYTES * 2)
    with pytest.raises(ProtocolError, match="claims"):
        state_record.find_p2p(bytes(lying), 4)
    with pytest.raises(ProtocolError, match="negative"):
        state_record.decode_pair(state_record.encode_pair(-1, 0, 1, CRC), 1, CRC)
    # every field a reader acts on is checksummed: one flipped bit is refused, never another value
    for flipped_at, read in [
        (3, lambda raw: state_record.decode_pair(raw, 1, CRC)),
        (counters + 20 + 40, lambda raw: state_record.find_p2p(raw, 4)),
    ]:
        flipped = bytearray(area)
        flipped[flipped_at] ^= 0x10
        with pytest.raises(ProtocolError, match="checksum"):
            read(bytes(flipped))


def test_a_records_flags_say_closed_and_aborted() -> None:
    for flags, closed, aborted in [(0, False, False), (1, True, False), (2, False, True), (3, True, True)]:
        state = state_record.decode(state_record.encode(3, 1, "barrier", 0, flags, CRC), "record", CRC)
        assert (state.closed, state.aborted) == (closed, aborted)


def test_every_dtype_round_trips(tmp_path) -> None:
    for dtype in message.DTYPE_CODE:
        if dtype.is_floating_point or dtype.is_complex:
            tensor = (
                torch.randn(3, 4, dtype=torch.float64).to(dtype)
                if not dtype.is_complex
                else torch.randn(3, 4, dtype=dtype)
            )
        elif dtype == torch.bool:
            tensor = torch.tensor([[True, False], [False, True]])
        else:
            tensor = torch.arange(12).to(dtype).reshape(3, 4)
        path = publish(str(tmp_path), "m", message.encode(7, -3, "d", [tensor], CRC))
        with FileMessage(path, CRC) as msg:
            assert (msg.seq, msg.tag, msg.parts[0].dtype, msg.parts[0].shape) == (7, -3, dtype, tuple(tensor.shape))
            out = torch.empty_like(tensor)
            msg.read_into(0, out)
            assert out.view(torch.uint8).equal(tensor.view(torch.uint8))


def test_header_layout_is_little_endian_and_fixed(tmp_path) -> None:
    path = publish(str(tmp_path), "m", message.encode(5, 9, "ab", [torch.zeros(2, dtype=torch.int32)], CRC))
    raw = open(path, "rb").read()
    magic, version, nparts, seq, tag = struct.unpack_from("<4sHHqq", raw)
    assert (magic, version, nparts, seq, tag) == (b"FSDM", 2, 1, 5, 9)
