"""OIP v2 over gRPC on a real worker, with the stock tritonclient.grpc client: the same pipeline,
limits and messages as HTTP, errors as gRPC status codes (never UNKNOWN or INTERNAL for bad input)."""
from __future__ import annotations

import concurrent.futures

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from hotset_testing import ballast_framework as ballast
from hotset_testing.grpc_clients import fp32_input, grpc_client, refusal
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread, wait_until

TOKEN = "worker-secret"


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """(HTTP url, gRPC address) of a worker with a token, a slow limited model and a slow-loading one."""
    store = ballast.catalog(tmp_path_factory.mktemp("models"), {
        "double": {"factor": 2.0}, "slow": {"predict_delay": 1.0}, "late": {"delay": 3.0}})
    store.put(store.get("slow").model_copy(update={"max_concurrency": 1}))
    app = ballast_app(store, budget=16 * MiB, max_model_queue=1, api_token=TOKEN, grpc_address="127.0.0.1:0")
    with serve_in_thread(app) as url:
        status = httpx.get(f"{url}/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
        yield url, f"127.0.0.1:{status['grpc_port']}"


@pytest.fixture
def client(worker):
    with grpc_client(worker[1]) as client:
        yield client


AUTH = {"authorization": f"Bearer {TOKEN}"}




def test_tritonclient_grpc_infers_with_raw_contents(client) -> None:
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = client.infer("double", [fp32_input(values)], headers=AUTH, request_id="r-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values * 2)
    assert result.as_numpy("MODEL").tolist() == [b"double"]
    assert result.get_response().id == "r-1"
    only = client.infer("double", [fp32_input(values)], headers=AUTH,
                        outputs=[triton_grpc.InferRequestedOutput("OUTPUT0")])
    assert [o.name for o in only.get_response().outputs] == ["OUTPUT0"]


def test_probes_metadata_and_readiness(client) -> None:
    assert client.is_server_live() and client.is_server_ready()  # the probes need no token
    assert client.get_server_metadata(headers=AUTH).name == "hotset-worker"
    metadata = client.get_model_metadata("double", headers=AUTH)
    assert metadata.name == "double" and [(i.name, i.datatype) for i in metadata.inputs] == [("INPUT0", "FP32")]
    client.infer("double", [fp32_input(np.ones(1, dtype=np.float32))], headers=AUTH)
    assert client.is_model_ready("double", headers=AUTH)


def test_typed_contents_are_honoured_like_raw_contents(worker) -> None:
    with grpc.insecure_channel(worker[1]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="double")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[3]).contents.fp32_contents.extend([1.0, 2.5, -1.0])
        answer = stub.ModelInfer(request, metadata=tuple(AUTH.items()), timeout=30)
    assert [o.name for o in answer.outputs] == ["OUTPUT0", "MODEL"]
    np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], dtype="<f4"), [2.0, 5.0, -2.0])


def test_unknown_model_is_not_found(client) -> None:
    error = refusal(lambda: client.infer("nope", [fp32_input(np.ones(1, dtype=np.float32))], headers=AUTH))
    assert error.status() == "StatusCode.NOT_FOUND" and "'nope'" in error.message()
    assert refusal(lambda: client.get_model_metadata("nope", headers=AUTH)).status() == "StatusCode.NOT_FOUND"


def test_bad_shape_and_datatype_are_invalid_argument_with_the_http_message(worker, client) -> None:
    short = triton_grpc.InferInput("INPUT0", [4], "FP32")
    short.set_data_from_numpy(np.ones(4, dtype=np.float32))
    short._raw_content = short._raw_content[:8]  # 2 of the 4 elements the shape declares
    error = refusal(lambda: client.infer("double", [short], headers=AUTH))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == "input 'INPUT0': shape [4] of FP32 needs 16 bytes, got 8"
    unknown = triton_grpc.InferInput("INPUT0", [1], "FP33")
    unknown._raw_content = b"\0" * 4
    error = refusal(lambda: client.infer("double", [unknown], headers=AUTH))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "unsupported datatype 'FP33'" in error.message()
    wrong = triton_grpc.InferInput("INPUT0", [2], "INT32")
    wrong.set_data_from_numpy(np.ones(2, dtype=np.int32))
    error = refusal(lambda: client.infer("double", [wrong], headers=AUTH))  # the model's own check, as over HTTP
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "must be FP32" in error.message()
    with grpc.insecure_channel(worker[1]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        mixed = pb.ModelInferRequest(model_name="double")
        mixed.inputs.add(name="INPUT0", datatype="FP32", shape=[1]).contents.int_contents.append(1)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(mixed, metadata=tuple(AUTH.items()), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "input 'INPUT0': FP32 data goes in contents.fp32_contents, got contents.int_contents"


def test_missing_or_wrong_token_is_unauthenticated(client) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}):
        error = refusal(lambda: client.infer("double", [fp32_input(np.ones(1, dtype=np.float32))], headers=headers))
        assert error.status() == "StatusCode.UNAUTHENTICATED" and "Bearer" in error.message()


