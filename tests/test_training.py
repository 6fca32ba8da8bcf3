"""Training over fsdist: DDP (and its options), FSDP2, DTensor on a 2x2 mesh, object collectives."""

from __future__ import annotations

import pytest

from in_rank import training as cases


@pytest.mark.parametrize(
    "variant", ["plain", "static_graph", "unused", "bucket_view", "no_sync", "fp16_hook", "bf16_hook"]
)
def test_ddp_matches_a_single_process_reference(pool_factory, variant: str) -> None:
    diffs = pool_factory(2).run(cases.ddp_matches_reference, variant)
    # compression rounds the gradients: fp16 keeps 11 significant bits, bf16 only 8
    tolerance = {"fp16_hook": 1e-3, "bf16_hook": 2e-2}.get(variant, 1e-6)
    assert max(diffs) <= tolerance, diffs


@pytest.mark.parametrize("world", [3, 4])
def test_ddp_with_odd_and_even_worlds(pool_factory, world: int) -> None:
    assert max(pool_factory(world).run(cases.ddp_matches_reference, "plain")) <= 1e-6


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_matches_ddp_over_gloo(pool_factory, world: int) -> None:
    # summing two gradients is exact in either order; three may round differently in Gloo's order
    assert max(pool_factory(world).run(cases.ddp_matches_gloo)) <= (0.0 if world == 2 else 1e-12)


def test_fsdp2_matches_a_single_process_reference(pool_factory) -> None:
    assert max(pool_factory(4).run(cases.fsdp2_matches_reference)) <= 1e-6


def test_distributed_checkpoint_of_a_sharded_model_round_trips(pool_factory, tmp_path) -> None:
    assert max(pool_factory(4).run(cases.checkpoint_round_trip, str(tmp_path / "ckpt"))) == 0.0


@pytest.mark.parametrize("world", [1, 3])
def test_dtensor_on_a_1d_device_mesh(pool_factory, world: int) -> None:
    assert max(pool_factory(world).run(cases.dtensor_1d_mesh)) <= 1e-10


def test_dtensor_matmul_on_a_2x2_device_mesh(pool_factory) -> None:
    assert max(pool_factory(4).run(cases.dtensor_2x2_matmul)) <= 1e-10


@pytest.mark.parametrize("world", [2, 3])
def test_object_collectives(pool_factory, world: int) -> None:
    assert pool_factory(world).run(cases.object_collectives) == [[]] * world
