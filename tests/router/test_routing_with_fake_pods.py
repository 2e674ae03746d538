"""Routing decisions against fake pods (one function under test: Router; no servers).

The real-process versions of these behaviours are in test_gateway_*.py.
"""
from __future__ import annotations

import asyncio
import json
import random

import pytest

from hotset_common import errors
from hotset_common.wire import CatalogEntry, CopyState, ModelCopy, WorkerStatus
from hotset_router.callers import ANONYMOUS
from hotset_router.discovery import StaticDiscovery
from hotset_router.model_map import ModelMap
from hotset_router.placement import PlacementSettings
from hotset_router.replication import ModelLimits, ReplicationPolicy, ReplicationSettings
from hotset_router.routing import Router
from hotset_router.status_sync import StatusSync
from hotset_router.telemetry import RouterMetrics
from hotset_router.upstream import PodUnreachable, UpstreamResponse

MiB = 2**20


class FakePod:
    def __init__(self, url: str, budget: int, catalog: dict[str, int], classes: dict[str, str] | None = None,
                 load_timeouts: dict[str, float] | None = None) -> None:
        self.url = url
        self.budget = budget
        self.catalog = catalog
        self.classes = classes or {}  # model -> latency class, as its spec says (default standard)
        self.load_timeouts = load_timeouts or {}  # model -> its spec's loadTimeoutSeconds
        self.load_budgets: list[tuple[str, float | None, float | None]] = []  # (model, timeout_s, load_timeout_s) asked
        self.loaded: dict[str, int] = {}
        self.loads: list[str] = []
        self.served: list[str] = []
        self.down = False
        self.fail_with: int | None = None

    def status(self) -> WorkerStatus:
        used = sum(self.loaded.values())
        return WorkerStatus(
            pod=self.url.removeprefix("http://"), ready=True, triton_ready=True, memory_budget_bytes=self.budget,
            used_bytes=used, free_bytes=self.budget - used,
            models=[ModelCopy(id=m, framework="torchvision", state=CopyState.READY, bytes=b, loaded_at_s=999) for m, b in self.loaded.items()],
            catalog=[CatalogEntry(id=m, framework="torchvision", memory_bytes=b, latency_class=self.classes.get(m, "standard"),
                                  load_timeout_s=self.load_timeouts.get(m, 0.0))
                     for m, b in self.catalog.items()],
        )


class FakeClient:
    """Stands in for WorkerClient: same four calls, in-memory pods."""

    def __init__(self, pods: list[FakePod], load_delay_s: float = 0.0) -> None:
        self.pods = {p.url: p for p in pods}
        self.load_delay_s = load_delay_s
        self._loading: dict[tuple[str, str], asyncio.Future[None]] = {}

    def _pod(self, url: str) -> FakePod:
        pod = self.pods[url]
        if pod.down:
            raise PodUnreachable(url, ConnectionRefusedError())
        return pod

    async def status(self, url: str, since: str | None = None, limit: int | None = None) -> WorkerStatus:
        return self._pod(url).status()  # always whole, as a worker that does not page answers

    async def load(self, url: str, model: str, timeout_s: float | None = None, load_timeout_s: float | None = None) -> None:
        """One load per model and pod however many calls wait for it, as a worker does."""
        pod = self._pod(url)
        pod.load_budgets.append((model, timeout_s, load_timeout_s))
        if model in pod.loaded:
            return
        if (url, model) not in self._loading:
            self._loading[(url, model)] = asyncio.ensure_future(self._load(pod, model))
        await asyncio.shield(self._loading[(url, model)])

    async def _load(self, pod: FakePod, model: str) -> None:
        await asyncio.sleep(self.load_delay_s)
        pod.loads.append(model)
        pod.loaded[model] = pod.catalog[model]
        del self._loading[(pod.url, model)]

    @staticmethod
    def _model_of(path: str, body: bytes) -> str:
        if path == "/predict":
            return json.loads(body or b"{}").get("model_id", "")
        return path.split("/")[3]

    async def unload(self, url: str, model: str) -> None:
        self._pod(url).loaded.pop(model, None)

    async def forward(self, url, method, path, body, headers, timeout_s=None) -> UpstreamResponse:
        pod = self._pod(url)
        if method == "POST" and pod.catalog and self._model_of(path, body) not in pod.loaded:
            await self.load(url, self._model_of(path, body))  # a worker loads on demand
        pod.served.append(path)
        if pod.fail_with:
            return UpstreamResponse(pod.fail_with, {}, json.dumps({"error": "boom"}).encode())
        return UpstreamResponse(200, {}, json.dumps({"pod": url}).encode())


