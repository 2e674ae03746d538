"""OIP v2 tensors survive the trip through JSON and the binary extension, whatever their datatype."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from hotset_common import errors
from hotset_worker import codec


def binary_request(tensors: dict[str, tuple[str, np.ndarray]], **header_extra) -> tuple[bytes, int]:
    header_inputs, blobs = [], []
    for name, (datatype, array) in tensors.items():
        blob = codec.serialize_bytes(array) if datatype == "BYTES" else array.tobytes()
        header_inputs.append({"name": name, "datatype": datatype, "shape": list(array.shape), "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    header = json.dumps({"inputs": header_inputs, **header_extra}).encode()
    return header + b"".join(blobs), len(header)


@pytest.mark.parametrize(
    ("datatype", "array"),
    [
        ("FP32", np.arange(6, dtype=np.float32).reshape(2, 3)),
        ("FP16", np.array([0.5, -1.25], dtype=np.float16)),
        ("INT64", np.array([[1], [-2]], dtype=np.int64)),
        ("UINT8", np.array([0, 255], dtype=np.uint8)),
        ("BOOL", np.array([True, False, True])),
        ("BYTES", np.array([[b"a", b""], [b"\xff\x00", "ü".encode()]], dtype=object)),
    ],
)
def test_binary_inputs_decode_to_the_same_arrays(datatype, array) -> None:
    body, header_length = binary_request({"x": (datatype, array)})
    decoded = codec.decode_request(body, header_length).inputs["x"]
    assert decoded.shape == array.shape and decoded.tolist() == array.tolist()
    assert decoded.flags.writeable


def test_json_inputs_accept_nested_or_flat_data() -> None:
    body = json.dumps({"inputs": [
        {"name": "flat", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]},
        {"name": "nested", "datatype": "FP64", "shape": [2, 1], "data": [[1.5], [2.5]]},
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["héllo"]},
    ]}).encode()
    inputs = codec.decode_request(body).inputs
    assert inputs["flat"].tolist() == [[1, 2], [3, 4]] and inputs["flat"].dtype == np.int32
    assert inputs["nested"].tolist() == [[1.5], [2.5]]
    assert inputs["text"].tolist() == ["héllo".encode()]


@pytest.mark.parametrize(
    ("tensor", "problem"),
    [
        ({"datatype": "INT32", "shape": [2], "data": [1, True]}, "not INT32"),
        ({"datatype": "UINT8", "shape": [1], "data": [300]}, "out of range"),
        ({"datatype": "INT8", "shape": [1], "data": [1.5]}, "cannot be int8"),
        ({"datatype": "FP32", "shape": [1, 2], "data": [[1], [2, 3]]}, "not FP32"),
        ({"datatype": "BYTES", "shape": [1], "data": [5]}, "not BYTES"),
        ({"datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}, "needs 4 elements"),
    ],
)
def test_json_inputs_that_do_not_match_their_header_are_400(tensor, problem) -> None:
    body = json.dumps({"inputs": [{"name": "x", **tensor}]}).encode()
    with pytest.raises(errors.BadInput, match=problem):
        codec.decode_request(body)


def test_bytes_with_a_broken_length_prefix_are_400() -> None:
    raw = struct.pack("<I", 10) + b"abc"
    header = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(raw)}}]}).encode()
    with pytest.raises(errors.BadInput, match="runs past"):
        codec.decode_request(header + raw, len(header))


def encode(request: codec.InferRequest, outputs: dict) -> tuple[dict, bytes, dict]:
    body, headers = codec.encode_response("m", "1", request, outputs)
    length = int(headers.get(codec.HEADER_LENGTH, len(body)))
    return json.loads(body[:length]), body[length:], headers


def test_outputs_come_back_binary_only_when_asked() -> None:
    outputs = {"y": np.array([[1.0, 2.0]], dtype=np.float32), "label": np.array([b"cat"], dtype=object)}
    header, raw, headers = encode(codec.InferRequest(inputs={}), outputs)
    assert headers["content-type"] == "application/json" and raw == b""
    assert header["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]},
        {"name": "label", "datatype": "BYTES", "shape": [1], "data": ["cat"]},
    ]
    header, raw, headers = encode(codec.InferRequest(inputs={}, binary_outputs=True, id="7"), outputs)
    assert header["id"] == "7" and headers["content-type"] == "application/octet-stream"
    assert raw == outputs["y"].tobytes() + struct.pack("<I", 3) + b"cat"
    requested = [codec.RequestedOutput("label", binary=False)]
    header, raw, _ = encode(codec.InferRequest(inputs={}, binary_outputs=True, outputs=requested), outputs)
    assert [o["name"] for o in header["outputs"]] == ["label"] and raw == b""


def test_bytes_that_are_not_text_go_binary_even_in_a_json_response() -> None:
    header, raw, _ = encode(codec.InferRequest(inputs={}), {"blob": np.array([b"\xff"], dtype=object)})
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 5 and raw == struct.pack("<I", 1) + b"\xff"


def test_an_unknown_requested_output_is_400_naming_it() -> None:
    request = codec.InferRequest(inputs={}, outputs=[codec.RequestedOutput("nope", binary=False)])
    with pytest.raises(errors.BadInput, match="no output 'nope'"):
        codec.encode_response("m", "1", request, {"y": np.zeros(1, dtype=np.float32)})
