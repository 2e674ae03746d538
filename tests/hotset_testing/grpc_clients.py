"""What the gRPC tests share: the stock ``tritonclient.grpc`` client, closed after use, an FP32
input tensor, and the error a refused call raises (the worker's and the router's tests alike)."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException


@contextlib.contextmanager
def grpc_client(address: str) -> Iterator[triton_grpc.InferenceServerClient]:
    """A ``tritonclient.grpc`` client of `address` (host:port), closed when done."""
    client = triton_grpc.InferenceServerClient(address)
    try:
        yield client
    finally:
        client.close()


def fp32_input(values: np.ndarray, name: str = "INPUT0") -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput(name, list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return tensor


def refusal(call: Callable[[], object]) -> InferenceServerException:
    """The error `call` must raise (it fails the test when the call succeeds)."""
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value