def predict_body(model: str) -> bytes:
    return json.dumps({"model_id": model, "input_data": [1]}).encode()


def build(pods: list[FakePod], load_delay_s: float = 0.0) -> tuple[Router, ModelMap, FakeClient]:
    client = FakeClient(pods, load_delay_s)
    model_map = ModelMap()
    sync = StatusSync(model_map, client, StaticDiscovery([p.url for p in pods]))  # type: ignore[arg-type]
    router = Router(model_map, client, sync, ReplicationPolicy(ReplicationSettings()), lambda m: ModelLimits(0, 2),  # type: ignore[arg-type]
                    RouterMetrics(), PlacementSettings(granularity_bytes=1), random.Random(1))
    return router, model_map, client


CATALOG = {"a": 100 * MiB, "b": 300 * MiB, "c": 100 * MiB}


async def test_model_loaded_on_pod_two_is_sent_there_and_not_loaded_again():
    p1, p2 = FakePod("http://p1", 1000 * MiB, CATALOG), FakePod("http://p2", 1000 * MiB, CATALOG)
    p2.loaded["a"] = 100 * MiB
    router, _, _ = build([p1, p2])
    await router.sync.refresh_all()
    for _ in range(5):
        response = await router.forward("a", "POST", "/predict", predict_body("a"), {})
        assert response.json() == {"pod": "http://p2"}
    assert p1.loads == [] and p2.loads == [] and p1.served == []


async def test_twenty_concurrent_requests_for_a_cold_model_cause_one_load():
    pods = [FakePod("http://p1", 1000 * MiB, CATALOG), FakePod("http://p2", 1000 * MiB, CATALOG)]
    router, _, _ = build(pods, load_delay_s=0.05)
    await router.sync.refresh_all()
    answers = await asyncio.gather(*(router.forward("b", "POST", "/predict", predict_body("b"), {}) for _ in range(20)))
    assert all(a.status_code == 200 for a in answers)
    assert sorted(pods[0].loads + pods[1].loads) == ["b"]


async def test_cold_model_lands_on_the_best_fitting_pod():
    roomy, tight = FakePod("http://roomy", 2000 * MiB, CATALOG), FakePod("http://tight", 1000 * MiB, CATALOG)
    tight.loaded["c"] = 100 * MiB  # 900 MiB free vs 2000 MiB free
    router, _, _ = build([roomy, tight])
    await router.sync.refresh_all()
    await router.forward("b", "POST", "/predict", predict_body("b"), {})
    assert tight.loads == ["b"] and roomy.loads == []


CLASSES = {"rt": "realtime", "job": "batch", "job2": "batch"}
CLASSED = {"rt": 100 * MiB, "job": 100 * MiB, "job2": 100 * MiB, "plain": 100 * MiB}


async def test_a_realtime_model_goes_to_a_pod_without_batch_copies_even_where_batch_copies_fit_it_better():
    busy, roomy = FakePod("http://busy", 1000 * MiB, CLASSED, CLASSES), FakePod("http://roomy", 2000 * MiB, CLASSED, CLASSES)
    busy.loaded["job"] = 100 * MiB  # best fit alone would choose busy (900 MiB free vs 2000)
    router, model_map, _ = build([busy, roomy])
    await router.sync.refresh_all()
    assert model_map.latency_class("rt").value == "realtime"
    await router.forward("rt", "POST", "/predict", predict_body("rt"), {})
    assert roomy.loads == ["rt"] and busy.loads == []
    # and the reverse: the second batch model joins the first, away from the realtime copy
    await router.sync.refresh_all()
    await router.forward("job2", "POST", "/predict", predict_body("job2"), {})
    assert busy.loads == ["job2"] and roomy.loads == ["rt"]


