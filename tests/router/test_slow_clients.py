"""Slow, idle and vanished clients against a real router and a real worker (issue 22).

A trickled body, a head that never ends, an oversized head, too many open
connections and a client that hangs up mid-request each used to hold what
other clients need (request slots, connections) for as long as the client
liked. Each is now cut off with its own status and the next client is served.
The gRPC port has the same bounds: calls past the cap, held calls, oversized
metadata. (tests/worker/test_worker_slow_clients.py holds the worker's own ports.)
"""
from __future__ import annotations

import asyncio
import socket
import time

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as pb

from gateway_helpers import worker_metric, write_ballast_store
from hotset_common import grpc_wire
from hotset_common.metrics import INFLIGHT_REQUESTS
from hotset_testing.polling import wait_for
from hotset_testing.processes import free_port

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


# ----- the gRPC port: the same bounds, as gRPC spells them (slow_clients.grpc_server_options) -----

GRPC_CAP = 4  # --max-connections: calls in progress on the gRPC port
GRPC_HEAD_BYTES = 4096  # --max-head-bytes: below gRPC's own metadata defaults (8 KiB soft, 16 KiB hard)
GRPC_AGE_S = 2.0


@pytest.fixture(scope="module")
def grpc_router(stack, module_procs):
    """A second router on the stack's worker, serving gRPC with small bounds; (router, gRPC address)."""
    worker, _ = stack
    port = free_port()
    router = module_procs.router([worker], args=[
        "--grpc-port", str(port), "--max-connections", str(GRPC_CAP), "--max-head-bytes", str(GRPC_HEAD_BYTES),
        "--grpc-connection-age-s", str(GRPC_AGE_S)])
    return router, f"127.0.0.1:{port}"


async def _never():
    """A request message that never comes: the call is held open, as a trickled body holds a connection."""
    await asyncio.Event().wait()
    yield b""  # pragma: no cover


def _live(channel: grpc.aio.Channel):
    return channel.unary_unary(f"/{grpc_wire.SERVICE}/ServerLive", request_serializer=pb.ServerLiveRequest.SerializeToString,
                               response_deserializer=pb.ServerLiveResponse.FromString)


def test_grpc_calls_past_the_cap_are_resource_exhausted_while_http_is_served(grpc_router) -> None:
    router, address = grpc_router

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(address) as other:
            live = _live(other)
            assert (await live(pb.ServerLiveRequest(), timeout=10)).live
            flood = grpc.aio.insecure_channel(address)
            held = [flood.stream_unary(f"/{grpc_wire.SERVICE}/ModelInfer")(_never()) for _ in range(GRPC_CAP)]
            await asyncio.sleep(0.5)  # they reach the router (nothing to poll: they have no answer yet)
            with pytest.raises(grpc.aio.AioRpcError) as past:
                await live(pb.ServerLiveRequest(), timeout=10)
            assert past.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, past.value
            assert (await asyncio.to_thread(predict, router.url)).status_code == 200  # HTTP meanwhile
            await flood.close()  # the flood hangs up: its places come back at once
            await asyncio.gather(*held, return_exceptions=True)
            assert (await live(pb.ServerLiveRequest(), timeout=10)).live

    asyncio.run(scenario())


def test_held_grpc_calls_are_cut_off_by_their_connection_age(grpc_router) -> None:
    _, address = grpc_router

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(address) as flood:
            started = time.monotonic()
            held = [flood.stream_unary(f"/{grpc_wire.SERVICE}/ModelInfer")(_never()) for _ in range(GRPC_CAP)]
            ended = await asyncio.gather(*held, return_exceptions=True)
            assert time.monotonic() - started < 2 * GRPC_AGE_S + 3
            assert all(isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.UNAVAILABLE
                       for e in ended), ended

    asyncio.run(scenario())


def test_grpc_metadata_past_the_head_limit_is_refused(grpc_router) -> None:
    _, address = grpc_router

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as big:
                await _live(channel)(pb.ServerLiveRequest(), timeout=10,
                                     metadata=(("x-filler", "a" * (GRPC_HEAD_BYTES + 1000)),))
            assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "metadata" in big.value.details()
            assert (await _live(channel)(pb.ServerLiveRequest(), timeout=10,
                                         metadata=(("x-filler", "a" * (GRPC_HEAD_BYTES // 2)),))).live

    asyncio.run(scenario())