def test_past_the_models_queue_is_resource_exhausted_with_retry_after(worker) -> None:
    url, address = worker
    request = pb.ModelInferRequest(model_name="slow")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    with grpc.insecure_channel(address) as channel:
        infer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        infer(request, metadata=tuple(AUTH.items()), timeout=30)  # loaded
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(infer, request, metadata=tuple(AUTH.items()), timeout=30)
            wait_until(lambda: queued(url, "hotset_inflight_requests") == 1, what="one request in flight")
            second = pool.submit(infer, request, metadata=tuple(AUTH.items()), timeout=30)
            wait_until(lambda: queued(url, "hotset_model_queued_requests") == 1, what="one request queued")
            with pytest.raises(grpc.RpcError) as caught:
                infer.with_call(request, metadata=tuple(AUTH.items()), timeout=30)
            first.result(), second.result()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limit of 1 concurrent" in caught.value.details()
    assert dict(caught.value.trailing_metadata())["retry-after"] == "1"


def test_the_call_deadline_is_the_request_deadline(client) -> None:
    error = refusal(lambda: client.infer("late", [fp32_input(np.ones(1, dtype=np.float32))], headers=AUTH,
                                         client_timeout=0.5))
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"


def test_grpc_requests_are_counted_with_http_ones_under_their_http_status(worker, client) -> None:
    url = worker[0]
    before = {code: metric(url, "hotset_requests_total", "double", code=code) for code in ("200", "400")}
    client.infer("double", [fp32_input(np.ones(2, dtype=np.float32))], headers=AUTH)
    wrong = triton_grpc.InferInput("INPUT0", [1], "INT32")
    wrong.set_data_from_numpy(np.ones(1, dtype=np.int32))
    refusal(lambda: client.infer("double", [wrong], headers=AUTH))
    after = {code: metric(url, "hotset_requests_total", "double", code=code) for code in ("200", "400")}
    assert {code: after[code] - before[code] for code in after} == {"200": 1, "400": 1}


def queued(url: str, name: str) -> float:
    return metric(url, name, "slow")


def metric(url: str, name: str, model: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == model and \
                    all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_a_message_past_the_body_limit_is_resource_exhausted(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"double": {}})
    with serve_in_thread(ballast_app(store, budget=4 * MiB, max_body_bytes=4096, grpc_address="127.0.0.1:0")) as url:
        with grpc_client(f"127.0.0.1:{httpx.get(f'{url}/status').json()['grpc_port']}") as client:
            error = refusal(lambda: client.infer("double", [fp32_input(np.ones(2048, dtype=np.float32))]))
            assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
            result = client.infer("double", [fp32_input(np.ones(8, dtype=np.float32))])  # within it: served
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full(8, 2.0, dtype=np.float32))


def test_repository_index_load_and_unload_over_grpc(worker, client) -> None:
    """tritonclient.grpc's repository calls answer what the HTTP routes answer: the index with each
    model's state, a load that makes the model ready, an unload that takes it out."""
    client.unload_model("double", headers=AUTH)
    index = {m.name: m.state for m in client.get_model_repository_index(headers=AUTH).models}
    assert index["double"] == "UNAVAILABLE" and set(index) >= {"double", "slow", "late"}
    client.load_model("double", headers=AUTH)
    assert client.is_model_ready("double", headers=AUTH)
    ready = [m.name for m in stub_index(worker[1], ready=True)]
    assert "double" in ready and "late" not in ready
    client.unload_model("double", headers=AUTH)
    assert not client.is_model_ready("double", headers=AUTH)

    unknown = refusal(lambda: client.load_model("nope", headers=AUTH))
    assert unknown.status() == "StatusCode.NOT_FOUND" and "'nope'" in unknown.message()
    assert refusal(lambda: client.get_model_repository_index()).status() == "StatusCode.UNAUTHENTICATED"
    assert refusal(lambda: client.load_model("double")).status() == "StatusCode.UNAUTHENTICATED"



def stub_index(address: str, ready: bool) -> list:
    """The index as the raw stub asks for it (tritonclient's call has no ``ready`` flag)."""
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return list(stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=ready), metadata=tuple(AUTH.items()), timeout=30).models)