async def test_standard_models_still_pack_beside_either_side():
    with_rt, with_job = FakePod("http://rt", 1000 * MiB, CLASSED, CLASSES), FakePod("http://job", 2000 * MiB, CLASSED, CLASSES)
    with_rt.loaded["rt"] = 100 * MiB
    with_job.loaded["job"] = 100 * MiB
    router, _, _ = build([with_rt, with_job])
    await router.sync.refresh_all()
    await router.forward("plain", "POST", "/predict", predict_body("plain"), {})
    assert with_rt.loads == ["plain"]  # plain best fit: the tighter pod, whatever its class


async def test_with_every_pod_holding_batch_copies_a_realtime_model_is_still_served():
    only = FakePod("http://only", 1000 * MiB, CLASSED, CLASSES)
    only.loaded["job"] = 100 * MiB
    router, _, _ = build([only])
    await router.sync.refresh_all()
    # the worker evicts the batch copy before it loads (tests/worker/test_latency_classes.py)
    assert (await router.forward("rt", "POST", "/predict", predict_body("rt"), {})).status_code == 200
    assert only.loads == ["rt"]


async def test_a_dead_pod_is_skipped_and_leaves_the_map():
    p1, p2 = FakePod("http://p1", 1000 * MiB, CATALOG), FakePod("http://p2", 1000 * MiB, CATALOG)
    p1.loaded["a"] = p2.loaded["a"] = 100 * MiB
    router, model_map, _ = build([p1, p2])
    await router.sync.refresh_all()
    p1.down = True
    for _ in range(6):
        assert (await router.forward("a", "POST", "/predict", predict_body("a"), {})).json() == {"pod": "http://p2"}
    assert [p.url for p in model_map.pods()] == ["http://p2"]


async def test_a_5xx_is_retried_once_on_another_copy():
    p1, p2 = FakePod("http://p1", 1000 * MiB, CATALOG), FakePod("http://p2", 1000 * MiB, CATALOG)
    p1.loaded["a"] = p2.loaded["a"] = 100 * MiB
    p1.fail_with = 500
    router, model_map, _ = build([p1, p2])
    await router.sync.refresh_all()
    for _ in range(4):
        assert (await router.forward("a", "POST", "/predict", predict_body("a"), {})).status_code == 200
    assert model_map.ready_copies("a") == ["http://p2"]  # skipped until p1's next report


async def test_a_4xx_from_the_worker_is_not_retried():
    p1, p2 = FakePod("http://p1", 1000 * MiB, CATALOG), FakePod("http://p2", 1000 * MiB, CATALOG)
    p1.loaded["a"] = p2.loaded["a"] = 100 * MiB
    p1.fail_with = p2.fail_with = 400
    router, _, _ = build([p1, p2])
    await router.sync.refresh_all()
    assert (await router.forward("a", "POST", "/predict", predict_body("a"), {})).status_code == 400
    assert len(p1.served) + len(p2.served) == 1


async def test_unknown_model_is_404_and_no_room_is_503_with_retry_after():
    router, _, _ = build([FakePod("http://p1", 200 * MiB, CATALOG)])
    await router.sync.refresh_all()
    with pytest.raises(errors.ModelNotFound, match="'nope'"):
        await router.forward("nope", "POST", "/predict", predict_body("nope"), {})
    with pytest.raises(errors.NoCapacity, match="no worker pod has room for 'b'") as caught:
        await router.forward("b", "POST", "/predict", predict_body("b"), {})
    assert "Retry-After" in caught.value.headers


async def test_power_of_two_choices_prefers_the_idle_copy():
    pods = [FakePod(f"http://p{i}", 1000 * MiB, CATALOG) for i in range(2)]
    for p in pods:
        p.loaded["a"] = 100 * MiB
    router, model_map, _ = build(pods)
    await router.sync.refresh_all()
    for _ in range(5):
        model_map.begin_request("http://p0", "a")
    assert {router.choose_copy("a", ["http://p0", "http://p1"]) for _ in range(20)} == {"http://p1"}


