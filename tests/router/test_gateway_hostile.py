"""Hostile and unusual requests through a real router to real workers (issue 11's router findings).

Floods of large bodies are refused with 503 + Retry-After before they are read (on every
inference route: the OpenAI routes share the budget), a ``/predict`` body's model id and an OpenAI
body's model and prefix are read without building the rest, requests waiting for a cold model are
bounded, ``%3F`` stays inside its path segment, gzip bodies keep their Content-Encoding, model
metadata never loads a model, and the status loop outlives a pod that does not speak HTTP or
that is briefly too busy to answer. Issue 18's: no body shape gets a 500 (a body nested 20,000
levels deep did), and error answers quote a short excerpt of what was wrong (an unknown 1 MiB
model name came back whole; 50,000 bad tensors as a 10 MB message).
"""
from __future__ import annotations

import concurrent.futures
import gzip
import json
import os
import signal
import socket
import threading
from typing import Callable, TypeVar

import httpx
import psutil
import pytest

from gateway_helpers import wait_for, worker_models, write_ballast_store

pytestmark = pytest.mark.slow
T = TypeVar("T")


def post(url: str, path: str, **kwargs) -> httpx.Response:
    return httpx.post(url + path, timeout=60, **kwargs)


@pytest.fixture(scope="module")
def stack(module_procs, tmp_path_factory):
    store = write_ballast_store(tmp_path_factory.mktemp("store"), {
        "a": {"mib": 1}, "slow": {"mib": 1, "predict_delay": 1.5}, "cold": {"mib": 1, "delay": 2.0},
    })
    worker = module_procs.worker("w1", store, "64Mi")
    router = module_procs.router([worker], args=["--max-body-bytes-in-flight", "24Mi", "--max-cold-waiters", "2"])
    assert post(router.url, "/predict", json={"model_id": "a", "input_data": [1]}).status_code == 200
    return worker, router


