"""Slow, idle and vanished clients against a real router and a real worker (issue 22).

A trickled body, a head that never ends, an oversized head, too many open
connections and a client that hangs up mid-request each used to hold what
other clients need (request slots, connections) for as long as the client
liked. Each is now cut off with its own status and the next client is served.
"""
from __future__ import annotations

import socket
import time

import httpx
import pytest

from gateway_helpers import worker_metric, write_ballast_store
from hotset_common.metrics import INFLIGHT_REQUESTS
from hotset_testing.polling import wait_for

pytestmark = pytest.mark.slow

ROUTER_LIMITS = ["--max-requests", "3", "--client-head-timeout-s", "2", "--client-body-timeout-s", "1",
                 "--client-body-min-rate", "1000000", "--max-connections", "16", "--max-head-bytes", "16384"]
WORKER_LIMITS = ["--client-head-timeout-s", "2", "--max-head-bytes", "16384", "--inference-threads", "8"]
PREDICT = b'{"model_id": "a", "input_data": [1]}'


@pytest.fixture(scope="module")
def stack(module_procs, tmp_path_factory):
    store = write_ballast_store(tmp_path_factory.mktemp("store"), {
        "a": {"mib": 1}, "slow": {"mib": 1, "predict_delay": 6.0, "max": 2}})
    worker = module_procs.worker("w1", store, "64Mi", extra=WORKER_LIMITS)
    router = module_procs.router([worker], args=ROUTER_LIMITS)
    assert predict(router.url).status_code == 200
    return worker, router


def predict(url: str, model: str = "a") -> httpx.Response:
    return httpx.post(url + "/predict", json={"model_id": model, "input_data": [1]}, timeout=30)


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def answer_of(sock: socket.socket) -> tuple[int, bytes]:
    """The status and the raw bytes the server sent before it closed the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return (int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1") else 0), data


def head(length: int, path: str = "/predict") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def test_trickled_bodies_hold_no_slot_and_are_cut_off_at_their_deadline(stack) -> None:
    _, router = stack
    tricklers = [connect(router.url) for _ in range(6)]  # twice the router's request slots
    for sock in tricklers:
        sock.sendall(head(len(PREDICT)) + PREDICT[:5])
    started = time.monotonic()
    assert predict(router.url).status_code == 200  # a client that sends its body at once is served meanwhile
    answers = [answer_of(sock) for sock in tricklers]  # no more bytes: each is cut off at its deadline
    assert time.monotonic() - started < 5
    assert all(status == 408 and b"body did not arrive in time" in raw for status, raw in answers), answers
    assert predict(router.url).status_code == 200


def test_a_head_that_never_ends_is_cut_off_and_others_are_served_meanwhile(stack) -> None:
    worker, router = stack
    for url in (router.url, worker.url):
        idle, partial = connect(url), connect(url)
        partial.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        assert predict(url).status_code == 200
        for sock in (idle, partial):
            status, raw = answer_of(sock)
            assert status == 408 and b"head did not arrive" in raw, raw[:200]


def test_an_oversized_head_is_refused_with_431(stack) -> None:
    worker, router = stack
    for url in (router.url, worker.url):
        sock = connect(url)
        try:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * 40_000 + b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # it may close before the whole head is written
        status, raw = answer_of(sock)
        assert status == 431 and b"16384 bytes" in raw, raw[:200]
        assert httpx.get(url + "/v2/health/live", headers={"X-Small": "a" * 8000}, timeout=5).status_code == 200


def test_connections_past_the_cap_get_503_with_retry_after_and_room_returns(stack) -> None:
    _, router = stack
    held = [connect(router.url) for _ in range(16)]
    try:
        extra = connect(router.url)
        status, raw = answer_of(extra)
        assert status == 503 and b"retry-after: 1" in raw.lower() and b"connections" in raw
    finally:
        for sock in held:
            sock.close()
    assert wait_for(lambda: predict(router.url).status_code == 200 or None, "room for a connection", timeout=10)


def test_a_client_that_hangs_up_gives_its_router_slot_back_at_once(stack) -> None:
    worker, router = stack
    predict(router.url, "slow")  # loaded (a 6 s answer)
    leaving = [connect(router.url) for _ in range(3)]  # every router slot: each waits on a 6 s answer
    body = b'{"model_id": "slow", "input_data": [1]}'
    for sock in leaving:
        sock.sendall(head(len(body)) + body)
    wait_for(lambda: worker_metric(worker.url, INFLIGHT_REQUESTS, model="slow") == 3 or None,
             "three requests in flight at the worker", timeout=10)
    assert predict(router.url).status_code == 503  # every slot is taken
    for sock in leaving:
        sock.close()
    started = time.monotonic()
    wait_for(lambda: predict(router.url).status_code == 200 or None, "a free router slot", timeout=10)
    # The worker keeps its threads' requests in flight until they finish (dataplane._run: the model stays
    # held while a thread uses it); the router's slots came back without waiting for those answers.
    assert time.monotonic() - started < 3, "the slots came back only with the 6 s answers"
