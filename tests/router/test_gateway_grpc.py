"""OIP v2 over gRPC through the router: the stock tritonclient.grpc client and a client generated from
the standard proto, with the HTTP path's routing (a cold model loads on its first request), limits
(the flood guard) and errors (the worker's message, as a gRPC code)."""
from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from gateway_helpers import ROOT, copies, wait_for, write_ballast_store
from hotset_testing import ballast_framework as ballast
from hotset_testing.grpc_clients import fp32_input, grpc_client, refusal
from hotset_testing.processes import free_port

TOKEN = "pod-secret"


@pytest.fixture(scope="module")
def stack(module_procs, tmp_path_factory):
    """Two workers that need a token (the router holds it), a router serving gRPC; (router, workers, address)."""
    store = write_ballast_store(tmp_path_factory.mktemp("models"), {
        "scaler": {"mib": 4}, "other": {"mib": 4}, "slow": {"mib": 4, "predict_delay": 2.0}})
    workers = module_procs.workers(store, ["100Mi", "100Mi"], extra=["--grpc-port", "0", "--api-token", TOKEN])
    port = free_port()
    router = module_procs.router(workers, args=["--grpc-port", str(port), "--worker-token", TOKEN, "--max-requests", "1"])
    return router, workers, f"127.0.0.1:{port}"


@pytest.fixture
def client(stack):
    with grpc_client(stack[2]) as client:
        yield client




def test_tritonclient_grpc_infers_through_the_router_and_a_cold_model_loads(stack, client) -> None:
    router = stack[0]
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata().name == "hotset-router"
    assert not client.is_model_ready("scaler")  # cold
    metadata = client.get_model_metadata("scaler")  # a worker describes it from its files: nothing loads
    assert [(i.name, i.datatype) for i in metadata.inputs] == [("INPUT0", "FP32")]
    assert copies(router.url, "scaler") == []
    values = np.array([[1.0, -2.5, 4.0]], dtype=np.float32)
    result = client.infer("scaler", [fp32_input(values)], request_id="first")
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), values * 2)
    assert result.get_response().id == "first" and result.get_response().model_name == "scaler"
    assert len(copies(router.url, "scaler")) == 1 and client.is_model_ready("scaler")


def test_a_client_generated_from_the_standard_proto_works_through_the_router(stack, tmp_path) -> None:
    script = ROOT / "tests/oip/generated_client.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), stack[2]], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["live"] and report["ready"] and report["server"] == "hotset-router"
    assert report["inputs"] == [["INPUT0", "FP32", [-1]]]
    typed, raw = report["answers"]
    assert typed == {"id": "typed", "model": "scaler", "outputs": ["OUTPUT0", "MODEL"], "OUTPUT0": [2.0, 4.0, 6.0]}
    assert raw == {"id": "raw", "model": "scaler", "outputs": ["OUTPUT0"], "OUTPUT0": [1.0, -8.0]}
    assert report["model_ready"]
    assert report["unknown"] == ["NOT_FOUND", "model 'no-such-model' is not served by any worker"]


