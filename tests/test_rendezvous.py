"""Port-free rendezvous: URL and env forms, fresh generations, refusing a live second job."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest

from fsdist.c10d.init_methods import parse_url
from fsdist.errors import RendezvousError
from fsdist.job.rendezvous import rendezvous
from fsdist.protocol import rendezvous_record
from fsdist.protocol.layout import RENDEZVOUS_FILE

from harness import RankError, RankPool
from in_rank import init as cases


def _run_unjoined(world: int, function, per_rank_args, deaths_expected: bool = False, env=None):
    pool = RankPool(world, init=False, env=env)
    try:
        return pool.run_each(function, per_rank_args, deaths_expected=deaths_expected)
    finally:
        pool.kill()


def test_parse_url_and_env_fallbacks(monkeypatch, tmp_path) -> None:
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "FSDIST_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert parse_url(f"fsdist://{tmp_path}?rank=1&world_size=3") == (str(tmp_path), 1, 3)
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("FSDIST_DIR", str(tmp_path))
    assert parse_url("fsdist://") == (str(tmp_path), 2, 4)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert parse_url("fsdist://") == (str(tmp_path), 0, 2)  # RANK/WORLD_SIZE win over SLURM's
    monkeypatch.delenv("FSDIST_DIR")
    with pytest.raises(RendezvousError, match="FSDIST_DIR"):
        parse_url("fsdist://")


def test_env_init(tmp_path) -> None:
    envs = [{"FSDIST_DIR": str(tmp_path), "RANK": str(r), "WORLD_SIZE": "3"} for r in range(3)]
    assert _run_unjoined(3, cases.init_by_env_and_reduce, [("fsdist://", e) for e in envs]) == [6.0] * 3


def test_slurm_init(tmp_path) -> None:
    envs = [{"SLURM_PROCID": str(r), "SLURM_NTASKS": "2"} for r in range(2)]
    assert _run_unjoined(2, cases.init_by_env_and_reduce, [(f"fsdist://{tmp_path}", e) for e in envs]) == [3.0] * 2


def test_two_jobs_in_a_row_in_one_directory(tmp_path) -> None:
    results = _run_unjoined(2, cases.init_twice, [(str(tmp_path), r, 2) for r in range(2)])
    assert results == [[2.0, 2.0]] * 2
    assert os.listdir(tmp_path) == [RENDEZVOUS_FILE]
    assert (tmp_path / RENDEZVOUS_FILE).read_bytes() == b""


def test_crashed_run_does_not_poison_the_next(tmp_path) -> None:
    with pytest.raises(RankError, match=r"raised in rank\(s\) \[1, 2, 3\]") as crashed:  # rank 0 died
        _run_unjoined(4, cases.crash_mid_collective, [(str(tmp_path), r, 4) for r in range(4)], deaths_expected=True)
    assert "PeerFailedError" in str(crashed.value) and "rank 0" in str(crashed.value)
    assert any(n.startswith("gen-") for n in os.listdir(tmp_path)), "the crash should have left files"
    values = _run_unjoined(4, cases.init_twice, [(str(tmp_path), r, 4) for r in range(4)])
    assert values == [[4.0, 4.0]] * 4
    assert os.listdir(tmp_path) == [RENDEZVOUS_FILE]


def test_a_second_live_job_is_refused(pool_factory) -> None:
    pool = pool_factory(2)
    with pytest.raises(RendezvousError, match="another job is running"):
        rendezvous(pool.directory, 0, 2, timedelta(seconds=5))


def test_foreign_rendezvous_file_is_a_clear_error(tmp_path) -> None:
    for content, says in [
        (json.dumps({"hello": 1}).encode(), "not a sealed JSON record"),  # another program's JSON
        (rendezvous_record.encode({"hello": 1}, str(tmp_path)), "unknown format"),  # sealed, but not a record
    ]:
        (tmp_path / RENDEZVOUS_FILE).write_bytes(content)
        with pytest.raises(RendezvousError, match=says):
            rendezvous(str(tmp_path), 0, 1, timedelta(seconds=5))


def test_bad_rank_is_refused(tmp_path) -> None:
    with pytest.raises(RendezvousError, match="outside"):
        rendezvous(str(tmp_path), 3, 2)


def test_clean_removes_a_crashed_run_and_refuses_a_live_one(pool_factory, tmp_path) -> None:
    from fsdist.cli.main import main

    with pytest.raises(RankError, match=r"raised in rank\(s\) \[1\]:[\s\S]*PeerFailedError"):  # rank 0 died
        _run_unjoined(2, cases.crash_mid_collective, [(str(tmp_path), r, 2) for r in range(2)], deaths_expected=True)
    assert any(n.startswith("gen-") for n in os.listdir(tmp_path))
    assert main(["clean", str(tmp_path)]) == 0
    assert os.listdir(tmp_path) == [RENDEZVOUS_FILE]
    live = pool_factory(2)
    assert main(["clean", live.directory]) == 1  # refused: that job is alive
    assert any(n.startswith("gen-") for n in os.listdir(live.directory))


def test_dead_holder_of_a_slot_in_a_forming_generation_is_replaced_whatever_the_order(tmp_path) -> None:
    import threading
    import time

    dead = {"host": os.uname().nodename, "pid": 2**22 + 7, "start_time": 1, "nonce": "x"}  # no such pid
    stale = {"format": 1, "generation": "deadbeefdeadbeef", "world_size": 2, "complete": False, "members": {"0": dead}}
    (tmp_path / RENDEZVOUS_FILE).write_bytes(rendezvous_record.encode(stale, str(tmp_path)))
    results: dict[int, object] = {}

    def join(rank: int, delay: float) -> None:
        time.sleep(delay)
        try:
            results[rank] = rendezvous(str(tmp_path), rank, 2, timedelta(seconds=20)).generation_id
        except Exception as exc:  # noqa: BLE001
            results[rank] = exc

    threads = [threading.Thread(target=join, args=(1, 0.0)), threading.Thread(target=join, args=(0, 0.5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results[0], str) and results[0] == results[1], results


def test_an_entry_a_write_under_the_lock_replaced_unseen_is_reported_as_the_locks_fault(tmp_path) -> None:
    """Only a live rank removes its own entry. A rendezvous file rewritten without it in the same
    generation, as a second client does whose lock did not exclude this one's and whose cache
    showed it an older file, fails the waiting rank at once, naming the locks and doctor."""
    import threading
    import time

    outcome: list[object] = []

    def join() -> None:
        try:
            rendezvous(str(tmp_path), 0, 2, timedelta(seconds=20))
            outcome.append("joined")
        except RendezvousError as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=join)
    waiter.start()
    path = tmp_path / RENDEZVOUS_FILE
    end = time.monotonic() + 10
    while not (path.exists() and path.stat().st_size):
        assert time.monotonic() < end, "rank 0 never wrote itself into the rendezvous file"
        time.sleep(0.01)
    with rendezvous_record.locked(str(tmp_path)) as record:
        state = rendezvous_record.parse(record.read(), str(tmp_path))
        assert list(state["members"]) == ["0"]
        other = {"host": "node-b", "pid": 4242, "start_time": 1, "nonce": "b" * 16, "client": "other"}
        record.update(lambda old: rendezvous_record.encode({**state, "members": {"1": other}}, str(tmp_path)))
    waiter.join(20)
    assert len(outcome) == 1 and isinstance(outcome[0], RendezvousError), outcome
    text = str(outcome[0])
    assert f"no longer names this rank's entry in generation {state['generation']}" in text, text
    assert "the locks do not exclude" in text and "fsdist doctor" in text, text
