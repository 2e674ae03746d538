"""The copy loop looks only at models that changed or can need something, in bounded chunks between
yields to the event loop; and router replicas count the workers' demand, so they decide as one and
one of them acts (fake workers, an injected clock; assertions on work done, never on time)."""
from __future__ import annotations

import asyncio
import json
import random

from hotset_common.eviction import DecayedCount
from hotset_common.wire import CatalogEntry, CopyState, ModelCopy, WorkerStatus
from hotset_router.discovery import StaticDiscovery
from hotset_router.model_map import ModelMap
from hotset_router.placement import PlacementSettings
from hotset_router.replicas import Replicas
from hotset_router.replication import ModelLimits, ReplicationPolicy, ReplicationSettings
from hotset_router.routing import Router
from hotset_router.status_sync import StatusSync
from hotset_router.telemetry import RouterMetrics
from hotset_router.upstream import UpstreamResponse

MiB = 2**20


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeWorker:
    """One worker: its copies, each with the decayed request count a worker keeps, and the routers
    that asked it for reports."""

    def __init__(self, url: str, catalog: list[str], clock: Clock) -> None:
        self.url = url
        self.catalog = catalog
        self.clock = clock
        self.copies: dict[str, DecayedCount] = {}
        self.routers: dict[str, float] = {}
        self.loads: list[str] = []
        self.asked_to_load: list[tuple[str, str]] = []  # (router, model) of every load call

    def status(self) -> WorkerStatus:
        now = self.clock()
        return WorkerStatus(
            pod=self.url.removeprefix("http://"), ready=True, triton_ready=True, memory_budget_bytes=10_000 * MiB,
            used_bytes=len(self.copies) * MiB, free_bytes=(10_000 - len(self.copies)) * MiB,
            models=[ModelCopy(id=m, framework="torchvision", state=CopyState.READY, bytes=MiB, loaded_at_s=999,
                              frequency=count.value(now)) for m, count in self.copies.items()],
            catalog=[CatalogEntry(id=m, framework="torchvision", memory_bytes=MiB) for m in self.catalog],
            routers=sorted(r for r, seen in self.routers.items() if now - seen <= 10))


class FakeClient:
    """What one router replica's WorkerClient does, against the fake workers; names its router on status calls."""

    def __init__(self, workers: dict[str, FakeWorker], router_id: str) -> None:
        self.workers = workers
        self.router_id = router_id

    async def status(self, url: str, since: str | None = None, limit: int | None = None) -> WorkerStatus:
        worker = self.workers[url]
        worker.routers[self.router_id] = worker.clock()
        return worker.status()

    async def load(self, url: str, model: str, timeout_s: float | None = None, load_timeout_s: float | None = None) -> None:
        worker = self.workers[url]
        worker.asked_to_load.append((self.router_id, model))
        if model not in worker.copies:
            worker.loads.append(model)
            worker.copies[model] = DecayedCount()

    async def unload(self, url: str, model: str) -> None:
        self.workers[url].copies.pop(model, None)

    async def forward(self, url, method, path, body, headers, timeout_s=None) -> UpstreamResponse:
        worker = self.workers[url]
        model = json.loads(body)["model_id"]
        if model not in worker.copies:
            await self.load(url, model)
        worker.copies[model].add(worker.clock())  # the worker counts every request it serves
        return UpstreamResponse(200, {}, b"{}")


def build(workers: dict[str, FakeWorker], router_id: str, clock: Clock, settings: ReplicationSettings,
          limits: ModelLimits = ModelLimits(0, 2)) -> Router:
    client = FakeClient(workers, router_id)
    policy = ReplicationPolicy(settings, clock)
    model_map = ModelMap(clock=clock, on_arrivals=policy.record_arrivals)
    replicas = Replicas(router_id, model_map.router_ids)
    sync = StatusSync(model_map, client, StaticDiscovery(list(workers)))  # type: ignore[arg-type]
    router = Router(model_map, client, sync, policy, lambda m: limits, RouterMetrics(),  # type: ignore[arg-type]
                    PlacementSettings(granularity_bytes=1), random.Random(1), clock=clock, owns=replicas.owns)
    router.replicas = replicas  # type: ignore[attr-defined]
    return router


