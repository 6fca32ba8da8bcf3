"""FSDIST_SECRET_FILE: every check becomes a keyed MAC bound to the item's identity, so what a
forger without the secret writes (a correct CRC is no help), or a valid item moved to another
file, is refused; FSDIST_MAC_PAYLOADS=1 covers payloads too. In one process for each format,
then in real jobs: a forgery is refused on every rank, naming it."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from fsdist.errors import FsdistError, ProtocolError
from fsdist.files import seal as seal_module
from fsdist.files.counters import decode_counter, encode_counter
from fsdist.files.seal import CHUNK_BYTES, Sealer, seal
from fsdist.protocol import message, rendezvous_record, state_record
from fsdist.protocol.sealed import seal_json, seal_value, unseal_json, unseal_value
from fsdist.transport.incoming import FileMessage, InlineMessage

from harness import RankPool
from in_rank import mac as cases_mac

CRC = Sealer(None, "none").seal("")  # what a forger without the secret can compute


@pytest.fixture
def secret(tmp_path, monkeypatch) -> str:
    path = tmp_path / "secret"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    monkeypatch.setenv("FSDIST_SECRET_FILE", str(path))
    monkeypatch.delenv("FSDIST_MAC_PAYLOADS", raising=False)
    return str(path)


def test_every_format_refuses_what_was_sealed_without_the_secret(secret) -> None:
    where = "gen-0123456789abcdef/groups/k.0.0/state.r1"
    keyed = seal(where)
    assert keyed.keyed and len(keyed.tag(b"x")) == 16
    header = state_record.encode(3, 1, "barrier", 0, 0, keyed)
    assert state_record.decode(header, where, keyed).seq == 3
    with pytest.raises(ProtocolError, match="MAC mismatch"):
        state_record.decode(state_record.encode(3, 1, "barrier", 0, 0, CRC), where, keyed)
    with pytest.raises(ProtocolError, match="MAC mismatch"):
        state_record.decode_pair(state_record.encode_pair(5, 2, 1, CRC), 1, keyed)
    assert state_record.decode_pair(state_record.encode_pair(5, 2, 1, keyed), 1, keyed) == (5, 2)
    with pytest.raises(ProtocolError, match="MAC mismatch"):  # another pair area's counters, moved here
        state_record.decode_pair(state_record.encode_pair(5, 2, 0, keyed), 1, keyed)
    with pytest.raises(ProtocolError, match="MAC mismatch"):
        decode_counter(encode_counter(7, "heartbeat.r0", CRC), "heartbeat.r0")
    assert decode_counter(encode_counter(7, "heartbeat.r0"), "heartbeat.r0") == 7
    crc_sealed = b"v" + CRC.tag(b"v")
    with pytest.raises(ValueError, match="MAC mismatch"):
        unseal_value(crc_sealed, "k.key")
    assert unseal_value(seal_value(b"v", "k.key"), "k.key") == b"v"
    with pytest.raises(ValueError, match="MAC mismatch"):  # a value moved to another key's file
        unseal_value(seal_value(b"v", "k.key"), "k.other")
    forged = b'{"format": 1}\n#crc32=%08x\n' % int.from_bytes(CRC.tag(b'{"format": 1}')[:4], "little")
    with pytest.raises(rendezvous_record.CorruptRecordError, match="MAC mismatch"):
        rendezvous_record.parse(forged, "/")
    assert unseal_json(seal_json({"a": 1}, "x"), "x") == b'{"a": 1}'


def test_a_message_header_is_bound_to_its_identity(secret) -> None:
    mine = seal("gen-0123456789abcdef/groups/k.0.0/m5.1.r0")
    theirs = seal("gen-0123456789abcdef/groups/k.0.0/m5.1.r1")
    raw = b"".join(message.encode(5, 0, "all_reduce", [torch.arange(4.0)], mine, message.INLINE_ALIGN))
    assert InlineMessage(raw, "slot", mine).seq == 5
    with pytest.raises(ProtocolError, match="MAC mismatch"):  # rank 0's message where rank 1's belongs
        InlineMessage(raw, "slot", theirs)
    forged = b"".join(message.encode(5, 0, "all_reduce", [torch.arange(4.0)], CRC, message.INLINE_ALIGN))
    with pytest.raises(ProtocolError, match="MAC mismatch"):
        InlineMessage(forged, "slot", mine)


@pytest.mark.parametrize("numel", [3, CHUNK_BYTES // 4 * 3 + 5])
def test_payload_tags_catch_a_changed_byte_wherever_a_reader_reads(secret, tmp_path, monkeypatch, numel) -> None:
    monkeypatch.setenv("FSDIST_MAC_PAYLOADS", "1")
    check = seal("gen-0123456789abcdef/groups/k.0.0/p0-1.0")
    assert check.payloads
    tensor = torch.arange(numel, dtype=torch.float32)
    path = tmp_path / "m"
    path.write_bytes(b"".join(bytes(b) for b in message.encode(0, 0, "send", [tensor], check)))
    with FileMessage(str(path), check) as msg:
        last = msg.parts[0].offset + msg.parts[0].nbytes - 1  # the tensor's last byte
        whole = torch.empty(numel)
        msg.read_into(0, whole)
        assert whole.equal(tensor)
        part = torch.empty(numel // 3)  # a range that starts and ends inside chunks
        msg.read_into(0, part, byte_offset=4 * (numel // 3))
        assert part.equal(tensor[numel // 3 : 2 * (numel // 3)])
        with msg.mapped(0, torch.empty(numel)) as mapped:
            assert mapped.equal(tensor)
    raw = bytearray(path.read_bytes())
    raw[last] ^= 1  # the header is untouched
    path.write_bytes(bytes(raw))
    with FileMessage(str(path), check) as msg, pytest.raises(ProtocolError, match="MAC mismatch"):
        msg.read_into(0, torch.empty(numel))
    monkeypatch.setenv("FSDIST_MAC_PAYLOADS", "0")
    with pytest.raises(ProtocolError, match="FSDIST_MAC_PAYLOADS alike"):
        FileMessage(str(path), seal("gen-0123456789abcdef/groups/k.0.0/p0-1.0"))


@pytest.mark.parametrize(
    "mode,size,problem", [(0o644, 32, "other users can read"), (0o600, 8, "holds 8 bytes"), (0o600, 32, None)]
)
def test_a_secret_others_can_read_is_refused(tmp_path, monkeypatch, mode: int, size: int, problem: str | None) -> None:
    path = tmp_path / "secret"
    path.write_bytes(os.urandom(size))
    path.chmod(mode)
    monkeypatch.setenv("FSDIST_SECRET_FILE", str(path))
    if problem is None:
        assert seal("x").keyed
        return
    with pytest.raises(FsdistError, match=problem):
        seal("x")
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_payload_tags_need_a_secret(monkeypatch) -> None:
    monkeypatch.delenv("FSDIST_SECRET_FILE", raising=False)
    monkeypatch.setenv("FSDIST_MAC_PAYLOADS", "1")
    with pytest.raises(FsdistError, match="FSDIST_SECRET_FILE"):
        seal("x")


# ---- real jobs ----------------------------------------------------------------------------------


def _pool(tmp_path, payloads: bool = False) -> RankPool:
    secret = tmp_path / "secret"
    if not secret.exists():
        secret.write_bytes(os.urandom(32))
        secret.chmod(0o600)
    env = {"FSDIST_SECRET_FILE": str(secret), "FSDIST_MAC_PAYLOADS": "1" if payloads else "0"}
    return RankPool(2, env=env, group_timeout=30)


@pytest.mark.parametrize("payloads", [False, True], ids=["mac", "mac+payloads"])
def test_a_job_with_a_secret_gives_the_same_results(tmp_path, payloads: bool) -> None:
    pool = _pool(tmp_path, payloads)
    try:
        failures = pool.run(cases_mac.collectives_are_right, [1, 1000, 70_000, 1 << 20])
        assert failures == [[], []]
    finally:
        pool.close()


def _refused_on_every_rank(said: list[str], words: str) -> None:
    assert "MAC mismatch" in said[0] and words in said[0], said[0]
    assert "MAC mismatch" in said[1], said[1]  # the other rank names it too


def test_a_forged_message_is_refused_on_every_rank(tmp_path) -> None:
    pool = _pool(tmp_path)
    try:  # 1 MiB: a point-to-point message of its own file (smaller ones ride in records and rings)
        _refused_on_every_rank(pool.run(cases_mac.forged_message, 1 << 18), "p1-0.")
    finally:
        pool.kill()


def test_a_forged_state_record_is_refused_on_every_rank(tmp_path) -> None:
    pool = _pool(tmp_path)
    try:
        _refused_on_every_rank(pool.run(cases_mac.forged_record), "state.r1")
    finally:
        pool.kill()


def test_an_altered_payload_is_refused_on_every_rank(tmp_path) -> None:
    pool = _pool(tmp_path, payloads=True)
    try:
        _refused_on_every_rank(pool.run(cases_mac.payload_altered, 1 << 18), "payload")
    finally:
        pool.kill()


@pytest.mark.parametrize("extra,form", [(100, "inline"), (1 << 20, "file")])
def test_a_rewritten_object_is_refused_on_every_rank_by_default(tmp_path, extra: int, form: str) -> None:
    """With a secret and nothing else set, the pickle of broadcast_object_list is authenticated:
    rewritten in an inline slot (its CRC recomputed) or in its message file, it is refused
    before torch unpickles it, on both ranks; with FSDIST_MAC_PAYLOADS=0 the forgery goes through
    (which is what the default prevents)."""
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    for setting, refused in (("", True), ("0", False)):
        env = {"FSDIST_SECRET_FILE": str(secret), "FSDIST_MAC_PAYLOADS": setting}
        pool = RankPool(2, env=env, group_timeout=30)
        try:
            root, reader = pool.run(cases_mac.object_payload_rewritten, extra)
        finally:
            pool.kill()
        assert reader["forged"] == form, reader
        if refused:
            assert "MAC mismatch" in reader["said"] and "payload" in reader["said"], reader
            assert "MAC mismatch" in root["said"], root
            assert reader["received"] == "None", "torch unpickled the forged object"
        else:
            assert reader["said"] == "no error" and "the-forgers-own-object" in reader["received"], reader


@pytest.mark.parametrize(
    "content,problem",
    [(bytes(16), "one byte, b'\\\\x00', repeated"), (b"abcd" * 8 + b"\n", "the 4 bytes b'abcd' repeated"),
     (b"0" * 15 + b"\n", "fewer than 16")],
)  # fmt: skip
def test_a_secret_anyone_could_guess_is_refused(tmp_path, monkeypatch, content: bytes, problem: str) -> None:
    path = tmp_path / "secret"
    path.write_bytes(content)
    path.chmod(0o600)
    monkeypatch.setenv("FSDIST_SECRET_FILE", str(path))
    with pytest.raises(FsdistError, match=problem.replace("(", r"\(")) as refused:
        seal("x")
    assert "head -c 32 /dev/urandom" in str(refused.value)


def test_a_secret_behind_a_folder_another_may_change_is_refused(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "loose"
    folder.mkdir()
    (folder / "secret").write_bytes(os.urandom(32))
    (folder / "secret").chmod(0o600)
    folder.chmod(0o777)  # every user may write it, no sticky bit: anyone could swap the file
    monkeypatch.setenv("FSDIST_SECRET_FILE", str(folder / "secret"))
    with pytest.raises(FsdistError, match=r"every user can write .*lacks the sticky bit"):
        seal("x")


def test_by_default_a_secret_tags_the_payloads_that_reach_pickle(secret, monkeypatch) -> None:
    """Byte tensors (torch's object collectives send pickles as uint8) carry payload tags, others
    not; FSDIST_MAC_PAYLOADS=1 tags every payload, =0 none (and says what that gives up)."""
    check = seal("gen-0123456789abcdef/groups/k.0.0/m1.0.r0")

    def tagged(tensors: list[torch.Tensor]) -> bool:
        raw = b"".join(bytes(b) for b in message.encode(1, 0, "broadcast", tensors, check))
        return InlineMessage(raw, "m", check)._tags is not None

    assert tagged([torch.zeros(8, dtype=torch.uint8)]) and tagged([torch.zeros(2), torch.zeros(2, dtype=torch.uint8)])
    assert not tagged([torch.zeros(8)]) and not tagged([torch.zeros(8, dtype=torch.int64)])
    monkeypatch.setenv("FSDIST_MAC_PAYLOADS", "1")
    check = seal("gen-0123456789abcdef/groups/k.0.0/m1.0.r0")
    assert tagged([torch.zeros(8)])
    monkeypatch.setenv("FSDIST_MAC_PAYLOADS", "0")
    monkeypatch.setattr(seal_module, "_warned", set())  # (warned once per process)
    with pytest.warns(UserWarning, match="not even the pickles"):
        check = seal("gen-0123456789abcdef/groups/k.0.0/m1.0.r0")
    assert not tagged([torch.zeros(8, dtype=torch.uint8)])
    monkeypatch.setenv("FSDIST_MAC_PAYLOADS", "yes")
    with pytest.raises(FsdistError, match="say 1"):
        seal("x")


def test_a_record_copied_from_another_run_directory_is_refused(secret, tmp_path) -> None:
    """Issue 47, 6: the rendezvous record and the restart history are bound to their run
    directory (its inode number), so job A's live record copied whole into B is refused there:
    by a job (naming the repair), by ``fsdist status``, and by ``fsdist clean``, which then
    removes nothing the copy names; a directory moved keeps its records."""
    from datetime import timedelta

    from fsdist.inspect.status import read_status
    from fsdist.job.clean import clean
    from fsdist.job.rendezvous import rendezvous
    from fsdist.protocol import failure_report, layout

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(mode=0o700)
    b.mkdir(mode=0o700)
    live = {"host": os.uname().nodename, "pid": os.getpid(), "start_time": 1, "nonce": "n" * 16}
    state = {"format": 1, "generation": "0123456789abcdef", "world_size": 2, "complete": True,
             "members": {"0": live, "1": {**live, "nonce": "m" * 16}}}  # fmt: skip
    record = rendezvous_record.encode(state, str(a))
    assert rendezvous_record.parse(record, str(a))["generation"] == "0123456789abcdef"
    (b / layout.RENDEZVOUS_FILE).write_bytes(record)
    (b / "gen-0123456789abcdef").mkdir()
    with pytest.raises(rendezvous_record.CorruptRecordError, match="MAC mismatch"):
        rendezvous_record.parse(record, str(b))
    with pytest.raises(rendezvous_record.CorruptRecordError, match="fsdist clean"):
        rendezvous(str(b), 0, 1, timedelta(seconds=5))
    assert any("MAC mismatch" in line for line in read_status(str(b)).summary)
    cleaned = clean(str(b))
    assert cleaned.removed == [] and (b / "gen-0123456789abcdef").exists(), "clean removed what the copy named"
    history = failure_report.add_round(b"", "job-a", 2, None, {}, str(a))
    assert failure_report.parse_rounds(history, str(a))["job"] == "job-a"
    with pytest.raises(ValueError, match="MAC mismatch"):
        failure_report.parse_rounds(history, str(b))
    moved = tmp_path / "moved"
    a.rename(moved)
    assert rendezvous_record.parse(record, str(moved))["generation"] == "0123456789abcdef"
