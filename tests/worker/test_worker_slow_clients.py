"""Slow, idle and vanished clients against a real worker process, HTTP and gRPC (issue 22).

tests/router/test_slow_clients.py holds the router end to end; this holds the
worker on its own ports, which the router's pods call and a client inside the
cluster could call too: a trickled body is cut off at its deadline while
others are served; connections past the cap are refused while clients on
their connections are still served; a client that hangs up gives back its
place in the admission queue and its turn at the inference thread at once
(not when its answer would have been ready); and on the gRPC port, calls past
the cap are RESOURCE_EXHAUSTED, held calls are cut off by the connection's
age, and oversized metadata is refused.
"""
from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as pb

from hotset_common import grpc_wire
from hotset_common.metrics import INFLIGHT_REQUESTS
from hotset_testing import scrape
from hotset_testing.polling import wait_for
from hotset_testing.processes import Process, free_port, spawn, wait_http

pytestmark = pytest.mark.slow

LAUNCHER = Path(__file__).resolve().parents[1] / "router" / "ballast_worker_main.py"
MiB = 2**20
MAX_CONNECTIONS = 8  # HTTP connections; and gRPC calls in progress
MAX_HEAD_BYTES = 4096  # below gRPC's own default metadata limits (8 KiB soft, 16 KiB hard)
AGE_S = 2.0  # a gRPC connection's age; its calls get as long again
LIMITS = ["--client-head-timeout-s", "5", "--client-body-timeout-s", "1", "--client-body-min-rate", "1000000",
          "--max-connections", str(MAX_CONNECTIONS), "--max-head-bytes", str(MAX_HEAD_BYTES),
          "--grpc-connection-age-s", str(AGE_S)]
# Models: "a" answers at once; "slow" holds the one inference thread 3 s; "hog" fills most of the
# budget and holds it 4 s per request; "b" and "c" each need hog's room.
MODELS = {"a": (1, 0.0), "slow": (1, 3.0), "hog": (6, 4.0), "b": (4, 0.0), "c": (4, 0.0)}


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Process, str]]:
    """A real worker process (ballast models) with small client bounds, one inference thread and
    two admission-queue places; (the process, its gRPC address)."""
    root = tmp_path_factory.mktemp("slow-clients")
    entries = []
    for model, (mib, delay) in MODELS.items():
        folder = root / model
        folder.mkdir()
        (folder / "ballast.json").write_text(json.dumps({"bytes": mib * MiB, "predict_delay_s": delay}))
        entries.append({"id": model, "framework": "torchvision", "task": "tensor", "source": f"file://{folder}",
                        "memory": mib * MiB})
    store = root / "store.json"
    store.write_text(json.dumps({"models": entries}))
    port = free_port()
    argv = [sys.executable, str(LAUNCHER), "--model-store", str(store), "--port", str(port), "--memory-budget", "8Mi",
            "--triton-url", "", "--min-residency-s", "0", "--budget-mode", "hard", "--inference-threads", "1",
            "--max-queue", "2", "--grpc-port", "0", *LIMITS]
    with spawn("worker", argv, root / "worker.log", url=f"http://127.0.0.1:{port}") as process:
        wait_http(process, "/v2/health/ready", 90)
        grpc_port = httpx.get(process.url + "/status", timeout=10).json()["grpc_port"]
        yield process, f"127.0.0.1:{grpc_port}"


def predict(url: str, model: str = "a", timeout: float = 30) -> httpx.Response:
    return httpx.post(url + "/predict", json={"model_id": model, "input_data": [1]}, timeout=timeout)


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=15)


def send_predict(url: str, model: str) -> socket.socket:
    """A connection that sent a whole /predict request and has not read its answer."""
    body = json.dumps({"model_id": model, "input_data": [1]}).encode()
    sock = connect(url)
    sock.sendall(head(len(body)) + body)
    return sock


