"""A model chosen for eviction while it serves a request is unloaded only after that request."""
from __future__ import annotations

import asyncio

import pytest

from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_worker.dataplane import DataPlane
from hotset_worker.metrics import WorkerMetrics
from hotset_worker.backends import Backends



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


async def test_a_request_whose_caller_went_away_still_holds_its_model_until_inference_ends(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {"size": MiB, "memory": MiB, "predict_delay": 0.5}, "b": {"size": MiB, "memory": MiB}})
    manager = ballast.manager(store, budget=MiB)
    dataplane = DataPlane(manager, WorkerMetrics("pod", MiB), Backends())
    try:
        await manager.load("a")
        request = asyncio.create_task(dataplane.predict("a", [1]))
        worker_a = manager.loaded_worker("a")
        await asyncio.to_thread(worker_a.predicting.wait, 5)
        request.cancel()  # the client disconnected; the inference thread runs on
        await manager.load("b")  # evicts a, the only candidate
        assert worker_a.predicting.is_set() and ballast.UNLOADS["a"] == 0
        with pytest.raises(asyncio.CancelledError):
            await request
        await manager.settled()
        assert ballast.UNLOADS["a"] == 1 and manager.loaded_ids() == ["b"]
    finally:
        await manager.close()


async def test_a_loaded_model_that_left_the_store_can_still_be_unloaded(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"gone": {"size": MiB}})
    manager = ballast.manager(store, budget=4 * MiB)
    try:
        await manager.load("gone")
        store.remove("gone")  # its ServedModel was deleted
        assert await manager.unload("gone") is True
        assert manager.loaded_ids() == [] and ballast.UNLOADS["gone"] == 1
    finally:
        await manager.close()
