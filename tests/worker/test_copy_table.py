"""The copy table: named state changes, and an invariant check that holds at every step.

The table is synchronous and the manager its only writer; these tests drive it
through its state changes directly, show that a broken state is named, and run
a real manager (ballast models) under concurrent thrash while checking the
invariants between every event-loop step. Deadlines run on a ManualClock, so
the one timing test orders its events without sleeping.
"""
from __future__ import annotations

import asyncio
import random

import pytest

from hotset_common import errors
from hotset_common.eviction import EvictionPolicy
from hotset_common.wire import CopyState
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_worker.clock import ManualClock
from hotset_worker.copy_table import CopyTable, TableInvariantBroken



def table(budget: int = 10 * MiB, max_models: int | None = 2) -> CopyTable:
    clock = ManualClock()
    return CopyTable(budget, max_models, EvictionPolicy(churn_guard_s=0), lambda _: False, clock.now, 30.0)


def spec(model_id: str, tmp_path):
    return ballast.make_spec(model_id, tmp_path / model_id, memory=MiB)


async def test_a_copy_goes_through_its_named_states_and_the_table_stays_consistent(tmp_path) -> None:
    loop = asyncio.get_running_loop()
    copies = table()
    a = copies.start_load(spec("a", tmp_path), MiB, [], loop.create_future())
    copies.check()
    assert copies.get("a").state is CopyState.LOADING and copies.used_bytes() == MiB
    copies.record_load(a, 2 * MiB, 0.5)
    copies.finish_load(a, ballast.BallastWorker(a.spec, None), now=1.0)
    copies.check()
    assert copies.ready("a") is a and copies.known_size(a.spec) == 2 * MiB and copies.load_cost("a") == 0.5
    copies.hold(a, now=2.0)
    copies.check()
    assert not a.drained.is_set()
    copies.start_unload(a, loop.create_future())
    copies.check()
    assert copies.ready("a") is None and copies.used_bytes() == 2 * MiB  # still held until unloaded
    assert copies.release(a) is True
    copies.finish_unload(a)
    copies.check()
    assert copies.get("a") is None and copies.used_bytes() == 0 and copies.changes == 4


async def test_the_feed_names_every_model_whose_copy_or_failure_changed_and_no_other(tmp_path) -> None:
    """/status reports only what the feed names (status_report.py): a state change, a field the
    manager sets directly, a request and a failure each name their model; an untouched copy is absent."""
    loop = asyncio.get_running_loop()
    copies = table(max_models=None)
    a = copies.start_load(spec("a", tmp_path), MiB, [], loop.create_future())
    b = copies.start_load(spec("b", tmp_path), MiB, [], loop.create_future())
    copies.finish_load(a, ballast.BallastWorker(a.spec, None), now=1.0)
    copies.finish_load(b, ballast.BallastWorker(b.spec, None), now=1.0)
    assert copies.feed.drain() == {"a", "b"}
    assert copies.feed.drain() == set()  # drained: nothing moved since
    copies.hold(a, now=2.0)
    assert copies.feed.drain() == {"a"}
    b.queued += 1  # the admission queue sets it directly
    assert copies.feed.drain() == {"b"}
    copies.release(a)
    copies.start_unload(a, loop.create_future())
    copies.finish_unload(a)
    assert copies.feed.drain() == {"a"}  # gone: the report says so
    c = copies.start_load(spec("c", tmp_path), MiB, [], loop.create_future())
    copies.feed.drain()
    copies.fail_load(c, errors.ModelLoadFailed("c is broken"), now=3.0)
    assert copies.feed.drain() == {"c"}
    copies.forget_failure("c")
    assert copies.feed.drain() == {"c"}


async def test_a_failed_load_is_remembered_and_its_victims_released(tmp_path) -> None:
    loop = asyncio.get_running_loop()
    copies = table(max_models=1)
    a = copies.start_load(spec("a", tmp_path), MiB, [], loop.create_future())
    copies.finish_load(a, ballast.BallastWorker(a.spec, None), now=1.0)
    victims = copies.victims(extra_bytes=MiB, extra_slots=1, exclude=None, count_unloading=True)
    assert [v.model_id for v in victims] == ["a"]
    b = copies.start_load(spec("b", tmp_path), MiB, victims, loop.create_future())
    assert a.promised_to == "b"
    copies.check()
    b.loading.set_exception(errors.ModelLoadFailed("b is broken"))
    b.loading.exception()
    copies.fail_load(b, errors.ModelLoadFailed("b is broken"), now=2.0)
    copies.check()
    assert a.promised_to is None and copies.get("b") is None and "b" in copies.failures


async def test_a_broken_state_is_named(tmp_path) -> None:
    loop = asyncio.get_running_loop()
    copies = table()
    a = copies.start_load(spec("a", tmp_path), MiB, [], loop.create_future())
    a.state = CopyState.READY  # not through finish_load: no worker
    a.inflight = -1
    with pytest.raises(TableInvariantBroken, match="READY without a worker.*negative count|negative count.*READY without a worker"):
        copies.check()


async def test_invariants_hold_at_every_step_of_a_thrashing_manager(tmp_path) -> None:
    models = {f"m{i}": {"size": MiB, "delay": 0.002 * (i % 3), "predict_delay": 0.001} for i in range(6)}
    models["broken"] = {"missing": True, "memory": MiB}
    store = ballast.catalog(tmp_path, models)
    manager = ballast.manager(store, budget=3 * MiB, max_models=2, policy=EvictionPolicy(churn_guard_s=0),
                              failure_backoff_s=0)
    order = random.Random(5).choices(sorted(models), k=120)
    broken_state: list[str] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            broken_state.extend(manager.table.problems())
            await asyncio.sleep(0)

    async def one(model: str) -> str:
        try:
            async with manager.use(model) as worker:
                return (await asyncio.to_thread(worker.predict, [1]))["model"]
        except errors.HotsetError as exc:
            return type(exc).__name__

    watcher = asyncio.create_task(watch())
    try:
        semaphore = asyncio.Semaphore(8)

        async def bounded(model: str) -> str:
            async with semaphore:
                return await one(model)

        answers = await asyncio.gather(*(bounded(model) for model in order))
        await manager.settled()
    finally:
        done.set()
        await watcher
        await manager.close()
    assert broken_state == []
    assert [a for m, a in zip(order, answers) if m != "broken"] == [m for m in order if m != "broken"]
    assert all(a == "ModelLoadFailed" for m, a in zip(order, answers) if m == "broken")


async def test_a_deadline_in_the_admission_queue_passes_when_the_clock_says_so(tmp_path) -> None:
    clock = ManualClock()
    store = ballast.catalog(tmp_path, {key: {"size": MiB} for key in "abc"})
    manager = ballast.manager(store, budget=100 * MiB, max_models=1, admission_control=False, clock=clock)
    try:
        holder = manager.use("a")
        await holder.__aenter__()  # a serves: the only slot is taken
        loading_b = asyncio.create_task(manager.load("b"))  # b loads, with a promised as its victim
        waiting_c = asyncio.create_task(manager.load("c", timeout_s=5.0))
        while manager.queued_requests() != 1:
            await asyncio.sleep(0)
        clock.advance(4.9)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting_c.done()  # 0.1 s left on its clock
        clock.advance(0.1)
        with pytest.raises(errors.NoCapacity, match="deadline passed after 5.0s in the admission queue"):
            await waiting_c
        assert manager.queued_requests() == 0
        await holder.__aexit__(None, None, None)
        await loading_b
        manager.table.check()
    finally:
        await manager.close()
