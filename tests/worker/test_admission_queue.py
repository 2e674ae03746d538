"""When more models are wanted than fit, requests wait for room instead of failing.

A request whose model cannot be admitted now waits in a bounded queue, in
arrival order, within its deadline; each swap serves the whole batch waiting
for the model loaded; a refusal comes only when the queue is full or the
deadline cannot be met, says which, and carries Retry-After.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from hotset_common import errors
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB, predict



async def test_twelve_requests_for_six_models_on_two_slots_are_all_served(tmp_path) -> None:
    # The reproduction: every slot is loading or serving, so the old manager refused 8 of 12.
    store = ballast.catalog(tmp_path, {f"m{i}": {"size": MiB, "delay": 0.1, "predict_delay": 0.05} for i in range(6)})
    manager = ballast.manager(store, budget=100 * MiB, max_models=2)
    try:
        requests = [f"m{i % 6}" for i in range(12)]
        answers = await asyncio.gather(*(predict(manager, model) for model in requests), return_exceptions=True)
        assert answers == requests  # every request answered by its own model, none refused
        assert all(ballast.LOADS[f"m{i}"] == 1 for i in range(6))  # each model's two requests shared one load
        await manager.settled()
        assert 1 <= len(manager.loaded_ids()) <= 2  # within the limit once settled (transient copies left)
    finally:
        await manager.close()


async def test_waiting_requests_are_admitted_in_arrival_order(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "delay": 0.05} for key in "abcde"})
    manager = ballast.manager(store, budget=100 * MiB, max_models=1, admission_control=False)  # each load evicts
    try:
        holder = manager.use("a")
        await holder.__aenter__()  # a is serving: the only slot is taken until this request ends
        waiting = []
        for key in "bcd":
            waiting.append(asyncio.create_task(predict(manager, key)))
            await asyncio.sleep(0.01)  # b, then c, then d join the queue
        await asyncio.sleep(0.1)
        assert manager.queued_requests() == 2  # b is loading (a is its promised victim); c and d wait
        # the models they wait for, in arrival order, for the pool autoscaler: demand that found no room
        assert [(model, n) for model, n, _ in manager.waiting()] == [("c", 1), ("d", 1)]
        assert all(waited > 0 for _, _, waited in manager.waiting())
        await holder.__aexit__(None, None, None)
        assert await asyncio.gather(*waiting) == ["b", "c", "d"]
        assert [event for event in ballast.EVENTS if event.startswith("load:")] == ["load:a", "load:b", "load:c", "load:d"]
    finally:
        await manager.close()


async def test_a_model_that_requests_wait_for_serves_them_all_before_it_can_be_evicted(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"slow": {"size": MiB, "delay": 0.3}, "next": {"size": MiB}})
    manager = ballast.manager(store, budget=100 * MiB, max_models=1)
    try:
        batch = [asyncio.create_task(predict(manager, "slow")) for _ in range(5)]
        await asyncio.sleep(0.05)  # the batch waits for slow's load
        newcomer = asyncio.create_task(predict(manager, "next"))
        assert await asyncio.gather(*batch, newcomer) == ["slow"] * 5 + ["next"]
        assert ballast.LOADS == {"slow": 1, "next": 1}  # one load per swap: no request of the batch reloaded it
        await manager.settled()
        assert manager.loaded_ids() == ["slow"]  # and next, wanted once, was worth less than slow: it left again
    finally:
        await manager.close()


async def test_a_full_queue_is_refused_at_once_with_retry_after_and_says_so(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "delay": 0.5} for key in "abc"})
    manager = ballast.manager(store, budget=100 * MiB, max_models=1, max_queue=1)
    try:
        loading = asyncio.create_task(manager.load("a"))  # the slot: loading for 0.5 s
        await asyncio.sleep(0.02)
        queued = asyncio.create_task(predict(manager, "b"))  # the one place in the queue
        await asyncio.sleep(0.02)
        started = time.perf_counter()
        with pytest.raises(errors.NoCapacity, match="admission queue is full") as refused:
            await predict(manager, "c")
        assert time.perf_counter() - started < 0.05
        assert refused.value.status_code == 503 and int(refused.value.headers["Retry-After"]) >= 1
        await loading
        assert await queued == "b"  # the queued request was served, not refused
        assert ballast.ATTEMPTS["c"] == 0
    finally:
        await manager.close()


async def test_a_deadline_that_passes_in_the_queue_is_a_503_naming_it_and_leaves_no_load_behind(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {"size": MiB, "delay": 0.6}, "b": {"size": MiB}})
    manager = ballast.manager(store, budget=100 * MiB, max_models=1)
    try:
        loading = asyncio.create_task(manager.load("a"))
        await asyncio.sleep(0.02)
        with pytest.raises(errors.NoCapacity, match="deadline passed after .* in the admission queue") as refused:
            await predict(manager, "b", timeout_s=0.2)
        assert "Retry-After" in refused.value.headers
        assert manager.queued_requests() == 0
        await loading
        await manager.settled()
        assert ballast.ATTEMPTS["b"] == 0 and manager.loaded_ids() == ["a"]  # the abandoned place started nothing
    finally:
        await manager.close()


async def test_a_deadline_shorter_than_the_models_load_is_refused_before_queueing(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {"size": MiB}, "b": {"size": MiB, "delay": 0.3}, "c": {"size": MiB, "delay": 0.5}})
    manager = ballast.manager(store, budget=100 * MiB, max_models=1)
    try:
        await manager.load("b")  # b's load is now known to take about 0.3 s...
        await manager.load("a")  # ...and b is evicted
        loading = asyncio.create_task(manager.load("c"))  # the slot is taken for 0.5 s
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        with pytest.raises(errors.NoCapacity, match="deadline cannot be met: its load takes about 0.3s"):
            await predict(manager, "b", timeout_s=0.1)
        assert time.perf_counter() - started < 0.05
        await loading
        assert ballast.LOADS["b"] == 1
    finally:
        await manager.close()


async def test_a_rarely_wanted_model_serves_its_request_without_evicting_a_popular_one(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"popular": {"size": MiB, "delay": 0.2}, "rare": {"size": MiB, "delay": 0.2}})
    manager = ballast.manager(store, budget=100 * MiB, max_models=1)
    try:
        for _ in range(10):
            assert await predict(manager, "popular") == "popular"
        assert await predict(manager, "rare") == "rare"  # served...
        await manager.settled()
        assert manager.loaded_ids() == ["popular"]  # ...from a copy that left again: popular stays
        assert ballast.LOADS == {"popular": 1, "rare": 1} and ballast.UNLOADS == {"rare": 1}
        for _ in range(12):  # rare becomes the one in demand: once it is worth more, it is kept
            assert await predict(manager, "rare") == "rare"
        await manager.settled()
        assert manager.loaded_ids() == ["rare"] and ballast.UNLOADS["popular"] == 1
    finally:
        await manager.close()


async def test_an_explicit_load_always_stays(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"popular": {"size": MiB, "delay": 0.1}, "wanted": {"size": MiB, "delay": 0.1}})
    manager = ballast.manager(store, budget=100 * MiB, max_models=1)
    try:
        for _ in range(10):
            await predict(manager, "popular")
        await manager.load("wanted")  # the API (an operator, the router's minimum copies) asked for it
        await manager.settled()
        assert manager.loaded_ids() == ["wanted"]
    finally:
        await manager.close()
