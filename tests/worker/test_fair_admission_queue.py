"""The admission queue is shared fairly between namespaces: a cold model of namespace B is loaded
next but one, not behind every cold model namespace A queued first; weights share the loads; and a
namespace may hold only its share of the queue's places. Real manager, ballast models; room for
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


async def test_a_namespace_holds_only_its_share_of_the_places(tmp_path) -> None:
    store = store_of(tmp_path, {"hold": "", **{f"a{i}": "a" for i in range(6)}, "b0": "b", "local": ""})
    manager = ballast.manager(store, budget=64 * MiB, max_models=1, admission_control=False, max_queue=8)
    try:
        await manager.load("hold")
        tasks: list[asyncio.Task] = []
        async with manager.use("hold"):
            for number in range(5):  # a0 is promised the room; alone, a may hold 8 * 1 / (1 + 1) = 4 places
                tasks.append(asyncio.create_task(ballast.predict(manager, f"a{number}", timeout_s=30)))
                await until(lambda: waits_or_loads(manager, f"a{number}"), "a's request queued")
            assert manager.queued_requests() == 4
            with pytest.raises(errors.NoCapacity) as refused:
                await ballast.predict(manager, "a5", timeout_s=30)
            assert "namespace 'a' holds 4 of the admission queue's 8 places" in str(refused.value)
            assert int(refused.value.headers["Retry-After"]) >= 1
            tasks.append(asyncio.create_task(ballast.predict(manager, "b0", timeout_s=30)))  # another namespace still queues
            tasks.append(asyncio.create_task(ballast.predict(manager, "local", timeout_s=30)))  # no namespace: not limited
            await until(lambda: manager.queued_requests() == 6, "b0 and local queued")
        assert sorted(await asyncio.gather(*tasks)) == ["a0", "a1", "a2", "a3", "a4", "b0", "local"]
        assert ballast.LOADS["a5"] == 0  # refused before it could load, evicting nothing
    finally:
        await manager.close()