def head(length: int) -> bytes:
    return (f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def answer_of(sock: socket.socket) -> tuple[int, bytes]:
    """The status and the raw bytes the server sent before it closed the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return (int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1") else 0), data


def gauge(url: str, name: str, model: str) -> float:
    return scrape.metric(url, name, model=model)


def test_a_trickled_body_is_cut_off_at_its_deadline_and_others_are_served(worker) -> None:
    process, _ = worker
    body = b'{"model_id": "a", "input_data": [1]}'
    tricklers = [connect(process.url) for _ in range(3)]
    for sock in tricklers:
        sock.sendall(head(len(body)) + body[:5])  # and nothing more
    started = time.monotonic()
    assert predict(process.url).status_code == 200  # a client that sends its body at once is served meanwhile
    answers = [answer_of(sock) for sock in tricklers]
    assert time.monotonic() - started < 4  # the 1 s deadline, not the head timeout's 5 s nor the client's 15 s
    assert all(status == 408 and b"body did not arrive in time" in raw for status, raw in answers), answers
    assert predict(process.url).status_code == 200


def test_connections_past_the_cap_are_refused_while_clients_on_theirs_are_served(worker) -> None:
    process, _ = worker
    with httpx.Client(base_url=process.url, timeout=10) as kept:
        assert kept.post("/predict", json={"model_id": "a", "input_data": [1]}).status_code == 200  # its connection stays
        held = [connect(process.url) for _ in range(MAX_CONNECTIONS - 1)]
        try:
            status, raw = answer_of(connect(process.url))  # one past the cap
            assert status == 503 and b"retry-after: 1" in raw.lower() and b"connections" in raw, raw[:300]
            answered = kept.post("/predict", json={"model_id": "a", "input_data": [2]})
            assert answered.status_code == 200 and answered.json()["predictions"]["scaled"] == [4], answered.text
        finally:
            for sock in held:
                sock.close()
    wait_for(lambda: predict(process.url).status_code == 200 or None, "room for a new connection", timeout=10)


def test_clients_that_hang_up_give_back_their_turn_at_the_inference_thread(worker) -> None:
    """One inference thread: a 3 s request runs; three more wait for the thread, then hang up. The
    next client is answered when the running one ends, not after the three that left."""
    process, _ = worker
    assert predict(process.url, "slow").status_code == 200  # loaded
    running = send_predict(process.url, "slow")
    wait_for(lambda: gauge(process.url, INFLIGHT_REQUESTS, "slow") == 1 or None, "the running request", timeout=10)
    leaving = [send_predict(process.url, "slow") for _ in range(3)]
    wait_for(lambda: gauge(process.url, INFLIGHT_REQUESTS, "slow") == 4 or None, "three requests waiting", timeout=10)
    for sock in leaving:
        sock.close()
    wait_for(lambda: gauge(process.url, INFLIGHT_REQUESTS, "slow") == 1 or None, "the three let go", timeout=2)
    started = time.monotonic()
    assert predict(process.url, "a").status_code == 200
    assert time.monotonic() - started < 3.5, "it waited for the requests of clients that had left"
    status, raw = answer_of(running)
    assert status == 200, raw[:300]


def test_clients_that_hang_up_give_back_their_admission_queue_places(worker) -> None:
    """hog is in use and b's load waits for hog's room, so c's requests wait in the admission queue
    (two places). When the two waiting clients hang up, their places come back at once: the next
    client queues and is served, where before it was refused."""
    process, _ = worker
    assert httpx.post(process.url + "/v2/repository/models/hog/load", timeout=30).status_code == 200
    using = send_predict(process.url, "hog")  # 4 s on hog
    wait_for(lambda: gauge(process.url, INFLIGHT_REQUESTS, "hog") == 1 or None, "hog in use", timeout=10)
    loading = send_predict(process.url, "b")  # b's load is promised hog's room once hog's request ends
    wait_for(lambda: state_of(process.url, "b") == "LOADING" or None, "b's load waiting for hog", timeout=10)
    waiting = [send_predict(process.url, "c") for _ in range(2)]
    wait_for(lambda: queued(process.url) == 2 or None, "c's two requests queued", timeout=10)
    refused = predict(process.url, "c")
    assert refused.status_code == 503 and refused.headers.get("retry-after"), refused.text
    assert "admission queue is full" in refused.text
    for sock in waiting:
        sock.close()
    wait_for(lambda: queued(process.url) == 0 or None, "the places given back", timeout=2)
    served = predict(process.url, "c")  # queues now; loads once hog's request and b's ended
    assert served.status_code == 200, served.text
    for sock in (using, loading):
        status, raw = answer_of(sock)
        assert status == 200, raw[:300]


def queued(url: str) -> int:
    """Requests in the worker's admission queue, from its own report."""
    return httpx.get(url + "/status", timeout=5).json()["queued_requests"]


def state_of(url: str, model: str) -> str:
    return next((m["state"] for m in httpx.get(url + "/status", timeout=5).json()["models"] if m["id"] == model), "")


# ----- the gRPC port ---------------------------------------------------------------------------

LIVE = f"/{grpc_wire.SERVICE}/ServerLive"
INFER = f"/{grpc_wire.SERVICE}/ModelInfer"


async def _never() -> asyncio.AsyncIterator[bytes]:
    """A request message that never comes: the call is held open, as a trickled body holds a connection."""
    await asyncio.Event().wait()
    yield b""  # pragma: no cover


def test_grpc_calls_past_the_cap_are_resource_exhausted_and_held_calls_are_cut_off(worker) -> None:
    process, address = worker

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(address) as flood, grpc.aio.insecure_channel(address) as other:
            live = other.unary_unary(LIVE, request_serializer=pb.ServerLiveRequest.SerializeToString,
                                     response_deserializer=pb.ServerLiveResponse.FromString)
            assert (await live(pb.ServerLiveRequest(), timeout=10)).live
            hold = flood.stream_unary(INFER)  # ModelInfer's path, its message never sent
            started = time.monotonic()
            held = [hold(_never()) for _ in range(MAX_CONNECTIONS)]
            await asyncio.sleep(0.5)  # they reach the server (nothing to poll: they have no answer yet)
            with pytest.raises(grpc.aio.AioRpcError) as past:
                await live(pb.ServerLiveRequest(), timeout=10)
            assert past.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, past.value
            # the HTTP port still serves meanwhile
            assert (await asyncio.to_thread(predict, process.url)).status_code == 200
            # the held calls are cut off by their connection's age (GOAWAY, then as long again)
            ended = await asyncio.gather(*held, return_exceptions=True)
            assert time.monotonic() - started < 2 * AGE_S + 3
            assert all(isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.UNAVAILABLE
                       for e in ended), ended
            assert (await live(pb.ServerLiveRequest(), timeout=10)).live  # room again

    asyncio.run(scenario())


def test_grpc_calls_whose_client_leaves_free_their_place_at_once(worker) -> None:
    _, address = worker

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(address) as other:
            live = other.unary_unary(LIVE, request_serializer=pb.ServerLiveRequest.SerializeToString,
                                     response_deserializer=pb.ServerLiveResponse.FromString)
            flood = grpc.aio.insecure_channel(address)
            held = [flood.stream_unary(INFER)(_never()) for _ in range(MAX_CONNECTIONS)]
            await asyncio.sleep(0.5)
            with pytest.raises(grpc.aio.AioRpcError) as past:
                await live(pb.ServerLiveRequest(), timeout=10)
            assert past.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            await flood.close()  # the flood hangs up
            started = time.monotonic()
            while True:  # its calls' places come back at once, not at the connection's age
                try:
                    assert (await live(pb.ServerLiveRequest(), timeout=10)).live
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    assert time.monotonic() - started < 1, "the places came back only with the connection's age"
                    await asyncio.sleep(0.05)
            await asyncio.gather(*held, return_exceptions=True)

    asyncio.run(scenario())


def test_grpc_metadata_past_the_head_limit_is_refused(worker) -> None:
    _, address = worker

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            live = channel.unary_unary(LIVE, request_serializer=pb.ServerLiveRequest.SerializeToString,
                                       response_deserializer=pb.ServerLiveResponse.FromString)
            with pytest.raises(grpc.aio.AioRpcError) as big:
                await live(pb.ServerLiveRequest(), metadata=(("x-filler", "a" * (MAX_HEAD_BYTES + 1000)),), timeout=10)
            assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "metadata" in big.value.details()
            small = await live(pb.ServerLiveRequest(), metadata=(("x-filler", "a" * (MAX_HEAD_BYTES // 2)),), timeout=10)
            assert small.live

    asyncio.run(scenario())