async def test_control_loop_brings_a_model_up_to_its_minimum_copies_on_distinct_pods():
    pods = [FakePod(f"http://p{i}", 1000 * MiB, CATALOG) for i in range(3)]
    router, model_map, _ = build(pods)
    router.limits_for = lambda m: ModelLimits(2, 2) if m == "a" else ModelLimits(0, 1)
    await router.sync.refresh_all()
    for _ in range(50):
        await router.reconcile_once()
        await asyncio.sleep(0.01)
        if len(model_map.ready_copies("a")) == 2:
            break
    assert len(model_map.ready_copies("a")) == 2
    assert sorted(len(p.loads) for p in pods) == [0, 1, 1]
    assert all(p.loads in ([], ["a"]) for p in pods)


async def test_a_minimum_copy_of_a_slow_model_is_waited_for_as_long_as_its_own_load_timeout():
    pods = [FakePod("http://p0", 1000 * MiB, CATALOG, load_timeouts={"b": 1800.0})]
    router, model_map, _ = build(pods)
    router.limits_for = lambda m: ModelLimits(1, 1) if m in ("a", "b") else ModelLimits(0, 1)
    await router.sync.refresh_all()
    assert model_map.load_timeout_s("b") == 1800.0 and model_map.load_timeout_s("a") is None
    for _ in range(50):
        await router.reconcile_once()
        await asyncio.sleep(0.01)
        if model_map.ready_copies("a") and model_map.ready_copies("b"):
            break
    asked = {model: (timeout_s, own) for model, timeout_s, own in pods[0].load_budgets}
    assert asked["b"][1] == 1800.0 and asked["b"][0] > 1700  # its own, not the router's request timeout
    assert asked["a"][1] is None and asked["a"][0] <= 60  # the router's values


async def test_a_pod_of_another_pool_never_gets_a_new_copy():
    shared, dedicated = FakePod("http://shared", 2000 * MiB, CATALOG), FakePod("http://dedicated", 400 * MiB, CATALOG)
    router, _, _ = build([shared, dedicated])
    router.eligible = lambda model, url: url != "http://dedicated"  # best fit alone would pick it
    await router.sync.refresh_all()
    await router.forward("b", "POST", "/predict", predict_body("b"), {})
    assert shared.loads == ["b"] and dedicated.loads == []


async def settle(router: Router) -> None:
    """Wait for the background loads the control loop started."""
    while router._background:
        await asyncio.gather(*list(router._background))


async def test_control_loop_never_places_a_dedicated_model_and_says_nothing(caplog):
    # A shared pod whose catalog still lists the model (a store update on its way), and its own
    # dedicated pod holding one pinned copy of the two it wants: the second comes from the
    # operator's second dedicated pod, never from the router.
    shared, own = FakePod("http://shared", 2000 * MiB, CATALOG), FakePod("http://own", 400 * MiB, {"a": 100 * MiB})
    own.loaded["a"] = 100 * MiB
    router, model_map, _ = build([shared, own])
    router.limits_for = lambda m: ModelLimits(2, 2, dedicated=True) if m == "a" else ModelLimits(0, 1)
    await router.sync.refresh_all()
    with caplog.at_level("INFO", logger="hotset_router.routing"):
        for _ in range(5):
            await router.reconcile_once()
            await settle(router)
        own.loaded.clear()  # no copy anywhere (its pods restarting): still nothing to place
        await router.sync.refresh_all()
        for _ in range(5):
            await router.reconcile_once()
            await settle(router)
    assert shared.loads == [] and own.loads == []
    assert [r.getMessage() for r in caplog.records if "a" in r.getMessage().split()] == []


