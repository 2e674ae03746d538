"""A model chosen for eviction while it serves a request is unloaded only after that request."""
from __future__ import annotations

import asyncio

import pytest

from modelplane_testing import ballast_framework as ballast
from modelplane_testing.ballast_framework import MiB


@pytest.fixture(autouse=True)
def _counters() -> None:
    ballast.reset_counters()


async def test_eviction_waits_for_in_flight_requests(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "memory": MiB} for key in "ab"})
    manager = ballast.manager(store, budget=MiB)
    try:
        async with manager.use("a") as worker_a:
            await manager.load("b")  # a must make room, but serves a request right now
            assert manager.loaded_ids() == ["b"]
            await asyncio.sleep(0.05)  # give a wrongly eager unload the chance to happen
            assert ballast.UNLOADS["a"] == 0
            assert worker_a.predict([1]) == {"model": "a", "scaled": [2.0]}
        await manager.settled()
        assert ballast.UNLOADS["a"] == 1
    finally:
        await manager.close()


async def test_explicit_unload_then_request_loads_again(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {"size": MiB}})
    manager = ballast.manager(store, budget=4 * MiB)
    try:
        await manager.load("a")
        assert await manager.unload("a") is True
        assert manager.loaded_ids() == [] and manager.used_bytes() == 0
        assert await manager.unload("a") is False
        async with manager.use("a"):
            pass
        assert ballast.LOADS["a"] == 2
    finally:
        await manager.close()
