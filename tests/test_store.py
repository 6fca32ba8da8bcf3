"""DirectoryStore: torch's Store semantics, safe key names, and atomic adds across processes."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch.distributed as dist

from fsdist.c10d.store import DirectoryStore
from fsdist.errors import FsdistTimeoutError
from fsdist.protocol.layout import key_to_filename

from harness import run_forked


@pytest.fixture
def store(tmp_path) -> DirectoryStore:
    return DirectoryStore(str(tmp_path / "store"), timedelta(seconds=2))


def test_set_get_add_check_delete(store: DirectoryStore) -> None:
    store.set("a", "hello")
    store.set("b", b"\x00\xff")
    assert store.get("a") == b"hello" and store.get("b") == b"\x00\xff"
    assert store.add("n", 5) == 5 and store.add("n", -2) == 3 and store.get("n") == b"3"
    assert store.check(["a", "n"]) and not store.check(["a", "missing"])
    assert store.num_keys() == 3
    assert store.delete_key("a") and not store.delete_key("a")
    assert store.num_keys() == 2
    store.append("b", b"!")
    assert store.get("b") == b"\x00\xff!"
    store.multi_set(["x", "y"], [b"1", b"2"])
    assert store.multi_get(["x", "y"]) == [b"1", b"2"]


def test_compare_set_follows_tcpstore(store: DirectoryStore) -> None:
    assert store.compare_set("k", "", "v1") == b"v1"  # missing key + empty expected: set
    assert store.compare_set("k2", "x", "v") == b"x"  # missing key, other expected: no change
    assert not store.check(["k2"])
    assert store.compare_set("k", "wrong", "v2") == b"v1"
    assert store.compare_set("k", "v1", "v2") == b"v2"


def test_get_and_wait_time_out_with_the_key_named(store: DirectoryStore) -> None:
    store.set_timeout(timedelta(milliseconds=200))
    with pytest.raises(FsdistTimeoutError, match="'never'"):
        store.get("never")
    with pytest.raises(FsdistTimeoutError):
        store.wait(["never"], timedelta(milliseconds=100))


def test_works_through_torch_prefix_store(store: DirectoryStore) -> None:
    prefixed = dist.PrefixStore("group/", store)
    prefixed.set("x", "1")
    assert prefixed.get("x") == b"1" and prefixed.add("c", 2) == 2
    assert prefixed.num_keys() >= 2
    assert prefixed.delete_key("x")


@pytest.mark.parametrize("key", ["../../etc/passwd", "/abs/path", ".", "..", "a/b\\c", "ключ", "x" * 5000, "\x00nul"])
def test_no_key_escapes_the_directory(store: DirectoryStore, key: str) -> None:
    store.set(key, "v")
    assert store.get(key) == b"v"
    name = key_to_filename(key)
    assert "/" not in name and name not in (".", "..") and len(name) <= 200
    assert os.path.exists(os.path.join(store.directory, name))


def test_distinct_keys_get_distinct_files() -> None:
    keys = ["a/b", "a%2Fb", "a_b", "a-b", "A/B", "a.b"]
    assert len({key_to_filename(k) for k in keys}) == len(keys)


def _adder(directory: str, times: int) -> None:
    store = DirectoryStore(directory)
    for _ in range(times):
        store.add("counter", 1)


def test_add_is_atomic_across_processes(tmp_path) -> None:
    directory = str(tmp_path / "s")
    DirectoryStore(directory)
    assert run_forked(_adder, [(directory, 300)] * 4) == [0] * 4
    assert DirectoryStore(directory).get("counter") == b"1200"


def test_a_key_file_name_turns_back_into_its_key() -> None:
    from fsdist.protocol.layout import filename_to_key

    for key in ["plain", "fsdist/group-ranks/k.0.0", "ümlaut and spaces", "../..", "%41"]:
        assert filename_to_key(key_to_filename(key)) == key
    assert filename_to_key(key_to_filename("x" * 500)) is None  # a digest name cannot be undone