async def settle(*routers: Router) -> None:
    for router in routers:
        while router._background or router.loads.in_flight:
            await asyncio.gather(*list(router._background), *list(router.loads.in_flight.values()))


def body(model: str) -> bytes:
    return json.dumps({"model_id": model, "input_data": [1]}).encode()


async def test_a_pass_looks_at_every_model_once_in_chunks_then_only_at_what_changed():
    clock = Clock()
    catalog = [f"m{i}" for i in range(2000)]
    workers = {"http://w1": FakeWorker("http://w1", catalog, clock)}
    router = build(workers, "r1", clock, ReplicationSettings(), ModelLimits(0, 1))
    await router.sync.refresh_all()
    seen_at_yield: list[int] = []

    async def pause() -> None:
        seen_at_yield.append(router.copy_loop.considered)
        await asyncio.sleep(0)

    router.copy_loop.pause = pause
    router.copy_loop.chunk = 100
    await router.reconcile_once()
    steps = [b - a for a, b in zip([0, *seen_at_yield], [*seen_at_yield, router.copy_loop.considered])]
    assert router.copy_loop.considered == 2000 and len(seen_at_yield) == 19 and max(steps) <= 100
    for _ in range(3):  # nothing changes: a pass looks at nothing, whatever the catalog holds
        clock.now += 1
        await router.sync.refresh_all()
        await router.reconcile_once()
    assert router.copy_loop.considered == 2000
    await router.forward("m1234", "POST", "/predict", body("m1234"), {})  # loads it, and it has traffic now
    clock.now += 1
    await router.sync.refresh_all()
    await router.reconcile_once()
    assert router.copy_loop.considered == 2001


async def test_two_replicas_add_one_copy_for_load_that_neither_sees_enough_of_alone():
    clock = Clock()
    workers = {u: FakeWorker(u, ["hot", "cool"], clock) for u in ("http://w1", "http://w2", "http://w3")}
    workers["http://w1"].copies["hot"] = DecayedCount()
    settings = ReplicationSettings(rps_per_copy=20, inflight_per_copy=4, window_s=2, idle_s=60, churn_guard_s=0)
    first, second = (build(workers, name, clock, settings) for name in ("router-a", "router-b"))

    async def second_of_traffic(routers: list[Router], per_router_per_s: int) -> None:
        """One second in four steps: each router sends its share, then every router syncs and decides."""
        for _ in range(4):
            clock.now += 0.25
            for router in routers:
                for _ in range(per_router_per_s // 4):
                    assert (await router.forward("hot", "POST", "/predict", body("hot"), {})).status_code == 200
            for router in (first, second):
                await router.sync.refresh_all()
            for router in (first, second):
                await router.reconcile_once()
            await settle(first, second)

    for router in (first, second):  # each learns of the other from the workers' reports
        await router.sync.refresh_all()
    await second_of_traffic([first, second], 0)
    assert first.replicas.live() == second.replicas.live() == {"router-a", "router-b"}
    assert first.replicas.owner("hot") == second.replicas.owner("hot")

    for _ in range(4):  # 16 requests a second through one router: below 20 per copy, nothing to add
        await second_of_traffic([first], 16)
    assert sum(w.loads.count("hot") for w in workers.values()) == 0

    for _ in range(4):  # 16 a second through each: 32 per copy in all, which both replicas see
        await second_of_traffic([first, second], 16)
    assert sum(w.loads.count("hot") for w in workers.values()) == 1  # one copy added, once
    asked = [router for w in workers.values() for router, model in w.asked_to_load if model == "hot"]
    assert asked == [first.replicas.owner("hot")]  # by the one replica that acts for the model
    for router in (first, second):
        assert len(router.model_map.ready_copies("hot")) == 2
