"""The inference entry points that the seed API and OIP v2 both call.

Each request: get-or-load the model through the manager (counted in flight,
so it cannot be unloaded under the request), run the framework's
``predict``/``infer`` on a thread (a slow inference never stalls the event
loop), and record the outcome in the metrics. Errors stay ModelplaneErrors
with a message naming the model; anything else a framework raises becomes a
500 that says which model failed and how.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator

from modelplane_common import errors
from modelplane_common.spec import Framework, ModelSpec
from modelplane_worker import codec
from modelplane_worker.manager import ModelManager
from modelplane_worker.metrics import WorkerMetrics
from modelplane_worker.triton_health import TritonHealth

log = logging.getLogger(__name__)


class DataPlane:
    def __init__(self, manager: ModelManager, metrics: WorkerMetrics, triton: TritonHealth) -> None:
        self.manager = manager
        self.metrics = metrics
        self.triton = triton

    async def predict(self, model_id: str, input_data: Any) -> Any:
        """Seed ``/predict``: JSON in, JSON predictions out."""
        async with self._request(model_id) as spec:
            async with self.manager.use(spec.id) as worker:
                return await self._run(spec, worker.predict, input_data)

    async def infer(
        self, model_name: str, version: str | None, body: bytes, header_length: int | None
    ) -> tuple[bytes, dict[str, str]]:
        """OIP v2 infer: decode the body, infer, encode the outputs the way the request asked."""
        async with self._request(model_name) as spec:
            check_version(spec, version)
            request = codec.decode_request(body, header_length)
            async with self.manager.use(spec.id) as worker:
                outputs = await self._run(spec, worker.infer, request.inputs, request.parameters)
            return codec.encode_response(spec.id, spec.version, request, outputs)

    async def metadata(self, model_name: str, version: str | None) -> dict[str, Any]:
        """OIP v2 model metadata. A model that is not loaded is described from the store, with
        empty inputs and outputs: asking for metadata never loads a model (and evicts nothing)."""
        spec = self.manager.store.get(model_name)
        check_version(spec, version)
        worker = self.manager.loaded_worker(spec.id)
        tensors = {"inputs": [], "outputs": []}
        if worker is not None:
            tensors = {
                "inputs": [tensor_metadata(t) for t in worker.inputs()],
                "outputs": [tensor_metadata(t) for t in worker.outputs()],
            }
        return {"name": spec.id, "versions": [spec.version], "platform": spec.framework.value, **tensors}

    async def model_ready(self, model_name: str, version: str | None) -> bool:
        spec = self.manager.store.get(model_name)
        check_version(spec, version)
        worker = self.manager.loaded_worker(spec.id)
        if worker is None:
            return False
        if spec.framework is Framework.TRITON and not await self.triton.ready():
            return False
        return await asyncio.to_thread(worker.is_ready)

    @contextlib.asynccontextmanager
    async def _request(self, model_id: str) -> AsyncIterator[ModelSpec]:
        """Resolve the spec and record the request's code and latency however it ends."""
        started = time.perf_counter()
        spec: ModelSpec | None = None
        code = 500
        try:
            spec = self.manager.store.get(model_id)
            yield spec
            code = 200
        except errors.ModelplaneError as exc:
            code = exc.status_code
            raise
        finally:
            self.metrics.request_finished(spec, code, time.perf_counter() - started)

    async def _run(self, spec: ModelSpec, function: Any, *args: Any) -> Any:
        inference = asyncio.ensure_future(asyncio.to_thread(function, *args))
        try:
            return await asyncio.shield(inference)
        except asyncio.CancelledError:
            # The caller went away, but the thread still uses the model: keep holding it
            # (in flight) until the thread is done, so no eviction unloads it underneath.
            await asyncio.gather(inference, return_exceptions=True)
            raise
        except errors.ModelplaneError:
            raise
        except Exception as exc:
            if spec.framework is Framework.TRITON and not await self.triton.ready():
                raise errors.BackendUnavailable(f"model {spec.id!r}: the Triton sidecar is down ({exc})") from exc
            log.exception("inference on %s failed", spec.id)
            raise errors.ModelplaneError(f"inference on model {spec.id!r} failed: {type(exc).__name__}: {exc}") from exc


def check_version(spec: ModelSpec, version: str | None) -> None:
    if version not in (None, "", spec.version):
        raise errors.ModelNotFound(f"model {spec.id!r} has no version {version!r}; available: {spec.version!r}")


def tensor_metadata(tensor: Any) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
