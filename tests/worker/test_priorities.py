"""Who gives way when a worker pod is full (seed 002: scarce GPUs by written policy, not fought over).

A load evicts copies of lower priority before any other, whatever the cost
model says of them, and never a copy of higher priority: a model that only
higher-priority copies keep out waits for room within its deadline and is then
refused saying which copies outrank it. Nothing is evicted for a load that
cannot happen. The log and the pod's report name the preempting model (the
operator makes Events of the report: tests/operator/test_preemption_events.py). Requests waiting for room
are admitted highest priority first.
"""
from __future__ import annotations

import asyncio
import logging

import pytest

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB, predict



def test_priority_defaults_to_zero_and_is_bounded() -> None:
    assert ModelSpec(id="m", framework="triton", source="file:///m").priority == 0
    with pytest.raises(ValueError, match="priority"):
        ModelSpec(id="m", framework="triton", source="file:///m", priority=5000)


async def test_a_higher_priority_load_evicts_the_lower_copy_not_the_least_recently_used(tmp_path, caplog) -> None:
    store = ballast.catalog(tmp_path, {
        "fraud": {"size": MiB, "priority": 100},
        "reports": {"size": MiB},
        "checkout": {"size": MiB, "priority": 50},
    })
    manager = ballast.manager(store, budget=100 * MiB, max_models=2, admission_control=False)
    try:
        assert [await predict(manager, m) for m in ("fraud", "reports")] == ["fraud", "reports"]
        await predict(manager, "reports")  # fraud is now the least recently used copy
        with caplog.at_level(logging.INFO, logger="hotset_worker.manager"):
            assert await predict(manager, "checkout") == "checkout"
            await manager.settled()
        assert manager.loaded_ids() == ["checkout", "fraud"]
        assert any("evicting reports" in r.getMessage() and "preempted by the load of checkout (priority 50)"
                   in r.getMessage() for r in caplog.records)
        [preempted] = manager.preemptions
        assert (preempted.seq, preempted.model, preempted.priority, preempted.by, preempted.by_priority) == (
            1, "reports", 0, "checkout", 50)
    finally:
        await manager.close()


async def test_a_model_only_higher_priorities_keep_out_waits_then_is_refused_saying_so(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {
        "fraud": {"size": MiB, "priority": 100},
        "checkout": {"size": MiB, "priority": 50},
        "backfill": {"size": MiB, "priority": -10},
    })
    manager = ballast.manager(store, budget=100 * MiB, max_models=2)
    try:
        await predict(manager, "fraud")
        await predict(manager, "checkout")
        with pytest.raises(errors.NoCapacity, match=r"priority -10 may not evict the copies of higher priority "
                                                    r"here \(checkout, fraud\)") as refused:
            await predict(manager, "backfill", timeout_s=0.5)
        assert refused.value.headers.get("Retry-After")
        assert manager.loaded_ids() == ["checkout", "fraud"]  # nothing evicted, nothing lost
        assert await predict(manager, "fraud") == "fraud"
    finally:
        await manager.close()


async def test_requests_waiting_for_room_are_admitted_highest_priority_first(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {
        "holder": {"size": MiB},
        "first": {"size": MiB},
        "second": {"size": MiB},
        "high": {"size": MiB, "priority": 10},
    })
    manager = ballast.manager(store, budget=100 * MiB, max_models=1, admission_control=False)
    try:
        holder = manager.use("holder")
        await holder.__aenter__()  # the only slot is serving until this request ends
        first = asyncio.create_task(predict(manager, "first"))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(predict(manager, "second", timeout_s=1.5))
        await asyncio.sleep(0.01)
        high = asyncio.create_task(predict(manager, "high"))  # arrives last
        await asyncio.sleep(0.05)
        await holder.__aexit__(None, None, None)
        assert (await first, await high) == ("first", "high")
        with pytest.raises(errors.NoCapacity, match=r"'second'.*may not evict the copies of higher priority here \(high\)"):
            await second  # it came before high, which went ahead, and whose copy it may not evict
        loads = [event for event in ballast.EVENTS if event.startswith("load:")]
        assert loads == ["load:holder", "load:first", "load:high"]  # first was promised the slot before high came
    finally:
        await manager.close()
