"""The map is indexed by model: routing one model reads that model's copies and nothing else, and a
report costs what it changed (assertions on the structures consulted, never on time)."""
from __future__ import annotations

import random
from typing import Any

from hotset_common.wire import CatalogEntry, CopyState, ModelCopy, WorkerStatus
from hotset_router.model_map import ModelMap
from hotset_router.placement import PlacementSettings
from hotset_router.targets import Targets
from hotset_router.replication import ModelLimits
from hotset_router.telemetry import RouterMetrics

MiB = 2**20
PODS = 50
COPIES = 200
MODELS = PODS * COPIES


def report(pod: int, copies: list[str], catalog: list[str], **extra: Any) -> WorkerStatus:
    return WorkerStatus(
        pod=f"p{pod}", ready=True, triton_ready=True, memory_budget_bytes=8000 * MiB, used_bytes=COPIES * MiB,
        free_bytes=(8000 - COPIES) * MiB, models=[ModelCopy(id=m, framework="torchvision", state=CopyState.READY, bytes=MiB)
                                                  for m in copies],
        catalog=[CatalogEntry(id=m, framework="torchvision", memory_bytes=MiB) for m in catalog], **extra)


def big_map() -> ModelMap:
    """50 pods, each listing 10,000 models and holding 200 of them (each model on one pod)."""
    model_map = ModelMap()
    names = [f"m{j}" for j in range(MODELS)]
    for pod in range(PODS):
        model_map.apply_status(f"http://p{pod}", report(pod, names[pod::PODS], names))
    return model_map


class Watched(dict):
    """A dict that records every key looked up, and refuses to be walked."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.looked_up: list[str] = []

    def get(self, key: str, default: Any = None) -> Any:
        self.looked_up.append(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.looked_up.append(key)
        return super().__getitem__(key)

    def __iter__(self):
        raise AssertionError("walked every entry")

    def items(self):
        raise AssertionError("walked every entry")

    def values(self):
        raise AssertionError("walked every entry")


class Untouchable(dict):
    """A pod's copies: routing must not read them at all."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("read a pod's copies")

    get = __getitem__ = __iter__ = items = values = __contains__ = _refuse  # type: ignore[assignment]


def test_choosing_a_copy_reads_only_that_models_copies():
    model_map = big_map()
    targets = Targets(model_map, lambda: (lambda m: ModelLimits(0, 1)), lambda: (lambda m, u: True), RouterMetrics(),
                      PlacementSettings(), random.Random(1), 5)
    model_map._by_model = Watched(model_map._by_model)
    for pod in model_map.pods():
        pod.copies = Untouchable(pod.copies)
        pod.reported = Untouchable(pod.reported)
    for _ in range(10):
        url, cold = targets.target("m4321", tried=[], load=True)
        assert url == "http://p21" and not cold
        model_map.begin_request(url, "m4321")
        model_map.end_request(url, "m4321")
    assert set(model_map._by_model.looked_up) == {"m4321"}
    assert model_map.ready_copies("m4321") == ["http://p21"]


def test_a_delta_report_changes_only_what_it_names():
    model_map = big_map()
    before = dict(model_map.pod("http://p3").copies)
    model_map.take_changed()
    model_map.apply_status("http://p3", report(3, ["m3", "new-one"], [], delta=True, removed_models=["m53"],
                                               cursor="e.2"))
    after = model_map.pod("http://p3").copies
    assert set(after) == set(before) - {"m53"} | {"new-one"}
    assert all(after[m] is before[m] for m in before if m not in ("m3", "m53"))  # the other 198 untouched
    assert model_map.take_changed() == {"m53", "new-one"}  # m3 changed its figures, not its state
    assert model_map.ready_copies("m53") == [] and model_map.ready_copies("new-one") == ["http://p3"]
    assert len(model_map.pod("http://p3").catalog) == MODELS  # a delta without catalog entries keeps the catalog


def test_a_whole_state_in_pages_replaces_what_the_pod_held_once_its_last_page_is_in():
    model_map = ModelMap()
    model_map.apply_status("http://p", report(0, ["a", "b"], ["a", "b", "c"]))
    model_map.apply_status("http://p", report(0, ["b"], ["b"], more=True, cursor="e2.1"))  # a restarted worker
    assert model_map.ready_copies("a") == ["http://p"]  # what it held stays until the whole state is in
    model_map.apply_status("http://p", report(0, ["x"], ["x"], delta=True, cursor="e2.2"))
    assert model_map.ready_copies("a") == [] and model_map.ready_copies("b") == ["http://p"]
    assert model_map.is_known("x") and not model_map.is_known("a") and not model_map.is_known("c")


def test_demand_is_what_the_worker_served_between_two_reports():
    arrivals: list[tuple[str, float]] = []
    now = [100.0]
    model_map = ModelMap(clock=lambda: now[0], on_arrivals=lambda model, n: arrivals.append((model, n)))

    def copy(frequency: float) -> ModelCopy:
        return ModelCopy(id="a", framework="torchvision", state=CopyState.READY, bytes=MiB, frequency=frequency)

    base = report(0, [], ["a"])
    model_map.apply_status("http://p", base.model_copy(update={"models": [copy(40.0)]}))
    assert arrivals == []  # the first sight of a copy says nothing about the rate
    now[0] += 30.0  # one half-life: 40 decayed to 20, so 25 arrived
    model_map.apply_status("http://p", base.model_copy(update={"models": [copy(45.0)], "delta": True}))
    assert [(m, round(n, 6)) for m, n in arrivals] == [("a", 25.0)]


def test_a_canary_no_pod_lists_is_never_chosen():
    """A promotion's reports arrive pod by pod: one pod still names `m`'s canary `m_2` while no
    pod's catalog lists `m_2` any more. Choosing it then was a 404 (`m_2` is served by no worker)."""
    model_map = ModelMap()
    stale = report(0, ["m"], [])
    stale.catalog = [CatalogEntry(id="m", framework="torchvision", memory_bytes=MiB, canary="m_2", canary_weight=100)]
    model_map.apply_status("http://p0", stale)
    model_map.apply_status("http://p1", report(1, ["m"], ["m"]))
    targets = Targets(model_map, lambda: (lambda m: ModelLimits(0, 1)), lambda: (lambda m, u: True), RouterMetrics(),
                      PlacementSettings(), random.Random(1), 5)
    assert model_map.canary_of("m") == ("m_2", 100) and not model_map.is_known("m_2")
    assert {targets.choose_variant("m") for _ in range(20)} == {"m"}
    model_map.apply_status("http://p1", report(1, ["m"], ["m", "m_2"]))  # the canary's version is listed: it takes its share
    assert {targets.choose_variant("m") for _ in range(20)} == {"m_2"}
