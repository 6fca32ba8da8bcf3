"""Which of torch's tests run: a representative part by default, the whole selection on request.

``FSDIST_TORCH_SUITE=full`` (what ``make test-torch`` sets) keeps every test of
``DistributedTest._DistTestBase``; torch's own decorators then skip what Gloo skips. Otherwise only
``CI_SUBSET`` runs (a few minutes on 2 cores), and the other tests are reported as deselected.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FULL = os.environ.get("FSDIST_TORCH_SUITE") == "full"

#: ~20 tests torch runs for Gloo, one or two per area, each ~5 s (spawn + init + test)
CI_SUBSET = frozenset(
    {
        # process groups
        "test_get_backend",
        "test_destroy_group",
        "test_new_subgroups",
        # collectives, world and subgroups, sync and async
        "test_all_reduce_sum_async",
        "test_all_reduce_group_max",
        "test_all_reduce_coalesced_full_group_sum",
        "test_broadcast_group",
        "test_reduce_sum",
        "test_all_gather_coalesced_simple",
        "test_scatter",
        "test_gather",
        "test_all_to_all_single_unequal_split",
        "test_coalescing_manager",
        # point to point
        "test_send_recv_any_source",
        "test_batch_isend_irecv_gloo",
        # barrier and timeouts
        "test_barrier",
        "test_barrier_timeout_global",
        "test_barrier_timeout_group",
        # object collectives
        "test_all_gather_object_default_pg",
        "test_scatter_object_list",
        # DDP
        "test_DistributedDataParallelCPU",
        "test_ddp_hook_parity_allreduce",
        "test_accumulate_gradients_no_sync",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if FULL:
        return
    here = Path(__file__).parent
    keep, drop = [], []
    for item in items:
        ours = item.path.parent == here
        (drop if ours and item.name not in CI_SUBSET else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
