"""OpQueue in one process: issue order, who runs what, and the worker that is not woken.

The multi-process side (an async op progresses while its caller blocks in a receive or outside
fsdist) is in test_collectives.py; these cases pin the queue's own rules without files.
"""

from __future__ import annotations

import threading
import time

import pytest

from fsdist.c10d.work import FsdistWork, OpQueue
from fsdist.defaults import INLINE_RUN_BYTES
from fsdist.errors import GroupBrokenError


@pytest.fixture
def queue():
    q = OpQueue("test", lambda error: None)
    yield q
    q.close()


@pytest.fixture
def patient_queue():
    """A worker that leaves small ops alone for 60 s: whatever runs them is the caller."""
    q = OpQueue("test", lambda error: None, handoff=60.0)
    yield q
    q.close()


def _submit(q: OpQueue, log: list[tuple[str, str]], name: str, nbytes: int = 8, body=None) -> FsdistWork:
    def run() -> None:
        if body is not None:
            body()
        log.append((name, threading.current_thread().name))

    return q.submit(FsdistWork([], name), run, nbytes)


def test_the_caller_runs_its_small_op_and_those_queued_before_it_in_order(patient_queue) -> None:
    log: list[tuple[str, str]] = []
    works = [_submit(patient_queue, log, f"op{i}") for i in range(3)]
    works[2].wait()
    assert [name for name, _ in log] == ["op0", "op1", "op2"]
    assert {thread for _, thread in log} == {threading.current_thread().name}, log
    assert all(w.is_completed() for w in works)


def test_an_op_nobody_waits_for_is_run_by_the_worker(queue) -> None:
    log: list[tuple[str, str]] = []
    work = _submit(queue, log, "async")
    deadline = time.monotonic() + 5
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert work.is_completed() and log == [("async", "fsdist-test")], log


def test_the_idle_worker_is_woken_for_an_op_nobody_waits_for(queue) -> None:
    time.sleep(0.3)  # longer than the worker looks for unclaimed ops after the last submission
    log: list[tuple[str, str]] = []
    work = _submit(queue, log, "after idle")
    assert work._done.wait(5), "the idle worker never ran the op"
    assert log == [("after idle", "fsdist-test")]


def test_a_large_op_goes_to_the_worker_at_once_and_a_small_one_behind_it_waits_its_turn(queue) -> None:
    log: list[tuple[str, str]] = []
    release = threading.Event()
    large = _submit(queue, log, "large", INLINE_RUN_BYTES + 1, body=lambda: release.wait(5))
    small = _submit(queue, log, "small")
    threading.Timer(0.1, release.set).start()
    small.wait()
    assert [name for name, _ in log] == ["large", "small"], log
    assert log[0][1] == "fsdist-test" and large.is_completed()


def test_after_a_failure_later_ops_report_the_broken_group(patient_queue) -> None:
    queue = patient_queue
    log: list[tuple[str, str]] = []

    def fail() -> None:
        raise ValueError("boom")

    first = _submit(queue, log, "fails", body=fail)
    second = _submit(queue, log, "after")
    with pytest.raises(ValueError, match="boom"):
        first.wait()
    with pytest.raises(GroupBrokenError, match="boom"):
        second.wait()
    assert log == []


def test_close_runs_what_is_still_queued(queue) -> None:
    log: list[tuple[str, str]] = []
    works = [_submit(queue, log, f"op{i}") for i in range(3)]
    queue.close()
    assert [name for name, _ in log] == ["op0", "op1", "op2"] and all(w.is_completed() for w in works)


def test_a_finished_work_is_freed_at_once_not_by_the_cyclic_collector(queue) -> None:
    """A Work and its queue's entry must not hold each other once it completes: every small
    operation would otherwise wait for the cyclic GC to free it (+40 µs per 8-byte all_reduce)."""
    import gc
    import weakref

    gc.disable()
    try:
        for nbytes in (0, INLINE_RUN_BYTES + 1):  # run by its caller; handed to the worker
            work = FsdistWork([], "x")
            queue.submit(work, lambda: None, nbytes).wait()
            ref = weakref.ref(work)
            del work
            deadline = time.monotonic() + 5
            while ref() is not None and time.monotonic() < deadline:  # (the worker lets go of it last)
                time.sleep(0.001)
            assert ref() is None, f"nbytes={nbytes}: the Work outlived its last reference"
    finally:
        gc.enable()
