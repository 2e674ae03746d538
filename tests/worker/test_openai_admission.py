"""The OpenAI routes pass the worker's one admission path, and a client that leaves stops its work.

A real worker process serving the tiny-chat sample (a real causal LM) whose spec says
``maxConcurrency: 1``. The OpenAI routes used to hold their model through the manager alone:
no concurrency slot, no timeoutSeconds cap, no in-flight gauge; and a generation whose client had
gone kept running to its last token when its answer was a whole body (issue 18).
"""
from __future__ import annotations

import concurrent.futures
import json
import threading
import time

import httpx
import pytest

from hotset_testing.worker_server import wait_until, worker_process

pytestmark = pytest.mark.slow
MODEL = "tiny-chat"
LONG = {"model": MODEL, "prompt": "once upon a time", "max_tokens": 240, "min_tokens": 240, "temperature": 1.0}


@pytest.fixture(scope="module")
def worker(sample_store, tmp_path_factory):
    specs = json.loads(sample_store.read_text())["models"]
    chat = next(spec for spec in specs if spec["id"] == MODEL)
    store = tmp_path_factory.mktemp("store") / "model-store.json"
    store.write_text(json.dumps({"models": [{**chat, "maxConcurrency": 1}]}))
    args = ["--model-store", str(store), "--max-model-queue", "1"]
    with worker_process(args, env={"HOTSET_MEMORY_BUDGET": "1Gi", "HF_HUB_OFFLINE": "1"}) as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            assert client.post("/v1/completions", json={**LONG, "max_tokens": 2, "min_tokens": 0}).status_code == 200
            yield client


def metric(client: httpx.Client, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(client.get("/metrics").text)
               for sample in family.samples if sample.name == name and sample.labels.get("model") == MODEL)


def test_openai_requests_take_the_models_slot_and_count_in_flight(worker) -> None:
    """Three generations at once for a model with one slot and a queue of one: one is served, one
    waits for the slot and is served after it, one is refused with 429 in OpenAI's shape; the
    in-flight gauge counts them and never passes the limit."""
    seen: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(metric(worker, "hotset_inflight_requests"))

    def generate(_: int) -> httpx.Response:
        with httpx.Client(base_url=str(worker.base_url), timeout=120) as client:
            return client.post("/v1/completions", json=LONG)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(generate, range(3)))
    finally:
        done.set()
        watcher.join()
    assert sorted(a.status_code for a in answers) == [200, 200, 429], [a.text[:200] for a in answers]
    refused = next(a for a in answers if a.status_code == 429)
    assert "limit of 1 concurrent" in refused.json()["error"]["message"] and refused.headers["Retry-After"] == "1"
    assert max(seen) == 1, f"in flight: {sorted(set(seen))}"
    wait_until(lambda: metric(worker, "hotset_inflight_requests") == 0, what="nothing in flight")


def test_a_client_that_leaves_before_its_whole_answer_stops_the_generation(worker) -> None:
    started = time.perf_counter()
    full = worker.post("/v1/completions", json=LONG)
    assert full.status_code == 200 and full.json()["usage"]["completion_tokens"] == 240, full.text
    whole_s = time.perf_counter() - started
    before = metric(worker, "hotset_output_tokens_total")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up a quarter of the way in
        worker.post("/v1/completions", json=LONG, timeout=httpx.Timeout(120, read=whole_s / 4))
    wait_until(lambda: metric(worker, "hotset_inflight_requests") == 0, what="the abandoned request to end")
    wait_until(lambda: metric(worker, "hotset_output_tokens_total") > before, what="its tokens to be counted")
    generated = metric(worker, "hotset_output_tokens_total") - before
    assert generated < 180, f"{generated:.0f} of 240 tokens generated for a client that left a quarter of the way in"
    assert worker.post("/v1/completions", json={**LONG, "max_tokens": 2, "min_tokens": 0}).status_code == 200
