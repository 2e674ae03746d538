"""Requests that could wait are not refused: a static router in front of a worker still starting.

A real router with a ``--workers`` list and a real worker that answers but is not ready yet (its
pinned model takes seconds to load). Before, every request was 503 ``no ready worker pod can take
'a' now`` at once: a load test started right after the stack came up failed 600 of 600 requests in
about a second (issue 18). Now each waits, within its deadline, for the worker to become ready,
and its answer says how long in its Server-Timing (``pod-wait``), beside the worker's own entries.
"""
from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from gateway_helpers import BALLAST_LAUNCHER, ROOT, local_stack, wait_for, write_ballast_store
from hotset_common import wire

pytestmark = pytest.mark.slow
PIN_LOAD_S = 10.0
SAMPLES = ROOT / "build/models/model-store.json"
CHAT = {"model": "tiny-chat", "max_tokens": 4, "messages": [{"role": "user", "content": "say hello"}]}


def pod_wait_s(answer: httpx.Response) -> float | None:
    """The router's pod-wait entry of an answer's Server-Timing, in seconds; None when it has none."""
    return wire.server_timing_durations(answer.headers.get("server-timing", "")).get(wire.POD_WAIT_TIMING.name)


def timed(send) -> tuple[httpx.Response, float]:
    """An answer and the seconds the client waited for it."""
    started = time.monotonic()
    answer = send()
    return answer, time.monotonic() - started


def router_metric(url: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text)
               for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def behind_a_starting_worker(procs, folder, pin_load_s: float, budget: str = "64Mi", also: tuple[str, ...] = ()):
    """A router in front of one worker that answers but is not ready: its pinned model loads for
    `pin_load_s`; returns both once the router has read the worker's catalog. `also`: sample models
    (build/models) the worker serves beside its ballast models."""
    store = write_ballast_store(folder, {"a": {"mib": 1}, "pinned": {"mib": 1, "delay": pin_load_s}})
    if also:
        samples = [spec for spec in json.loads(SAMPLES.read_text())["models"] if spec["id"] in also]
        entries = json.loads(store.read_text())["models"]
        store.write_text(json.dumps({"models": entries + samples}))
    worker = local_stack.start_worker("starting", store, procs.log_dir, budget, launcher=BALLAST_LAUNCHER,
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

    def predict(_: int = 0) -> tuple[httpx.Response, float]:
        return timed(lambda: httpx.post(f"{router.url}/predict", json={"model_id": "a", "input_data": [1]}, timeout=90))

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        timings = list(pool.map(predict, range(20)))
    answers = [answer for answer, _ in timings]
    assert [a.status_code for a in answers] == [200] * 20, {a.status_code: a.text[:200] for a in answers}
    assert router_metric(router.url, "hotset_router_pod_waits_total", model="a", result="served") >= 1
    # Each answer says it waited, for about as long as its client did (the rest: a 1 MiB ballast
    # load and its forward), and keeps the worker's own entries beside the router's.
    for answer, waited in timings:
        held = pod_wait_s(answer)
        assert held is not None and 1.0 < held <= waited + 0.05 and waited - held < 3.0, (held, waited)
        assert {"queue", "load", "infer"} <= set(wire.server_timing_durations(answer.headers["server-timing"]))
    answer, _ = predict()  # the worker is ready now: nothing waits, nothing says it did
    assert answer.status_code == 200 and pod_wait_s(answer) is None, answer.headers.get("server-timing")
    assert "infer" in wire.server_timing_durations(answer.headers["server-timing"])


def test_every_route_that_waited_says_so_in_server_timing(procs, tmp_path) -> None:
    """Seed /predict, OIP v2 infer and the OpenAI chat route, whole and streamed, sent together while
    the only worker starts: each answer's Server-Timing names the same wait (a stream's in its
    headers, which go out after the wait), beside the worker's entries; once ready, none does."""
    if not SAMPLES.exists():
        pytest.fail(f"{SAMPLES} is missing: run `.venv/bin/hotset-samples --out build/models` (make install does)")
    worker, router = behind_a_starting_worker(procs, tmp_path, PIN_LOAD_S, budget="256Mi", also=("tiny-chat",))
    assert httpx.get(f"{worker.url}/v2/health/ready", timeout=5).status_code == 503, "the worker is ready already"
    infer = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}

    def streamed() -> httpx.Response:
        with httpx.stream("POST", f"{router.url}/v1/chat/completions", json={**CHAT, "stream": True},
                          timeout=180) as stream:
            stream.read()  # to [DONE]: the headers were sent before the first chunk
            return stream

    sends = {
        "predict": lambda: httpx.post(f"{router.url}/predict", json={"model_id": "a", "input_data": [1]}, timeout=90),
        "infer": lambda: httpx.post(f"{router.url}/v2/models/a/infer", json=infer, timeout=90),
        "chat": lambda: httpx.post(f"{router.url}/v1/chat/completions", json=CHAT, timeout=180),
        "stream": streamed,
    }
    with concurrent.futures.ThreadPoolExecutor(len(sends)) as pool:
        futures = {route: pool.submit(timed, send) for route, send in sends.items()}
        answers = {route: future.result() for route, future in futures.items()}
    for route, (answer, _) in answers.items():
        assert answer.status_code == 200, (route, answer.text[:300])
    assert b"data: [DONE]" in answers["stream"][0].content
    held = {route: pod_wait_s(answer) for route, (answer, _) in answers.items()}
    assert all(seconds is not None and seconds > 1.0 for seconds in held.values()), held
    assert max(held.values()) - min(held.values()) < 1.0, held  # one wait, for one worker's start
    for route, (answer, waited) in answers.items():
        assert held[route] <= waited + 0.05, (route, held[route], waited)
        assert "infer" in wire.server_timing_durations(answer.headers["server-timing"]), (route, answer.headers)
    again = {route: send() for route, send in sends.items()}
    assert {route: (a.status_code, pod_wait_s(a)) for route, a in again.items()} == {r: (200, None) for r in sends}


def test_a_model_no_pod_becomes_ready_for_is_503_at_its_deadline_naming_the_wait(procs, tmp_path) -> None:
    _, router = behind_a_starting_worker(procs, tmp_path, 60.0)
    answer = httpx.post(f"{router.url}/predict", json={"model_id": "a", "input_data": [1]},
                        headers={"X-Hotset-Timeout": "2"}, timeout=30)
    assert answer.status_code == 503 and "Retry-After" in answer.headers, answer.text
    assert "no pod of 'a' is ready yet" in answer.json()["error"] and "deadline" in answer.json()["error"]
    held = pod_wait_s(answer)
    assert held is not None and 1.5 < held <= 2.5, answer.headers  # the 503 says it waited its whole deadline
    unknown = httpx.post(f"{router.url}/predict", json={"model_id": "nobody", "input_data": [1]}, timeout=30)
    assert unknown.status_code == 404, unknown.text  # a model nobody lists is answered at once
