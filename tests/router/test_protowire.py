"""The router reads a request's model name off the protobuf wire, skipping tensors unread, and writes
the server-level answers: what protobuf itself reads and writes (tritonclient's generated messages)."""
from __future__ import annotations

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from hotset_common import errors, grpc_wire
from hotset_router import protowire


def test_the_model_name_and_version_are_read_past_any_other_field() -> None:
    message = pb.ModelInferRequest(model_version="3", id="r", model_name="résumé-ranker")
    message.inputs.add(name="x", datatype="FP32", shape=[2, 2**20]).contents.fp32_contents.extend([1.0, 2.0])
    message.raw_input_contents.append(b"\x07" * 2**20)
    message.parameters["p"].int64_param = -1
    assert protowire.strings(message.SerializeToString(), (1, 2)) == {1: "résumé-ranker", 2: "3"}
    ready = pb.ModelReadyRequest(name="a", version="2").SerializeToString()
    assert protowire.strings(ready, (1, 2)) == {1: "a", 2: "2"}
    assert protowire.strings(b"", (1, 2)) == {}


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\x0a", b"\xff" * 11, b"\x0b", b"\x0a\x02\xff\xfe"])
def test_bytes_that_are_not_a_message_are_a_400(data) -> None:
    with pytest.raises(errors.BadInput):
        protowire.strings(data, (1, 2))


def test_answers_parse_as_the_service_messages() -> None:
    assert pb.ServerLiveResponse.FromString(protowire.boolean(1, True)).live
    assert not pb.ModelReadyResponse.FromString(protowire.boolean(1, False)).ready
    metadata = protowire.string(1, "hotset-router") + protowire.string(2, "0.1.0") + protowire.string(3, "x" * 300)
    parsed = pb.ServerMetadataResponse.FromString(metadata)
    assert (parsed.name, parsed.version, list(parsed.extensions)) == ("hotset-router", "0.1.0", ["x" * 300])


@pytest.mark.parametrize(("status", "code"), [
    (400, grpc.StatusCode.INVALID_ARGUMENT), (422, grpc.StatusCode.INVALID_ARGUMENT), (404, grpc.StatusCode.NOT_FOUND),
    (401, grpc.StatusCode.UNAUTHENTICATED), (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (429, grpc.StatusCode.RESOURCE_EXHAUSTED), (503, grpc.StatusCode.UNAVAILABLE),
    (504, grpc.StatusCode.DEADLINE_EXCEEDED), (418, grpc.StatusCode.INVALID_ARGUMENT), (502, grpc.StatusCode.INTERNAL),
])
def test_one_table_maps_http_statuses_to_grpc_codes(status, code) -> None:
    assert grpc_wire.code_for(status) == code


def test_an_error_keeps_its_message_and_says_when_to_retry() -> None:
    code, message, trailers = grpc_wire.error_of(errors.TooManyRequests("model 'm' is at its limit", 3))
    assert (code, message) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "model 'm' is at its limit")
    assert dict(trailers) == {"hotset-status": "429", "retry-after": "3"}
    assert grpc_wire.timeout_of(None, {}) is None
    assert grpc_wire.timeout_of(5.0, {"x-hotset-timeout": "2"}) == 2.0
    assert grpc_wire.timeout_of(1.0, {"x-hotset-timeout": "2"}) == 1.0


def test_a_503_when_the_calls_own_deadline_ran_out_is_deadline_exceeded() -> None:
    late = errors.NoCapacity("model 'm': the request's deadline passed while waiting for its load", 2)
    assert grpc_wire.error_of(late, 0.0)[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert grpc_wire.error_of(late, 3.0)[0] == grpc.StatusCode.UNAVAILABLE  # its model's shorter timeoutSeconds
    assert grpc_wire.error_of(late, None)[0] == grpc.StatusCode.UNAVAILABLE  # a call without a deadline
    assert grpc_wire.error_of(errors.BadInput("x"), 0.0)[0] == grpc.StatusCode.INVALID_ARGUMENT