def test_errors_are_the_http_messages_as_grpc_codes(client) -> None:
    error = refusal(lambda: client.infer("no-such-model", [fp32_input(np.ones(1, dtype=np.float32))]))
    assert error.status() == "StatusCode.NOT_FOUND" and "'no-such-model'" in error.message()
    assert refusal(lambda: client.is_model_ready("no-such-model")).status() == "StatusCode.NOT_FOUND"
    short = fp32_input(np.ones(4, dtype=np.float32))
    short._raw_content = short._raw_content[:8]
    error = refusal(lambda: client.infer("scaler", [short]))  # the worker's refusal, passed on
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == "input 'INPUT0': shape [4] of FP32 needs 16 bytes, got 8"
    wrong = triton_grpc.InferInput("INPUT0", [2], "INT32")
    wrong.set_data_from_numpy(np.ones(2, dtype=np.int32))
    error = refusal(lambda: client.infer("scaler", [wrong]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "must be FP32" in error.message()


def test_the_workers_grpc_port_needs_the_token_the_router_adds(stack) -> None:
    worker = stack[1][0]
    port = httpx.get(f"{worker.url}/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()["grpc_port"]
    with grpc_client(f"127.0.0.1:{port}") as direct:
        for headers in ({}, {"authorization": "Bearer wrong"}):
            error = refusal(lambda: direct.infer("scaler", [fp32_input(np.ones(1, dtype=np.float32))], headers=headers))
            assert error.status() == "StatusCode.UNAUTHENTICATED" and "Bearer" in error.message()
        assert direct.is_server_live()  # the probes need none


def test_past_the_routers_request_limit_is_unavailable_with_retry_after(stack, client) -> None:
    router = stack[0]
    client.infer("slow", [fp32_input(np.ones(1, dtype=np.float32))])  # loaded, so the next one only waits on inference
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.infer, "slow", [fp32_input(np.ones(1, dtype=np.float32))])
        wait_for(lambda: inflight(router.url) == 1, "one request in flight through the router")
        with grpc.insecure_channel(stack[2]) as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            with pytest.raises(grpc.RpcError) as caught:
                call(b"\n\x06scaler", timeout=30)  # model_name only: refused before anything is read
        assert first.result().as_numpy("OUTPUT0").tolist() == [2.0]
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "its limit; retry shortly" in caught.value.details()
    assert dict(caught.value.trailing_metadata())["retry-after"] == "1"


def test_a_deadline_shorter_than_the_inference_is_deadline_exceeded(client) -> None:
    error = refusal(lambda: client.infer("slow", [fp32_input(np.ones(1, dtype=np.float32))], client_timeout=0.5))
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"


def inflight(router_url: str) -> int:
    return sum(p["inflight"] for p in httpx.get(f"{router_url}/router/pods", timeout=5).json())


def test_a_canary_takes_grpc_requests_as_it_takes_http_ones(procs, tmp_path) -> None:
    """The canary split is the HTTP path's: at 100% every gRPC answer comes from version 2 (it triples),
    under the model's own name, and says which version computed it."""
    folders = {v: ballast.write_model(tmp_path / f"m-v{v}", 2**20, factor=f) for v, f in (("1", 2.0), ("2", 3.0))}
    store = tmp_path / "model-store.json"
    store.write_text(json.dumps({"models": [{
        "id": "m", "framework": "torchvision", "task": "tensor", "version": "1", "source": f"file://{folders['1']}",
        "memory": 2**20, "rollout": {"canary": {"version": "2", "source": f"file://{folders['2']}", "weight": 100}}}]}))
    workers = procs.workers(store, ["64Mi"], extra=["--grpc-port", "0"])
    port = free_port()
    procs.router(workers, args=["--grpc-port", str(port)])
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        infer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        answer, call = infer.with_call(request, timeout=60)
    assert (answer.model_name, answer.model_version) == ("m", "2")
    assert np.frombuffer(answer.raw_output_contents[0], dtype="<f4").tolist() == [3.0]
    assert dict(call.trailing_metadata())["x-hotset-model-version"] == "2"


def test_pods_that_serve_no_grpc_are_passed_over_and_keep_their_copies(procs, tmp_path) -> None:
    """A pool mid-upgrade: one worker serves gRPC, one does not. gRPC calls go to the one that does
    (loading a copy there if need be); the other keeps its place and its HTTP traffic."""
    store = write_ballast_store(tmp_path, {"a": {"mib": 4}, "b": {"mib": 4}})
    with_grpc = procs.worker("with-grpc", store, "100Mi", extra=["--grpc-port", "0"])
    without = procs.worker("without-grpc", store, "100Mi")
    port = free_port()
    router = procs.router([with_grpc, without], args=["--grpc-port", str(port)])
    for model in ("a", "b"):  # each model's only copy on the pod without gRPC
        assert httpx.post(f"{without.url}/v2/repository/models/{model}/load", timeout=30).status_code == 200
    wait_for(lambda: copies(router.url, "a") == copies(router.url, "b") == ["without-grpc"], "the router to see them")
    with grpc_client(f"127.0.0.1:{port}") as client:
        for model in ("a", "b", "a", "b"):
            assert client.infer(model, [fp32_input(np.ones(1, dtype=np.float32))]).as_numpy("OUTPUT0").tolist() == [2.0]
    pods = {p["pod"]: p for p in httpx.get(f"{router.url}/router/pods", timeout=5).json()}
    assert set(pods) == {"with-grpc", "without-grpc"}
    assert {m for m, c in pods["with-grpc"]["copies"].items() if c["state"] == "READY"} == {"a", "b"}
    assert {m for m, c in pods["without-grpc"]["copies"].items() if c["state"] == "READY"} == {"a", "b"}
    for model in ("a", "b"):
        assert httpx.post(f"{router.url}/predict", json={"model_id": model, "input_data": [1.0]}, timeout=30).status_code == 200


def test_repository_calls_through_the_router_load_and_unload_with_the_admin_token(procs, tmp_path) -> None:
    """tritonclient.grpc's repository calls on the router: the index of the cluster's models, a load
    that places a ready copy and an unload that drops them, with the admin token; without it, refused."""
    store = write_ballast_store(tmp_path, {"a": {"mib": 4}, "b": {"mib": 4}})
    worker = procs.worker("repo-worker", store, "100Mi", extra=["--grpc-port", "0"])
    port = free_port()
    router = procs.router([worker], args=["--grpc-port", str(port), "--admin-token", "grpc-admin"])
    admin = {"authorization": "Bearer grpc-admin"}
    with grpc_client(f"127.0.0.1:{port}") as client:
        wait_for(lambda: {m.name for m in client.get_model_repository_index().models} == {"a", "b"}, "the catalog")
        assert {m.name: m.state for m in client.get_model_repository_index().models} == {
            "a": "UNAVAILABLE", "b": "UNAVAILABLE"}
        assert refusal(lambda: client.load_model("a")).status() == "StatusCode.UNAUTHENTICATED"
        assert refusal(lambda: client.load_model("a", headers={"authorization": "Bearer wrong"})).status() \
            == "StatusCode.UNAUTHENTICATED"
        assert copies(router.url, "a") == []  # a refused load placed nothing
        client.load_model("a", headers=admin)
        assert copies(router.url, "a") == ["repo-worker"]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            ready = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True), timeout=30).models
        assert [(m.name, m.state) for m in ready] == [("a", "READY")]
        unknown = refusal(lambda: client.load_model("nope", headers=admin))
        assert unknown.status() == "StatusCode.NOT_FOUND" and "nope" in unknown.message()
        client.unload_model("a", headers=admin)
        wait_for(lambda: copies(router.url, "a") == [], "the copy dropped")
