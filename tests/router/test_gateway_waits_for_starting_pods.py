"""Requests that could wait are not refused: a static router in front of a worker still starting.

A real router with a ``--workers`` list and a real worker that answers but is not ready yet (its
pinned model takes seconds to load). Before, every request was 503 ``no ready worker pod can take
'a' now`` at once: a load test started right after the stack came up failed 600 of 600 requests in
about a second (issue 18). Now each waits, within its deadline, for the worker to become ready.
"""
from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from gateway_helpers import BALLAST_LAUNCHER, local_stack, wait_for, write_ballast_store

pytestmark = pytest.mark.slow
PIN_LOAD_S = 10.0


def router_metric(url: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text)
               for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def behind_a_starting_worker(procs, folder, pin_load_s: float):
    """A router in front of one worker that answers but is not ready: its pinned model loads for
    `pin_load_s`; returns both once the router has read the worker's catalog."""
    store = write_ballast_store(folder, {"a": {"mib": 1}, "pinned": {"mib": 1, "delay": pin_load_s}})
    worker = local_stack.start_worker("starting", store, procs.log_dir, "64Mi", launcher=BALLAST_LAUNCHER,
                                      extra_args=["--min-residency-s", "0", "--pinned", "pinned"])
    procs.started.append(worker)
    local_stack.wait_http(worker, "/v2/health/live", 60)
    router = procs.router([], urls=[worker.url], wait_ready=False)
    wait_for(lambda: httpx.get(f"{router.url}/models", timeout=5).json()["available_models"].get("a"),
             "the router to read the starting worker's catalog")
    return worker, router


def test_requests_wait_while_the_only_worker_starts_then_all_are_served(procs, tmp_path) -> None:
    worker, router = behind_a_starting_worker(procs, tmp_path, PIN_LOAD_S)
    assert httpx.get(f"{worker.url}/v2/health/ready", timeout=5).status_code == 503, "the worker is ready already"

    def predict(_: int) -> httpx.Response:
        return httpx.post(f"{router.url}/predict", json={"model_id": "a", "input_data": [1]}, timeout=90)

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(predict, range(20)))
    assert [a.status_code for a in answers] == [200] * 20, {a.status_code: a.text[:200] for a in answers}
    assert router_metric(router.url, "hotset_router_pod_waits_total", model="a", result="served") >= 1


def test_a_model_no_pod_becomes_ready_for_is_503_at_its_deadline_naming_the_wait(procs, tmp_path) -> None:
    _, router = behind_a_starting_worker(procs, tmp_path, 60.0)
    answer = httpx.post(f"{router.url}/predict", json={"model_id": "a", "input_data": [1]},
                        headers={"X-Hotset-Timeout": "2"}, timeout=30)
    assert answer.status_code == 503 and "Retry-After" in answer.headers, answer.text
    assert "no pod of 'a' is ready yet" in answer.json()["error"] and "deadline" in answer.json()["error"]
    unknown = httpx.post(f"{router.url}/predict", json={"model_id": "nobody", "input_data": [1]}, timeout=30)
    assert unknown.status_code == 404, unknown.text  # a model nobody lists is answered at once
