"""Open Inference Protocol v2 tensors <-> numpy, in JSON and binary form.

The binary data extension (what tritonclient.http sends and asks for by
default): the body is a JSON header of ``Inference-Header-Content-Length``
bytes followed by each binary tensor's raw little-endian bytes, in the order
of the tensors whose ``parameters.binary_data_size`` says how many bytes they
take. BYTES elements are each a 4-byte little-endian length and the bytes.
An output goes back binary when the request asks for it per output
(``parameters.binary_data``) or for all (``parameters.binary_data_output``).

Structural problems (not JSON, a missing field) raise InvalidRequest (422);
tensors that do not add up (shape, datatype, sizes) raise BadInput (400)
naming the tensor.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pydantic

from hotset_common import errors

# OIP v2 datatype -> numpy dtype (little-endian, as the wire is).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_KIND_SIZE_TO_DATATYPE = {(dtype.kind, dtype.itemsize): name for name, dtype in DATATYPES.items() if name != "BYTES"}

HEADER_LENGTH = "Inference-Header-Content-Length"
# numpy holds at most 64 dimensions of at most 2**63 - 1 each; a shape past these (a zero
# dimension makes any other one "fit" the data) is the client's mistake, not a server error.
MAX_DIMENSIONS = 32
MAX_DIMENSION = 2**31 - 1


class _Tensor(pydantic.BaseModel):
    name: str = pydantic.Field(..., min_length=1)
    shape: list[pydantic.NonNegativeInt]
    datatype: str
    parameters: dict[str, Any] = {}
    data: Any = None


class _RequestedOutput(pydantic.BaseModel):
    name: str = pydantic.Field(..., min_length=1)
    parameters: dict[str, Any] = {}


class _InferRequestHeader(pydantic.BaseModel):
    id: str | None = None
    parameters: dict[str, Any] = {}
    inputs: list[_Tensor] = pydantic.Field(..., min_length=1)
    outputs: list[_RequestedOutput] | None = None


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass
class InferRequest:
    """A decoded request: named numpy inputs and how the outputs should come back."""

    inputs: dict[str, np.ndarray]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[RequestedOutput] | None = None  # None: every output the model has
    binary_outputs: bool = False  # the default for outputs not listed


def datatype_of(array: np.ndarray) -> str:
    if array.dtype.kind in ("O", "S", "U"):
        return "BYTES"
    try:
        return _KIND_SIZE_TO_DATATYPE[(array.dtype.kind, array.dtype.itemsize)]
    except KeyError:
        raise errors.BadInput(f"numpy dtype {array.dtype} has no OIP v2 datatype") from None


# ----- requests ------------------------------------------------------------


def decode_request(body: bytes, header_length: int | None = None) -> InferRequest:
    """Parse an infer request body (JSON, or JSON header + binary tensors)."""
    if header_length is not None and not 0 < header_length <= len(body):
        raise errors.BadInput(f"{HEADER_LENGTH} is {header_length} but the body has {len(body)} bytes")
    header_bytes = body if header_length is None else body[:header_length]
    header = _parse_header(header_bytes)
    binary = memoryview(body)[len(header_bytes):]
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for tensor in header.inputs:
        if tensor.name in inputs:
            raise errors.BadInput(f"input {errors.excerpt(tensor.name)} is given twice")
        size = tensor.parameters.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise errors.BadInput(f"input {errors.excerpt(tensor.name)}: binary_data_size {errors.excerpt(size)} runs past the end of the body")
            inputs[tensor.name] = _tensor_from_binary(tensor, binary[offset:offset + size])
            offset += size
        else:
            inputs[tensor.name] = _tensor_from_json(tensor)
    if offset != len(binary):
        raise errors.BadInput(f"the body has {len(binary) - offset} bytes after the last binary input")
    return InferRequest(
        inputs=inputs,
        id=header.id,
        parameters=header.parameters,
        outputs=_requested_outputs(header),
        binary_outputs=bool(header.parameters.get("binary_data_output", False)),
    )


def _parse_header(header_bytes: bytes) -> _InferRequestHeader:
    try:
        return _InferRequestHeader.model_validate_json(header_bytes)
    except pydantic.ValidationError as exc:
        raise refusal(exc, "invalid inference request") from None


def parse_header_length(value: str | None) -> int | None:
    """The binary extension's ``Inference-Header-Content-Length``: the JSON header's byte count."""
    if value is None:
        return None
    if not value.strip().isdigit():
        raise errors.BadInput(f"{HEADER_LENGTH} must be a byte count, got {errors.excerpt(value)}")
    return int(value)


def refusal(exc: pydantic.ValidationError, what: str) -> errors.HotsetError:
    """What a body pydantic refused gets: 400 when it is nested past pydantic's JSON parser (the
    same answer the router gives past its own parser), else 422 naming the fields at fault."""
    first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
    if first["type"] == "json_invalid" and "recursion limit" in first["msg"]:
        return errors.NestedTooDeeply()
    return errors.InvalidRequest(f"{what}: {describe_validation_error(exc)}")


def describe_validation_error(exc: pydantic.ValidationError) -> str:
    """pydantic's errors as one line naming each field: 'inputs.0.shape: Field required' (the first
    few, then how many more: 50,000 bad tensors are not a 10 MB message)."""
    shown = exc.errors(include_url=False, include_context=False, include_input=False)[:errors.LISTED_PROBLEMS]
    problems = [f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}" for error in shown]
    return errors.summarize(problems, total=exc.error_count())


def _dtype(tensor: _Tensor) -> np.dtype:
    try:
        return DATATYPES[tensor.datatype]
    except KeyError:
        known = ", ".join(DATATYPES)
        raise errors.BadInput(f"input {errors.excerpt(tensor.name)} has unsupported datatype {errors.excerpt(tensor.datatype)}; supported: {known}") from None


def _check_shape(tensor: _Tensor) -> None:
    if len(tensor.shape) > MAX_DIMENSIONS:
        raise errors.BadInput(f"input {errors.excerpt(tensor.name)}: shape has {len(tensor.shape)} dimensions; at most {MAX_DIMENSIONS}")
    too_large = [d for d in tensor.shape if d > MAX_DIMENSION]
    if too_large:
        raise errors.BadInput(f"input {errors.excerpt(tensor.name)}: shape dimension {too_large[0]} exceeds {MAX_DIMENSION}")


def _tensor_from_binary(tensor: _Tensor, raw: memoryview) -> np.ndarray:
    _check_shape(tensor)
    dtype = _dtype(tensor)
    count = math.prod(tensor.shape)
    if tensor.datatype == "BYTES":
        elements = deserialize_bytes(raw, tensor.name)
        if len(elements) != count:
            raise errors.BadInput(f"input {errors.excerpt(tensor.name)}: shape {tensor.shape} needs {count} elements, got {len(elements)}")
        return np.array(elements, dtype=object).reshape(tensor.shape)
    if len(raw) != count * dtype.itemsize:
        raise errors.BadInput(
            f"input {errors.excerpt(tensor.name)}: shape {tensor.shape} of {tensor.datatype} needs {count * dtype.itemsize} bytes, "
            f"got {len(raw)}"
        )
    return np.frombuffer(bytearray(raw), dtype=dtype).reshape(tensor.shape)  # a writable copy for torch


def _tensor_from_json(tensor: _Tensor) -> np.ndarray:
    _check_shape(tensor)
    dtype = _dtype(tensor)
    if tensor.data is None:
        raise errors.InvalidRequest(f"input {errors.excerpt(tensor.name)} has neither 'data' nor parameters.binary_data_size")
    data = tensor.data if isinstance(tensor.data, list) else [tensor.data]
    count = math.prod(tensor.shape)
    try:
        if tensor.datatype == "BYTES":
            flat = np.array([_as_bytes(x, tensor.name) for x in _flatten(data)], dtype=object)
        else:
            flat = _numbers(data, dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise errors.BadInput(f"input {errors.excerpt(tensor.name)}: data is not {tensor.datatype}: {exc}") from None
    if flat.size != count:
        raise errors.BadInput(f"input {errors.excerpt(tensor.name)}: shape {tensor.shape} needs {count} elements, got {flat.size}")
    return flat.reshape(tensor.shape)


def _numbers(data: list[Any], dtype: np.dtype) -> np.ndarray:
    """JSON numbers as a flat array of `dtype`, refusing what would silently change value."""
    raw = np.array(data)
    if dtype.kind != "b" and raw.dtype.kind != "b" and any(isinstance(x, bool) for x in _flatten(data)):
        raise ValueError("booleans in a numeric tensor")
    allowed = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}[dtype.kind]
    if raw.dtype.kind not in allowed:
        raise ValueError(f"elements of kind {raw.dtype} cannot be {dtype.name}")
    if dtype.kind in "iu" and raw.size:
        info = np.iinfo(dtype)
        if raw.min() < info.min or raw.max() > info.max:
            raise ValueError(f"values out of range [{info.min}, {info.max}]")
    return raw.astype(dtype).reshape(-1)


def _flatten(data: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in data:
        out.extend(_flatten(item) if isinstance(item, list) else [item])
    return out


def _as_bytes(value: Any, name: str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    raise ValueError(f"BYTES elements must be strings in JSON, got {type(value).__name__}")


def _requested_outputs(header: _InferRequestHeader) -> list[RequestedOutput] | None:
    if header.outputs is None:
        return None
    default = bool(header.parameters.get("binary_data_output", False))
    requested = []
    for output in header.outputs:
        if output.parameters.get("classification"):
            raise errors.BadInput(f"output {errors.excerpt(output.name)}: the classification extension is not supported")
        requested.append(RequestedOutput(output.name, bool(output.parameters.get("binary_data", default))))
    return requested


# ----- BYTES tensors ----------------------------------------------------


def serialize_bytes(array: np.ndarray) -> bytes:
    parts = []
    for element in array.reshape(-1):
        data = element.encode() if isinstance(element, str) else bytes(element)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes(raw: memoryview | bytes, name: str) -> list[bytes]:
    raw = bytes(raw)
    elements, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise errors.BadInput(f"input {errors.excerpt(name)}: BYTES data ends inside a length prefix")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise errors.BadInput(f"input {errors.excerpt(name)}: a BYTES element of {length} bytes runs past the tensor's end")
        elements.append(raw[offset:offset + length])
        offset += length
    return elements


# ----- responses -----------------------------------------------------------


def encode_response(
    model_name: str,
    model_version: str,
    request: InferRequest,
    outputs: dict[str, np.ndarray],
) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers (Content-Type, and the header length when binary)."""
    wanted = request.outputs or [RequestedOutput(name, request.binary_outputs) for name in outputs]
    described: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for output in wanted:
        if output.name not in outputs:
            raise errors.BadInput(f"model {model_name!r} has no output {errors.excerpt(output.name)}; outputs: {', '.join(outputs)}")
        entry, blob = _encode_output(output, np.asarray(outputs[output.name]))
        described.append(entry)
        if blob is not None:
            blobs.append(blob)
    header: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": described}
    if request.id is not None:
        header["id"] = request.id
    # msgspec, not json: 16x faster on large outputs (json.dumps held the GIL 0.6 s for 800k floats,
    # stalling the event loop from any thread), and JSON has no NaN or infinity: msgspec writes
    # them as null (as JavaScript's JSON.stringify does) where json wrote bare NaN tokens.
    header_bytes = msgspec.json.encode(header)
    if not blobs:
        return header_bytes, {"content-type": "application/json"}
    return header_bytes + b"".join(blobs), {
        "content-type": "application/octet-stream",
        HEADER_LENGTH: str(len(header_bytes)),
    }