async def test_a_dedicated_model_without_a_ready_pod_is_503_not_404():
    router, _, _ = build([FakePod("http://shared", 2000 * MiB, CATALOG)])
    router.limits_for = lambda m: ModelLimits(1, 1, dedicated=True) if m == "big" else ModelLimits(0, 1)
    await router.sync.refresh_all()
    with pytest.raises(errors.BackendUnavailable, match="no dedicated pod of 'big' is ready yet"):
        await router.forward("big", "POST", "/predict", predict_body("big"), {})
    with pytest.raises(errors.ModelNotFound, match="'nope'"):
        await router.forward("nope", "POST", "/predict", predict_body("nope"), {})


async def test_a_minimum_copy_that_cannot_be_placed_is_retried_with_back_off(caplog):
    pod = FakePod("http://p1", 200 * MiB, CATALOG)  # "b" (300 MiB) fits nowhere
    router, model_map, _ = build([pod])
    now = [0.0]
    router.clock = lambda: now[0]
    router.limits_for = lambda m: ModelLimits(1, 1) if m == "b" else ModelLimits(0, 1)
    await router.sync.refresh_all()
    with caplog.at_level("WARNING", logger="hotset_router.routing"):
        for second in range(10):
            now[0] = float(second)
            await router.reconcile_once()
            await settle(router)
    tries = [r.getMessage() for r in caplog.records if "could not load b (min)" in r.getMessage()]
    assert [t.rsplit("next try in ", 1)[1] for t in tries] == ["2 s", "4 s", "8 s"]  # at 0 s, 2 s and 6 s
    pod.budget = 1000 * MiB  # room at last: the next try after the back-off loads it
    await router.sync.refresh_all()
    now[0] = 13.0
    await router.reconcile_once()
    await settle(router)
    assert pod.loads == []
    now[0] = 14.0
    await router.reconcile_once()
    await settle(router)
    assert pod.loads == ["b"] and model_map.ready_copies("b") == ["http://p1"]


class SlowReports(FakeClient):
    """Status reports that are read when asked for but land only when the test releases them."""

    def __init__(self, pods: list[FakePod], load_delay_s: float = 0.0) -> None:
        super().__init__(pods, load_delay_s)
        self.release = asyncio.Event()
        self.asked = 0

    async def status(self, url: str, since: str | None = None, limit: int | None = None) -> WorkerStatus:
        report = self._pod(url).status()
        self.asked += 1
        await self.release.wait()
        return report


async def test_a_load_is_served_without_polling_even_when_an_older_report_lands_after_it():
    pod = FakePod("http://p1", 1000 * MiB, CATALOG)
    router, model_map, _ = build([pod])
    await router.sync.refresh_all()
    slow = SlowReports([pod], load_delay_s=0.05)
    router.client = router.sync.client = slow
    stale = asyncio.ensure_future(router.sync.refresh_all())  # asked before the load: 'a' is not there
    await asyncio.sleep(0)
    urls = await asyncio.wait_for(router.ensure_ready_copies("a"), 10)
    assert urls == ["http://p1"] and slow.asked == 1  # the request path asked nobody for a report
    slow.release.set()
    await stale
    assert model_map.ready_copies("a") == ["http://p1"]  # the stale report did not erase the copy


class RefusingCallers:
    """Stands in for callers.Callers: every caller is refused (as a token that fails review is)."""

    async def check(self, headers, model):
        raise errors.Unauthorized("a token that does not authenticate")


async def test_a_caller_refused_never_reaches_its_namespace_share_and_an_admitted_one_does_before_any_pod():
    pod = FakePod("http://p1", 1000 * MiB, CATALOG)
    router, _, _ = build([pod])
    await router.sync.refresh_all()
    steps: list[str] = []
    router.forwarding.callers = RefusingCallers()  # type: ignore[assignment]
    with pytest.raises(errors.Unauthorized):
        await router.forward("a", "POST", "/predict", predict_body("a"), {}, on_admitted=lambda: steps.append("share"))
    assert steps == [] and pod.loads == []  # the flood guard's namespace share never counted it

    router.forwarding.callers = ANONYMOUS
    answer = await router.forward("a", "POST", "/predict", predict_body("a"), {},
                                  on_admitted=lambda: steps.append(f"share before {len(pod.served)} served"))
    assert answer.status_code == 200 and steps == ["share before 0 served"]