def test_a_percent_encoded_question_mark_stays_in_its_segment(stack) -> None:
    _, router = stack
    answer = post(router.url, "/v2/models/a/versions/1%3Fx=/infer",
                  json={"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
    assert answer.status_code == 404, answer.text
    assert "version '1?x='" in answer.json()["error"]
    assert httpx.get(router.url + "/v2/models/a/versions/1%3F", timeout=10).status_code == 404


def test_gzip_bodies_pass_with_their_content_encoding(stack) -> None:
    _, router = stack
    infer = gzip.compress(json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}],
                                      "outputs": [{"name": "OUTPUT0"}]}).encode())
    answer = post(router.url, "/v2/models/a/infer", content=infer, headers={"content-encoding": "gzip", "content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [2.0, 4.0]
    predict = gzip.compress(json.dumps({"model_id": "a", "input_data": [3.0]}).encode())
    answer = post(router.url, "/predict", content=predict, headers={"content-encoding": "gzip", "content-type": "application/json"})
    assert answer.status_code == 200 and answer.json()["predictions"]["scaled"] == [6.0], answer.text


def test_metadata_of_a_cold_model_loads_nothing(stack) -> None:
    worker, router = stack
    answer = httpx.get(router.url + "/v2/models/cold", timeout=10)
    assert answer.status_code == 200 and answer.json()["name"] == "cold", answer.text
    assert "cold" not in worker_models(worker.url)


def test_a_predict_body_is_routed_without_building_its_input(stack) -> None:
    """The model id after 10 MB of numbers: the router's memory does not grow by the parsed list's
    ~100 MB per body (two such bodies exhausted a 1 GiB router)."""
    _, router = stack
    body = b'{"input_data": [' + b",".join([b"1.25"] * 2_000_000) + b'], "model_id": "a"}'
    grew, answers = growth_while(router.pid, lambda: [post(router.url, "/predict", content=body,
                                                           headers={"content-type": "application/json"}) for _ in range(2)])
    assert [a.status_code for a in answers] == [200, 200], answers[0].text[:300]
    assert grew < 60 * 2**20, f"router grew {grew / 2**20:.0f} MiB"


def growth_while(pid: int, send: Callable[[], T]) -> tuple[int, T]:
    """How far the process's resident memory rose above where it was while `send()` ran, and what it returned."""
    process = psutil.Process(pid)
    before = process.memory_info().rss
    peak = [before]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            done.wait(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = send()
    finally:
        done.set()
        watcher.join()
    return peak[0] - before, result


def test_an_openai_body_is_routed_without_building_it(stack) -> None:
    """A 4 MiB body of ``[],`` (json.loads held 90 MiB of it) and a conversation of 1.4 million empty
    messages: the router reads model, stream and prefix in one pass that builds neither."""
    worker, router = stack
    not_an_object = b"[" + b"[]," * 1_400_000 + b"[]]"
    many_messages = b'{"model": "a", "messages": [' + b"{}," * 1_400_000 + b'{}], "stream": true}'
    headers = {"content-type": "application/json"}
    grew, (shape, many) = growth_while(router.pid, lambda: [
        post(router.url, "/v1/chat/completions", content=body, headers=headers) for body in (not_an_object, many_messages)])
    assert grew < 40 * 2**20, f"router grew {grew / 2**20:.0f} MiB"
    assert shape.status_code == 400 and "must be a JSON object" in shape.json()["error"]["message"], shape.text[:300]
    assert many.status_code in (400, 404), many.text[:300]  # the worker's answer: `a` generates nothing
    assert post(router.url, "/predict", json={"model_id": "a", "input_data": [1]}).status_code == 200


def hold_a_body(url: str, declared: int) -> socket.socket:
    """A /predict request that declares `declared` bytes and sends only its first few: the router
    holds its reservation until the connection closes."""
    host, port = url.removeprefix("http://").split(":")
    held = socket.create_connection((host, int(port)))
    held.sendall(f"POST /predict HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                 f"content-length: {declared}\r\n\r\n{{\"model_id\": \"a\", ".encode())
    return held


def test_openai_bodies_count_against_the_same_in_flight_budget(stack) -> None:
    """The OpenAI routes had no flood bounds: any number of 64 MiB bodies could be held at once.
    A seed-API body holding 20 of the router's 24 MiB leaves no room for a 7 MiB chat body."""
    _, router = stack
    chat = json.dumps({"model": "a", "messages": [{"role": "user", "content": "x" * 7 * 2**20}]}).encode()

    def chat_answer() -> httpx.Response:
        return post(router.url, "/v1/chat/completions", content=chat, headers={"content-type": "application/json"})

    held = hold_a_body(router.url, 20 * 2**20)
    try:
        (refused,) = wait_for(lambda: (a := chat_answer()).status_code == 503 and (a,), "the chat body to be refused")
        assert "request bodies" in refused.json()["error"]["message"] and refused.headers["Retry-After"] == "1"
    finally:
        held.close()
    # The held body's bytes come back with its connection: the chat body reaches the worker again.
    wait_for(lambda: chat_answer().status_code != 503, "the budget to come back")
    assert post(router.url, "/predict", json={"model_id": "a", "input_data": [1]}).status_code == 200


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


DEEP_BODIES = {  # path -> body template; {} is where the nesting goes
    "/predict": '{{"model_id": "a", "input_data": {}}}',
    "/v2/models/a/infer": '{{"inputs": [{{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": {}}}]}}',
    "/v1/chat/completions": '{{"model": "a", "messages": [{{"role": "user", "content": {}}}]}}',
    "/v1/embeddings": '{{"model": "a", "input": {}}}',
}


@pytest.mark.parametrize("depth", [20_000, 900])
@pytest.mark.parametrize("path", sorted(DEEP_BODIES))
def test_a_deeply_nested_body_is_a_4xx_from_router_and_worker(stack, path, depth) -> None:
    worker, router = stack
    body = DEEP_BODIES[path].format(nested(depth))
    for url in (router.url, worker.url):
        answer = post(url, path, content=body, headers={"content-type": "application/json"})
        assert 400 <= answer.status_code < 500, (url, path, answer.status_code, answer.text[:300])
        assert len(answer.content) < 1024, len(answer.content)
        if depth > 1000:  # past every parser: the same answer everywhere
            assert answer.status_code == 400 and "nested too deeply" in answer.text, (url, answer.text[:300])
    assert post(router.url, "/predict", json={"model_id": "a", "input_data": [1]}).status_code == 200


def test_an_unknown_megabyte_model_name_comes_back_as_a_short_excerpt(stack) -> None:
    worker, router = stack
    name = "m" * 2**20
    for url in (router.url, worker.url):
        for path, body in [("/predict", {"model_id": name, "input_data": [1]}),
                           ("/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "hi"}]}),
                           ("/v2/models/" + name[:60_000] + "/infer", {"inputs": []})]:
            answer = post(url, path, json=body)
            assert answer.status_code == 404, (url, path[:40], answer.status_code, answer.text[:200])
            assert len(answer.content) < 1024 and "more characters" in answer.text, (url, path[:40], len(answer.content))


def test_fifty_thousand_bad_tensors_are_a_short_message_that_counts_them(stack) -> None:
    worker, router = stack
    body = {"inputs": [{"name": f"t{i}", "datatype": "FP32", "shape": "x"} for i in range(50_000)]}
    for url in (router.url, worker.url):
        answer = post(url, "/v2/models/a/infer", json=body)
        assert answer.status_code == 422, answer.text[:300]
        error = answer.json()["error"]
        assert "inputs.0.shape" in error and "and 49995 more" in error and len(answer.content) < 2048, error[:300]
    one = {"inputs": [{"name": "n" * 10**6, "datatype": "NOPE", "shape": [1], "data": [1]}]}
    answer = post(router.url, "/v2/models/a/infer", json=one)
    assert answer.status_code == 400 and "more characters" in answer.text and len(answer.content) < 1024


def test_bodies_past_the_in_flight_budget_are_503_with_retry_after(stack) -> None:
    _, router = stack
    # slow is loaded first: requests for a model with no ready copy count against --max-cold-waiters (2)
    # until the first one is answered, and this test is about the body budget alone.
    assert post(router.url, "/predict", json={"model_id": "slow", "input_data": [1]}).status_code == 200
    body = json.dumps({"model_id": "slow", "input_data": [1.0] * 1_400_000}).encode()  # ~7 MiB
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: post(router.url, "/predict", content=body), range(6)))
    codes = sorted(a.status_code for a in answers)
    assert 200 in codes and 503 in codes and set(codes) <= {200, 503}, codes
    refused = next(a for a in answers if a.status_code == 503)
    assert "request bodies" in refused.json()["error"] and refused.headers["Retry-After"] == "1"
    assert post(router.url, "/predict", json={"model_id": "a", "input_data": [1]}).status_code == 200


def test_bodies_without_a_length_count_as_they_arrive(stack) -> None:
    """A chunked upload (no Content-Length) is counted by what it sends: alone it passes, beside
    bodies that fill the budget it is refused."""
    _, router = stack
    payload = json.dumps({"model_id": "slow", "input_data": [1.0] * 1_400_000}).encode()

    def chunked() -> httpx.Response:
        return post(router.url, "/predict", content=(payload[i:i + 2**20] for i in range(0, len(payload), 2**20)))

    assert chunked().status_code == 200
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        held = [pool.submit(post, router.url, "/predict", content=payload) for _ in range(3)]
        answers = [chunked() for _ in range(2)]
        assert all(f.result().status_code in (200, 503) for f in held)
    assert any(a.status_code == 503 for a in answers) or any(f.result().status_code == 503 for f in held)


def test_requests_waiting_for_a_cold_model_are_bounded(stack) -> None:
    _, router = stack
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(lambda _: post(router.url, "/predict", json={"model_id": "cold", "input_data": [1]}), range(5)))
    codes = sorted(a.status_code for a in answers)
    assert codes.count(200) >= 2 and 503 in codes, codes
    refused = next(a for a in answers if a.status_code == 503)
    assert "already wait" in refused.json()["error"] and "Retry-After" in refused.headers


def test_the_status_loop_outlives_a_pod_that_does_not_speak_http(module_procs, tmp_path) -> None:
    store = write_ballast_store(tmp_path, {"m": {"mib": 1}})
    worker = module_procs.worker("w-real", store, "64Mi")
    garbage = socket.socket()
    garbage.bind(("127.0.0.1", 0))
    garbage.listen(64)
    stop = threading.Event()

    def answer_garbage() -> None:
        garbage.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = garbage.accept()
            except OSError:
                continue
            with connection:
                connection.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\x00\x01garbage\r\n\r\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{garbage.getsockname()[1]}"
        router = module_procs.router([], urls=[worker.url, url])
        # A load behind the router's back: only a live status loop can bring it into the map.
        assert httpx.post(worker.url + "/v2/repository/models/m/load", timeout=30).status_code == 200
        wait_for(lambda: "m" in httpx.get(router.url + "/models", timeout=5).json()["loaded_models"],
                 "the status loop to report m", 10)
    finally:
        stop.set()
        thread.join()
        garbage.close()


def test_a_pod_briefly_too_busy_to_report_keeps_its_place(module_procs, tmp_path) -> None:
    store = write_ballast_store(tmp_path, {"m": {"mib": 1}})
    worker = module_procs.worker("w-busy", store, "64Mi")
    router = module_procs.router([worker])
    pods = lambda: [p["url"] for p in httpx.get(router.url + "/router/pods", timeout=5).json()]  # noqa: E731
    assert pods() == [worker.url]
    os.kill(worker.pid, signal.SIGSTOP)  # its status calls time out (2 s), as under a huge body
    try:
        seen = []
        deadline = __import__("time").monotonic() + 3.0
        while __import__("time").monotonic() < deadline:
            seen.append(pods())
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    assert all(urls == [worker.url] for urls in seen), seen[-1]
    assert post(router.url, "/predict", json={"model_id": "m", "input_data": [1]}).status_code == 200
