"""OIP v2 protobuf requests decode to the tensors their HTTP twins decode to, whatever the datatype,
raw or typed; what does not add up is refused with the HTTP path's message."""
from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from hotset_common import errors
from hotset_worker import codec, grpc_codec

ARRAYS = [
    ("FP32", np.arange(6, dtype=np.float32).reshape(2, 3)),
    ("FP64", np.array([0.1, -2.0])),
    ("FP16", np.array([0.5, -1.25], dtype=np.float16)),
    ("INT8", np.array([-128, 127], dtype=np.int8)),
    ("INT64", np.array([[1], [-2]], dtype=np.int64)),
    ("UINT8", np.array([0, 255], dtype=np.uint8)),
    ("UINT64", np.array([2**63], dtype=np.uint64)),
    ("BOOL", np.array([True, False])),
    ("BYTES", np.array([b"a", b"\xff\x00", b""], dtype=object)),
]


def request(datatype: str, shape: list[int], raw: bytes | None = None, **contents: list) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="x", datatype=datatype, shape=shape)
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    if raw is not None:
        message.raw_input_contents.append(raw)
    return message


@pytest.mark.parametrize(("datatype", "array"), ARRAYS)
def test_raw_contents_decode_as_binary_http_inputs_do(datatype, array) -> None:
    decoded = grpc_codec.decode_request(request(datatype, list(array.shape), codec.raw_bytes(array)))
    np.testing.assert_array_equal(decoded.inputs["x"], array)


@pytest.mark.parametrize(("datatype", "array"), [a for a in ARRAYS if a[0] != "FP16"])
def test_typed_contents_decode_to_the_same_tensors(datatype, array) -> None:
    field = grpc_codec.CONTENTS_FIELD[datatype]
    decoded = grpc_codec.decode_request(request(datatype, list(array.shape), **{field: array.reshape(-1).tolist()}))
    np.testing.assert_array_equal(decoded.inputs["x"], array)
    assert decoded.inputs["x"].shape == array.shape


@pytest.mark.parametrize(("message", "error"), [
    (request("FP32", [3], b"\0" * 8), "input 'x': shape [3] of FP32 needs 12 bytes, got 8"),
    (request("FP32", [3], fp32_contents=[1.0]), "input 'x': shape [3] needs 3 elements, got 1"),
    (request("FP32", [-1], b""), "input 'x': shape [-1] has a negative dimension"),
    (request("INT8", [1], int_contents=[300]), "input 'x': data is not INT8: values out of range [-128, 127]"),
    (request("FP32", [1], int_contents=[1]), "input 'x': FP32 data goes in contents.fp32_contents, got contents.int_contents"),
    (request("FP16", [1], fp32_contents=[1.0]), "input 'x': FP16 has no typed contents field; send it in raw_input_contents"),
    (request("FP32", [1], b"\0" * 4, fp32_contents=[1.0]), "input 'x' has both raw_input_contents and contents.fp32_contents; give one"),
    (request("TEXT", [1], b"x"), "input 'x' has unsupported datatype 'TEXT'"),
])
def test_what_does_not_add_up_is_a_400_naming_the_input(message, error) -> None:
    with pytest.raises(errors.BadInput) as refused:
        grpc_codec.decode_request(message)
    assert refused.value.message.startswith(error)


def test_raw_contents_are_one_per_input_or_none() -> None:
    message = request("FP32", [1], b"\0" * 4)
    message.inputs.add(name="y", datatype="FP32", shape=[1])
    with pytest.raises(errors.BadInput, match="raw_input_contents has 1 entries for 2 inputs"):
        grpc_codec.decode_request(message)


def test_a_request_without_inputs_is_refused_as_http_refuses_it() -> None:
    with pytest.raises(errors.InvalidRequest, match="at least one input"):
        grpc_codec.decode_request(pb.ModelInferRequest(model_name="m"))


def test_parameters_and_requested_outputs_carry_over() -> None:
    message = request("FP32", [1], fp32_contents=[1.0])
    message.parameters["temperature"].double_param = 0.5
    message.parameters["top"].int64_param = 3
    message.outputs.add(name="OUT")
    decoded = grpc_codec.decode_request(message)
    assert decoded.parameters == {"temperature": 0.5, "top": 3}
    assert [o.name for o in decoded.outputs] == ["OUT"]
    classify = request("FP32", [1], fp32_contents=[1.0])
    classify.outputs.add(name="OUT").parameters["classification"].int64_param = 2
    with pytest.raises(errors.BadInput, match="classification extension is not supported"):
        grpc_codec.decode_request(classify)


def test_outputs_go_back_raw_only_those_asked_for() -> None:
    asked = grpc_codec.decode_request(request("FP32", [1], fp32_contents=[1.0]))
    outputs = {"A": np.array([1.5], dtype=np.float32), "B": np.array([b"x", b"yz"], dtype=object)}
    response = grpc_codec.encode_response("m", "1", asked, outputs)
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("A", "FP32", [1]), ("B", "BYTES", [2])]
    assert response.raw_output_contents[1] == b"\x01\x00\x00\x00x\x02\x00\x00\x00yz"
    asked.outputs = [codec.RequestedOutput("C", binary=True)]
    with pytest.raises(errors.BadInput, match="model 'm' has no output 'C'; outputs: A, B"):
        grpc_codec.encode_response("m", "1", asked, outputs)
