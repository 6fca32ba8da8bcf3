"""Per-operation debug records: on with FSDIST_DEBUG=1 or TORCH_DISTRIBUTED_DEBUG=DETAIL, off otherwise."""

from __future__ import annotations

import pytest

from harness import RankPool
from in_rank import debug as cases


@pytest.mark.parametrize("env", [{"FSDIST_DEBUG": "1"}, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}])
def test_each_op_logs_rank_group_seq_bytes_and_time(env) -> None:
    pool = RankPool(2, env=env)
    try:
        per_rank = pool.run(cases.ops_with_records)
    finally:
        pool.close()
    for rank, records in enumerate(per_rank):
        ops = [r["fsdist_op"] for r in records]
        assert ops[0] == "all_reduce SUM float32[1000]" and ops[1] == "broadcast root=0 int64[3]", ops
        assert ops[2] == ("send tag=0 float32[5] to 1" if rank == 0 else "recv tag=0 float32[5] from 0"), ops
        assert ops[3] == "barrier", ops
        assert [r["fsdist_seq"] for r in records] == [1, 2, None, 3]
        assert [r["fsdist_bytes"] for r in records] == [4000, 24, 20, 0]
        assert all(r["fsdist_rank"] == rank and r["fsdist_seconds"] >= 0 for r in records)
        assert len({r["fsdist_group"] for r in records}) == 1
        assert records[0]["message"].startswith(f"rank {rank} group ")
        assert "#1 all_reduce SUM float32[1000]: 4000 B in " in records[0]["message"]


def test_no_records_without_the_variables(pool_factory) -> None:
    assert pool_factory(2).run(cases.debug_is_off) == [True, True]
