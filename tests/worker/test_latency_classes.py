"""A worker pod serves one side at a time: realtime models never share it with batch models.

Seed 002: a batch flood must not take the cores a realtime model's callers
wait on. The router places the two sides on different pods; the worker is
the last word: before a load of one side it evicts the other side's copies
(once their waiting requests are served), refuses when one of them is
pinned, and admits realtime requests waiting for room before all others.
"""
from __future__ import annotations

import asyncio

import pytest

from hotset_common import errors
from hotset_common.spec import LatencyClass, ModelSpec
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB, predict



def test_the_class_defaults_to_standard_and_only_realtime_and_batch_exclude_each_other() -> None:
    spec = ModelSpec(id="m", framework="triton", source="file:///m")
    assert spec.latency_class is LatencyClass.STANDARD
    assert ModelSpec(id="m", framework="triton", source="file:///m", latencyClass="realtime").latency_class is LatencyClass.REALTIME
    assert LatencyClass.REALTIME.excludes() is LatencyClass.BATCH
    assert LatencyClass.BATCH.excludes() is LatencyClass.REALTIME
    assert LatencyClass.STANDARD.excludes() is None
    with pytest.raises(ValueError, match="latencyClass|latency_class"):
        ModelSpec(id="m", framework="triton", source="file:///m", latencyClass="urgent")


async def test_a_realtime_load_evicts_the_batch_copies_even_with_room_to_spare(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {
        "nightly": {"size": MiB, "latency_class": "batch"},
        "report": {"size": MiB, "latency_class": "batch"},
        "plain": {"size": MiB},
        "chat": {"size": MiB, "latency_class": "realtime"},
    })
    manager = ballast.manager(store, budget=100 * MiB)  # room for all four
    try:
        assert [await predict(manager, m) for m in ("nightly", "report", "plain")] == ["nightly", "report", "plain"]
        assert await predict(manager, "chat") == "chat"
        await manager.settled()
        assert manager.loaded_ids() == ["chat", "plain"]  # standard stays beside either side
        # and the other way round: a batch load evicts the realtime copy
        assert await predict(manager, "nightly") == "nightly"
        await manager.settled()
        assert manager.loaded_ids() == ["nightly", "plain"]
    finally:
        await manager.close()


async def test_a_batch_copy_serving_requests_finishes_them_before_it_leaves(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {
        "nightly": {"size": MiB, "latency_class": "batch", "predict_delay": 0.3},
        "chat": {"size": MiB, "latency_class": "realtime"},
    })
    manager = ballast.manager(store, budget=100 * MiB)
    try:
        await predict(manager, "nightly")
        running = asyncio.create_task(predict(manager, "nightly"))
        await asyncio.sleep(0.05)  # nightly is serving
        assert await predict(manager, "chat") == "chat"
        assert await running == "nightly"  # its request was not cut off
        await manager.settled()
        assert manager.loaded_ids() == ["chat"]
        assert ballast.EVENTS[-1] == "unload:nightly"  # unloaded once its request was done
    finally:
        await manager.close()


async def test_a_pinned_batch_model_makes_the_pod_refuse_realtime_loads_saying_why(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {
        "nightly": {"size": MiB, "latency_class": "batch", "pinned": True},
        "chat": {"size": MiB, "latency_class": "realtime"},
    })
    manager = ballast.manager(store, budget=100 * MiB, pinned=["nightly"])
    try:
        await manager.load("nightly")
        with pytest.raises(errors.NoCapacity, match=r"'chat' is realtime.*pinned batch model\(s\) nightly"):
            await predict(manager, "chat", timeout_s=2)
        assert manager.loaded_ids() == ["nightly"]  # nothing evicted, nothing lost
    finally:
        await manager.close()


async def test_realtime_requests_waiting_for_room_are_admitted_before_earlier_batch_ones(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {
        "holder": {"size": MiB},
        "b1": {"size": MiB},
        "b2": {"size": MiB},
        "rt": {"size": MiB, "latency_class": "realtime"},
    })
    manager = ballast.manager(store, budget=100 * MiB, max_models=1, admission_control=False)
    try:
        holder = manager.use("holder")
        await holder.__aenter__()  # the only slot is serving until this request ends
        waiting = [asyncio.create_task(predict(manager, "b1"))]
        await asyncio.sleep(0.01)
        waiting.append(asyncio.create_task(predict(manager, "b2")))
        await asyncio.sleep(0.01)
        waiting.append(asyncio.create_task(predict(manager, "rt")))  # arrives last
        await asyncio.sleep(0.05)
        assert [model for model, _, _ in manager.waiting()] == ["b2", "rt"]  # b1 is loading, promised the slot
        await holder.__aexit__(None, None, None)
        assert await asyncio.gather(*waiting) == ["b1", "b2", "rt"]
        loads = [event for event in ballast.EVENTS if event.startswith("load:")]
        assert loads == ["load:holder", "load:b1", "load:rt", "load:b2"]  # rt went ahead of b2, which came first
    finally:
        await manager.close()
