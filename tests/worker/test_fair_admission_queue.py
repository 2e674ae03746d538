"""The admission queue is shared fairly between namespaces: a cold model of namespace B is loaded
next but one, not behind every cold model namespace A queued first; weights share the loads; and
the queue's places are shared work-conserving: a namespace alone uses them, one arriving later
gets the reserve at once and the places the first gives back. Real manager, ballast models; room for
one copy, held by a request while the queue fills: the first request is promised that room (its
load starts once the holder is done) and every later one waits its turn in the queue."""
from __future__ import annotations

import asyncio
from typing import Callable

import pytest

from hotset_common import errors
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_worker.store import MemoryModelStore


def store_of(tmp_path, models: dict[str, str]) -> MemoryModelStore:
    """A store of 1 MiB ballast models: {model id: its namespace ("": none)}."""
    store = MemoryModelStore()
    for model_id, namespace in models.items():
        folder = ballast.write_model(tmp_path / model_id, MiB)
        store.put(ballast.make_spec(model_id, folder, memory=MiB, sourceOptions={"namespace": namespace} if namespace else {}))
    return store


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.005)


def waits_or_loads(manager, model_id: str) -> bool:
    return manager.table.get(model_id) is not None or model_id in [m for m, _, _ in manager.waiting()]


def loads_in_order() -> list[str]:
    return [event.split(":", 1)[1] for event in ballast.EVENTS if event.startswith("load:")]


async def queue_while_room_is_held(manager, requests: list[str]) -> list[asyncio.Task]:
    """Queue one request per model in `requests` (in that order) while `hold` keeps the only room;
    return the requests once room is free again."""
    tasks: list[asyncio.Task] = []
    async with manager.use("hold"):
        for model_id in requests:
            tasks.append(asyncio.create_task(ballast.predict(manager, model_id, timeout_s=30)))
            await until(lambda: waits_or_loads(manager, model_id), f"{model_id} queued")
    return tasks


@pytest.fixture(autouse=True)
def counters():
    ballast.reset_counters()
    yield


async def test_a_cold_model_of_b_is_loaded_next_but_one_not_behind_a_flood_of_a(tmp_path) -> None:
    flood = [f"a{i}" for i in range(6)]
    store = store_of(tmp_path, {"hold": "", **{m: "a" for m in flood}, "b0": "b"})
    manager = ballast.manager(store, budget=64 * MiB, max_models=1, admission_control=False)
    try:
        await manager.load("hold")
        tasks = await queue_while_room_is_held(manager, [*flood, "b0"])
        assert sorted(await asyncio.gather(*tasks)) == sorted([*flood, "b0"])
        order = loads_in_order()[1:]  # after `hold`
        assert order[:2] == ["a0", "b0"], order  # first come first served put b0 seventh
    finally:
        await manager.close()


async def test_weights_share_the_loads(tmp_path) -> None:
    a_models, b_models = [f"a{i}" for i in range(8)], [f"b{i}" for i in range(8)]
    store = store_of(tmp_path, {"hold": "", **{m: "a" for m in a_models}, **{m: "b" for m in b_models}})
    manager = ballast.manager(store, budget=64 * MiB, max_models=1, admission_control=False, max_queue=64)
    manager.queue.weight_of = lambda namespace: {"a": 3.0}.get(namespace, 1.0)
    try:
        await manager.load("hold")
        tasks = await queue_while_room_is_held(manager, [*b_models, *a_models])  # b first in line
        await asyncio.gather(*tasks)
        first_eight = loads_in_order()[1:9]  # b0 (promised the room), then the queue's order
        assert sum(m.startswith("a") for m in first_eight) == 6, first_eight  # 3 : 1 after b0
    finally:
        await manager.close()


async def test_a_namespace_alone_uses_the_places_and_a_second_gets_the_ones_it_gives_back(tmp_path) -> None:
    """Work-conserving places (hotset_common.shares): 8 places, a reserve of 1. A local request
    (no namespace) takes one, so `a` alone may hold 8 - 1 - 1 = 6; `b` then gets the reserve at
    once, and the place a client of `a` gives up is `b`'s, not `a`'s."""
    store = store_of(tmp_path, {"hold": "", **{f"a{i}": "a" for i in range(8)}, "b0": "b", "b1": "b", "local": ""})
    manager = ballast.manager(store, budget=64 * MiB, max_models=1, admission_control=False, max_queue=8)

    async def queue(model_id: str) -> asyncio.Task:
        task = asyncio.create_task(ballast.predict(manager, model_id, timeout_s=30))
        await until(lambda: waits_or_loads(manager, model_id), f"{model_id} queued")
        return task

    async def refused(model_id: str) -> str:
        with pytest.raises(errors.NoCapacity) as refusal:
            await ballast.predict(manager, model_id, timeout_s=30)
        assert int(refusal.value.headers["Retry-After"]) >= 1
        return str(refusal.value)

    try:
        await manager.load("hold")
        async with manager.use("hold"):
            tasks = [await queue("a0"), await queue("local")]  # a0 is promised the room; local is in no share
            tasks += [await queue(f"a{number}") for number in range(1, 7)]  # the old rule stopped `a` at 8 x 1 / (1 + 1)
            assert manager.queued_requests() == 7
            assert "namespace 'a' holds 6 of the admission queue's 8 places, at or past its share of 6" in await refused("a7")
            tasks.append(await queue("b0"))  # the reserve: a namespace not yet waiting queues at once
            assert "the admission queue is full" in await refused("b1")
            gone = tasks.pop(7)  # a6's client gives up: its place is freed
            gone.cancel()
            await until(lambda: manager.queued_requests() == 7, "a6 gone")
            assert "its share of 3 " in await refused("a7")  # (8 - 1 - 1) x 1 / 2; the free place is owed to b
            tasks.append(await queue("b1"))
        assert sorted(await asyncio.gather(*tasks)) == ["a0", "a1", "a2", "a3", "a4", "a5", "b0", "b1", "local"]
        assert ballast.LOADS["a7"] == 0  # refused before it could load, evicting nothing
    finally:
        await manager.close()
