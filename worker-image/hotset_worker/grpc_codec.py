"""Open Inference Protocol v2 protobuf messages <-> the worker's decoded requests and numpy outputs.

The messages are the ``inference`` package's (``grpc_service.proto``, KServe's
``grpc_predict_v2.proto`` under Triton's name), from the stubs tritonclient
ships, so nothing here is hand-written protobuf. A request decodes into the
same ``codec.InferRequest`` an HTTP body does, through the same checks
(``codec.tensor_from_raw``/``tensor_from_values``), so a mistake gets the
same message on both wire formats:

- an input's data is either its entry of ``raw_input_contents`` (one entry
  per input, or none at all; little-endian, BYTES length-prefixed) or its
  typed ``contents`` field for its datatype (``fp32_contents`` for FP32...;
  FP16 and BF16 have none and travel raw), never both;
- outputs always go back as ``raw_output_contents``, as Triton answers
  (tritonclient reads them; a request cannot ask for typed outputs).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from hotset_common import errors
from hotset_worker import codec

# The typed contents field of each datatype (FP16 has none: raw only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def decode_request(message: pb.ModelInferRequest) -> codec.InferRequest:
    """A ModelInferRequest as the worker's decoded request; 400/422 naming what does not add up."""
    if not message.inputs:
        raise errors.InvalidRequest("invalid inference request: inputs: at least one input is required")
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise errors.BadInput(f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs: "
                              "give one per input, in the order of the inputs, or none")
    inputs: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(message.inputs):
        if tensor.name in inputs:
            raise errors.BadInput(f"input {errors.excerpt(tensor.name)} is given twice")
        inputs[tensor.name] = _input(tensor, raw[index] if raw else None)
    parameters = parameters_of(message.parameters)
    return codec.InferRequest(inputs=inputs, id=message.id or None, parameters=parameters,
                              outputs=[_requested(output) for output in message.outputs] or None, binary_outputs=True)


def _input(tensor: Any, raw: bytes | None) -> np.ndarray:
    shape, name, datatype = list(tensor.shape), tensor.name, tensor.datatype
    given = [field.name for field, _ in tensor.contents.ListFields()]
    if raw is not None:
        if given:
            raise errors.BadInput(f"input {errors.excerpt(name)} has both raw_input_contents and contents.{given[0]}; give one")
        return codec.tensor_from_raw(name, shape, datatype, raw)
    codec.numpy_dtype(name, datatype)  # an unsupported datatype is named before its contents
    expected = CONTENTS_FIELD.get(datatype)
    if expected is None:
        raise errors.BadInput(f"input {errors.excerpt(name)}: {datatype} has no typed contents field; send it in raw_input_contents")
    if given and given != [expected]:
        raise errors.BadInput(f"input {errors.excerpt(name)}: {datatype} data goes in contents.{expected}, got contents.{given[0]}")
    values = list(getattr(tensor.contents, expected))
    if datatype == "BYTES":
        return _bytes_tensor(name, shape, values)
    return codec.tensor_from_values(name, shape, datatype, values)


def _bytes_tensor(name: str, shape: list[int], values: list[bytes]) -> np.ndarray:
    """BYTES contents, checked (and shaped) as the same elements sent raw are."""
    return codec.tensor_from_raw(name, shape, "BYTES", codec.serialize_bytes(np.array(values, dtype=object)))


def _requested(output: Any) -> codec.RequestedOutput:
    parameters = parameters_of(output.parameters)
    if parameters.get("classification"):
        raise errors.BadInput(f"output {errors.excerpt(output.name)}: the classification extension is not supported")
    return codec.RequestedOutput(output.name, binary=True)


def parameters_of(parameters: Any) -> dict[str, Any]:
    """A protobuf parameter map as the plain values an HTTP request's ``parameters`` has."""
    plain: dict[str, Any] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        if choice is not None:
            plain[key] = getattr(parameter, choice)
    return plain


def encode_response(model_name: str, model_version: str, request: codec.InferRequest,
                    outputs: dict[str, np.ndarray]) -> pb.ModelInferResponse:
    """The ModelInferResponse of a request's outputs, all of them raw (as Triton answers)."""
    response = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=request.id or "")
    for name, array in codec.wanted_outputs(model_name, request, outputs):
        response.outputs.add(name=name, datatype=codec.datatype_of(array), shape=list(array.shape))
        response.raw_output_contents.append(codec.raw_bytes(array))
    return response


def metadata_response(metadata: dict[str, Any]) -> pb.ModelMetadataResponse:
    """The data plane's model metadata (what ``GET /v2/models/{name}`` answers) as protobuf."""
    response = pb.ModelMetadataResponse(name=metadata["name"], versions=metadata["versions"],
                                        platform=metadata["platform"])
    for field in ("inputs", "outputs"):
        for tensor in metadata[field]:
            getattr(response, field).add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
    return response