def _encode_output(output: RequestedOutput, array: np.ndarray) -> tuple[dict[str, Any], bytes | None]:
    datatype = datatype_of(array)
    entry: dict[str, Any] = {"name": output.name, "datatype": datatype, "shape": list(array.shape)}
    if datatype == "BYTES":
        as_text = None if output.binary else _bytes_as_text(array)
        if as_text is None:  # asked for binary, or not UTF-8 and so only sendable binary
            blob = serialize_bytes(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            return entry, blob
        entry["data"] = as_text
        return entry, None
    if output.binary:
        blob = np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes()
        entry["parameters"] = {"binary_data_size": len(blob)}
        return entry, blob
    entry["data"] = array.reshape(-1).tolist()
    return entry, None


def _bytes_as_text(array: np.ndarray) -> list[str] | None:
    try:
        return [e if isinstance(e, str) else bytes(e).decode() for e in array.reshape(-1)]
    except UnicodeDecodeError:
        return None


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema with its ``$defs`` references replaced by the definitions (no document-level refs)."""
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(definitions[node["$ref"].rsplit("/", 1)[-1]])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return inline(schema)


# The JSON form of an infer request, for the OpenAPI description (the binary extension appends
# raw tensors after this header; Inference-Header-Content-Length says where the header ends).
INFER_REQUEST_SCHEMA: dict[str, Any] = _inlined(_InferRequestHeader.model_json_schema())


# ----- tensors of other wire formats (gRPC) -----------------------------------


def tensor_from_raw(name: str, shape: list[int], datatype: str, raw: bytes | memoryview) -> np.ndarray:
    """A tensor from its raw little-endian bytes (BYTES: length-prefixed elements), checked as a
    binary HTTP input is: the same messages for the same mistakes."""
    return _tensor_from_binary(_described(name, shape, datatype), memoryview(raw))


def tensor_from_values(name: str, shape: list[int], datatype: str, values: list[Any]) -> np.ndarray:
    """A tensor from a flat list of values (gRPC's typed contents), checked as JSON ``data`` is."""
    return _tensor_from_json(_described(name, shape, datatype, data=values))


def numpy_dtype(name: str, datatype: str) -> np.dtype:
    """The numpy dtype of an input's datatype; 400 naming the input and the supported ones."""
    return _dtype(_described(name, [], datatype))


def _described(name: str, shape: list[int], datatype: str, data: Any = None) -> _Tensor:
    if not name:
        raise errors.InvalidRequest("every input needs a name")
    negative = [d for d in shape if d < 0]
    if negative:
        raise errors.BadInput(f"input {errors.excerpt(name)}: shape {list(shape)} has a negative dimension")
    return _Tensor.model_construct(name=name, shape=list(shape), datatype=datatype, parameters={}, data=data)


def wanted_outputs(model_name: str, request: InferRequest, outputs: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """The outputs a request asked for (all, in the model's order, when it named none), each as an
    array; 400 naming an output the model does not have."""
    names = [o.name for o in request.outputs] if request.outputs else list(outputs)
    missing = [name for name in names if name not in outputs]
    if missing:
        raise errors.BadInput(f"model {model_name!r} has no output {errors.excerpt(missing[0])}; outputs: {', '.join(outputs)}")
    return [(name, np.asarray(outputs[name])) for name in names]


def raw_bytes(array: np.ndarray) -> bytes:
    """An output's raw bytes as the binary extension and gRPC's raw contents carry them."""
    if datatype_of(array) == "BYTES":
        return serialize_bytes(array)
    return np.ascontiguousarray(array, dtype=DATATYPES[datatype_of(array)]).tobytes()
