"""More models wanted than fit, through the router to real workers: requests wait instead of failing,
and the router plans the evictions the worker then makes (one cost model, hotset_common.eviction)."""
from __future__ import annotations

import concurrent.futures

import httpx

from gateway_helpers import worker_models, write_ballast_store
from hotset_common.wire import WorkerStatus
from hotset_router import placement
from hotset_router.model_map import ModelMap


def predict(router_url: str, model: str) -> httpx.Response:
    return httpx.post(f"{router_url}/predict", json={"model_id": model, "input_data": [1]}, timeout=60)


def test_twelve_concurrent_requests_for_six_models_on_two_slots_are_all_answered(procs, tmp_path):
    store = write_ballast_store(tmp_path, {f"m{i}": {"mib": 2, "delay": 0.2} for i in range(6)})
    worker = procs.worker("worker", store, "100Mi", extra=["--max-models", "2"])
    router = procs.router([worker])
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda i: predict(router.url, f"m{i % 6}"), range(12)))
    assert [a.status_code for a in answers] == [200] * 12, [a.text for a in answers if a.status_code != 200]
    assert [a.json()["predictions"]["model"] for a in answers] == [f"m{i % 6}" for i in range(12)]
    assert "load;dur=" in answers[0].headers["server-timing"]  # the worker's timing comes through the router


def test_the_router_plans_the_victim_the_worker_then_evicts(procs, tmp_path):
    # slow takes 0.8 s to load again, quick nothing: the cost model drops quick even though slow
    # was used less recently (an LRU would drop slow).
    store = write_ballast_store(tmp_path, {"slow": {"mib": 10, "delay": 0.8}, "quick": {"mib": 10}, "new": {"mib": 15}})
    worker = procs.worker("worker", store, "30Mi", extra=["--admission-control", "off"])  # new always displaces
    router = procs.router([worker])
    assert predict(router.url, "slow").status_code == 200
    assert predict(router.url, "quick").status_code == 200

    report = WorkerStatus.model_validate(httpx.get(f"{worker.url}/status", timeout=5).json())
    model_map = ModelMap()
    model_map.apply_status(worker.url, report)
    plan = placement.place_cold("new", 15 * 2**20, placement.rooms_from_map(model_map))
    assert (plan.reason, plan.evicts) == ("evict", ("quick",))

    assert predict(router.url, "new").status_code == 200
    assert worker_models(worker.url) == {"slow": "READY", "new": "READY"}
