"""The inference entry points that the seed API and OIP v2 (HTTP and gRPC) call, and the admission
path (``DataPlane.hold``) that the OpenAI routes share with them. OIP v2's two wire formats meet
in ``infer_tensors``: each only decodes its request and encodes its answer.

Each request: wait for one of the model's slots when its spec limits its
concurrency (``limits.py``), get-or-load the model through the manager
(counted in flight, so it cannot be unloaded under the request) within the
request's deadline (the caller's ``X-Hotset-Timeout``, capped by the
model's ``timeoutSeconds``), run the framework's ``predict``/``infer`` on a
thread (a slow inference never stalls the event loop), and record the outcome
in the metrics. Decoding and encoding OIP bodies run on threads too: an 8 MB
JSON tensor takes most of a second, and the event loop also answers status
polls and health probes. Errors stay HotsetErrors
with a message naming the model; anything else a framework raises becomes a
500 that says which model failed and how.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Mapping, TypeVar

from hotset_common import errors, wire
from hotset_common.spec import ModelSpec
from hotset_worker import codec, engine
from hotset_worker.backends import Backends
from hotset_worker.batching import Batchers, BatchTiming, estimated_rows
from hotset_worker.fair_threads import FairThreads
from hotset_worker.frameworks.base import ForwardedResponse, FrameworkWorker, Rows
from hotset_worker.limits import ModelLimiter
from hotset_worker.manager import ModelManager, RequestTiming
from hotset_worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

Answer = TypeVar("Answer")  # an infer answer in one wire format (an HTTP body, a protobuf message)


@dataclass(frozen=True)
class Inferred:
    """An OIP v2 request's named outputs, before a wire format encodes them (JSON, binary, protobuf)."""

    model_name: str  # what the client asked for (a canary answers under its model's name)
    model_version: str
    request: codec.InferRequest  # which outputs it asked for, and its id
    outputs: dict[str, Any]


@dataclass(frozen=True)
class Held:
    """What ``DataPlane.hold`` admitted: the spec whose copy serves the request (the model's own
    when the canary it chose ended meanwhile), and that copy's framework worker."""

    spec: ModelSpec
    worker: FrameworkWorker


@dataclass
class _Outcome:
    """One request's resolved model and the status code its metrics record."""

    spec: ModelSpec
    code: int = 200

    def admitted(self, held: Held) -> tuple[ModelSpec, FrameworkWorker]:
        """The spec and worker the request got (its metrics follow the spec that answered it)."""
        self.spec = held.spec
        return held.spec, held.worker


def available_cores() -> int:
    """Cores this process may run on (a container's CPU set, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class DataPlane:
    def __init__(self, manager: ModelManager, metrics: WorkerMetrics, backends: Backends,
                 limiter: ModelLimiter | None = None, inference_threads: int | None = None) -> None:
        """`inference_threads`: inferences that run at once (default: one per available core). More
        threads than cores only contend for the GIL and the cores (torch parallelises each op
        itself): measured on 2 cores under a flood, 6 threads gave 27% less throughput than 1
        and slowed the event loop's answers (refusals included) about 8x at the median."""
        self.manager = manager
        self.metrics = metrics
        self.backends = backends
        self.limiter = limiter or ModelLimiter(metrics, clock=manager.clock)
        threads = inference_threads or available_cores()
        self.inference_threads = FairThreads(threads, thread_name_prefix="inference")  # shared fairly by namespace
        manager.queue.weight_of = self.inference_threads.weight  # one weight per namespace: threads and queue places
        self.batchers = Batchers(self.inference_threads, manager.clock, metrics, max_passes=threads)

    def note_share_weight(self, value: str | None) -> None:
        """A request's ``wire.SHARE_WEIGHT_HEADER`` (the router's): its namespace's weight in the
        inference threads' shares from now on."""
        parsed = wire.parse_share_weight(value)
        if parsed is not None and self.inference_threads.set_weight(*parsed):
            self.metrics.share_weight(*parsed)

    def close(self) -> None:
        self.inference_threads.shutdown(wait=False, cancel_futures=True)

    def deadline_of(self, spec: ModelSpec, timeout_s: float | None) -> float | None:
        """When the request must have its model (the manager's clock): the caller's budget
        (default: the manager's request timeout), capped by the model's ``timeoutSeconds``; None
        when it is the manager's default alone."""
        if timeout_s is None and spec.timeout_seconds is None:
            return None
        budget = self.manager.request_timeout_s if timeout_s is None else timeout_s
        if spec.timeout_seconds is not None:
            budget = min(budget, spec.timeout_seconds)
        return self.manager.clock.now() + budget

    @contextlib.asynccontextmanager
    async def hold(self, spec: ModelSpec, timeout_s: float | None, timing: RequestTiming) -> AsyncIterator[Held]:
        """The one admission path of every protocol's requests (seed, OIP v2, OpenAI): the model's
        slot (its maxConcurrency), then its loaded copy, within the request's deadline (capped by
        its timeoutSeconds), counted in flight for the block."""
        deadline = self.deadline_of(spec, timeout_s)
        slot = contextlib.nullcontext() if spec.max_concurrency is None else self._slot(spec, deadline, timing)
        async with slot, contextlib.AsyncExitStack() as copy:
            held = await self._use(copy, spec, timing, deadline)
            self.metrics.request_started(held.spec)
            try:
                yield held
            finally:
                self.metrics.request_ended(held.spec)

    async def _use(self, copy: contextlib.AsyncExitStack, spec: ModelSpec, timing: RequestTiming,
                   deadline: float | None) -> Held:
        """`spec`'s copy, held for `copy`'s block. A canary version resolved for this request can
        leave the store before its copy is taken (a promotion's store update lands in between:
        each lookup reads the store as it is now); the model itself then answers, as it does when
        the canary had already ended at ``resolve`` (it was a 404 at the moment of a promotion)."""
        try:
            return Held(spec, await copy.enter_async_context(self.manager.use(spec.id, timing=timing, deadline=deadline)))
        except errors.ModelNotFound:
            if not spec.variant_of:
                raise
        log.info("canary %s of %s ended while a request for it was admitted; %s answers it",
                 spec.id, spec.variant_of, spec.variant_of)
        model = self.manager.store.get(spec.variant_of)
        return Held(model, await copy.enter_async_context(self.manager.use(model.id, timing=timing, deadline=deadline)))

    @contextlib.asynccontextmanager
    async def _slot(self, spec: ModelSpec, deadline: float | None, timing: RequestTiming) -> AsyncIterator[None]:
        """One of the model's maxConcurrency slots; the wait for it counts as queue time."""
        clock = self.manager.clock
        started = clock.now()
        async with self.limiter.slot(spec, deadline if deadline is not None else self.manager.deadline(None)):
            timing.queue_s += clock.now() - started
            yield

    async def predict(self, model_id: str, input_data: Any, timeout_s: float | None = None,
                      timing: RequestTiming | None = None, variant: str | None = None) -> Any:
        """Seed ``/predict``: JSON in, JSON predictions out. `timeout_s` bounds the wait for room
        and for a load (default: the manager's request timeout); `variant`: the canary version the
        router chose to answer (``X-Hotset-Variant``)."""
        timing = timing or RequestTiming()
        async with self._request(model_id, variant) as outcome:
            async with self.hold(outcome.spec, timeout_s, timing) as held:
                spec, worker = outcome.admitted(held)
                batcher = self.batchers.for_copy(spec, worker)
                if batcher is not None:
                    return await self._batched(spec, timing, batcher, estimated_rows(input_data),
                                               lambda: worker.rows_for_predict(input_data))
                return await self._run(spec, timing, worker.predict, input_data)

    async def infer(
        self,
        model_name: str,
        version: str | None,
        body: bytes,
        headers: Mapping[str, str],
        decode: Callable[[], codec.InferRequest],
        timeout_s: float | None = None,
        timing: RequestTiming | None = None,
        variant: str | None = None,
    ) -> ForwardedResponse:
        """OIP v2 infer over HTTP: ``infer_tensors`` with the body as it came (a framework that
        forwards OIP itself gets it untouched), its outputs encoded as the request asked."""
        def encode(answer: Inferred) -> ForwardedResponse:
            content, content_headers = codec.encode_response(answer.model_name, answer.model_version, answer.request,
                                                             answer.outputs)
            return ForwardedResponse(status=200, headers=content_headers, body=content)

        return await self.infer_tensors(model_name, version, decode, encode, timeout_s, timing, variant,
                                        forwarded=(body, headers))

    async def infer_tensors(
        self,
        model_name: str,
        version: str | None,
        decode: Callable[[], codec.InferRequest],
        encode: Callable[[Inferred], Answer],
        timeout_s: float | None = None,
        timing: RequestTiming | None = None,
        variant: str | None = None,
        forwarded: tuple[bytes, Mapping[str, str]] | None = None,
        size: int = 0,
    ) -> Answer | ForwardedResponse:
        """OIP v2 infer, whatever the wire format: the one path of HTTP and gRPC requests. `decode`
        the request (before any load, so a bad request never loads a model; on a thread when it
        is large: `size`, or the forwarded body's), hold the model (slot, copy, deadline), infer
        (batched when the copy batches), and `encode` the named outputs in the wire's format (an
        output the request names but the model lacks is its 400, counted as such). `forwarded`: the
        HTTP body and headers, given to a loaded model whose framework forwards OIP itself (triton),
        whose answer then comes back untouched; without it (gRPC) such a model infers on tensors."""
        timing = timing or RequestTiming()
        size = len(forwarded[0]) if forwarded is not None else size
        async with self._request(model_name, None if version else variant) as outcome:
            spec = outcome.spec
            check_version(spec, version)
            loaded = self.manager.loaded_worker(spec.id)
            passes_on = forwarded is not None and loaded is not None and loaded.forwards_infer()
            request = None if passes_on else await _off_loop(size, decode)
            async with self.hold(spec, timeout_s, timing) as held:
                spec, worker = outcome.admitted(held)
                if request is None:
                    assert forwarded is not None
                    answer = await self._forward(spec, worker, *forwarded)
                    if answer is not None:
                        outcome.code = answer.status
                        return answer
                    request = await _off_loop(size, decode)
                batcher = self.batchers.for_copy(spec, worker)
                if batcher is not None:
                    inputs, parameters = request.inputs, request.parameters
                    first = next(iter(inputs.values()), None)
                    outputs = await self._batched(spec, timing, batcher, estimated_rows(first),
                                                  lambda: worker.rows_for_infer(inputs, parameters))
                else:
                    outputs = await self._run(spec, timing, worker.infer, request.inputs, request.parameters)
            inferred = Inferred(spec.variant_of or spec.id, timing.version or spec.version, request, outputs)
            return await _off_loop(_nbytes(outputs), encode, inferred)

    async def metadata(self, model_name: str, version: str | None) -> dict[str, Any]:
        """OIP v2 model metadata. Asking never loads a model (and evicts nothing): a model that is
        not loaded is described from its files (``FrameworkWorker.declared_tensors``), or with
        empty inputs and outputs when they say nothing."""
        spec = self.manager.store.get(model_name)
        check_version(spec, version)
        worker = self.manager.loaded_worker(spec.id)
        if worker is not None:
            inputs, outputs = worker.inputs(), worker.outputs()
        else:
            inputs, outputs = await asyncio.to_thread(self._declared, spec) or ([], [])
        tensors = {"inputs": [tensor_metadata(t) for t in inputs], "outputs": [tensor_metadata(t) for t in outputs]}
        return {"name": spec.id, "versions": [spec.version], "platform": spec.framework.value, **tensors}

    def _declared(self, spec: ModelSpec) -> tuple[list[Any], list[Any]] | None:
        try:
            return engine.worker_class(spec.framework.value).declared_tensors(spec, self.manager.context)
        except Exception as exc:  # noqa: BLE001 - unreadable files are the load's error to report, not metadata's
            log.info("cannot describe %s before loading it: %s", spec.id, exc)
            return None

    async def model_ready(self, model_name: str, version: str | None) -> bool:
        spec = self.manager.store.get(model_name)
        check_version(spec, version)
        worker = self.manager.loaded_worker(spec.id)
        if worker is None:
            return False
        if not await self.backends.serves(spec):
            return False
        return await asyncio.to_thread(worker.is_ready)

    @contextlib.asynccontextmanager
    async def _request(self, model_id: str, variant: str | None = None) -> AsyncIterator[_Outcome]:
        """Resolve the spec (the canary version `variant`, when the router chose it) and record the
        request's code and latency however it ends (a forwarded answer sets its backend's status)."""
        started = time.perf_counter()
        outcome: _Outcome | None = None
        code = 500
        try:
            outcome = _Outcome(self.resolve(model_id, variant))
            yield outcome
            code = outcome.code
        except errors.HotsetError as exc:
            code = exc.status_code
            raise
        except asyncio.CancelledError:  # its client left (slow_clients.py)
            code = errors.ClientClosedRequest.status_code
            raise
        finally:
            self.metrics.request_finished(outcome.spec if outcome else None, code, time.perf_counter() - started)

    def resolve(self, model_id: str, variant: str | None) -> ModelSpec:
        """`model_id`'s spec, or its canary version's when the router chose that (``X-Hotset-Variant``)."""
        spec = self.manager.store.get(model_id)
        if not variant or variant == model_id:
            return spec
        try:
            chosen = self.manager.store.get(variant)
        except errors.ModelNotFound:
            return spec  # the canary just ended (the router's view lags the store): the model answers
        if chosen.variant_of != model_id:
            raise errors.BadInput(f"{wire.VARIANT_HEADER}: {variant!r} is not a version of model {model_id!r}")
        return chosen

    async def _forward(
        self, spec: ModelSpec, worker: FrameworkWorker, body: bytes, headers: Mapping[str, str]
    ) -> ForwardedResponse | None:
        try:
            return await worker.forward_infer(body, headers)
        except errors.HotsetError:
            raise
        except Exception as exc:
            log.exception("forwarding inference on %s failed", spec.id)
            raise errors.HotsetError(f"inference on model {spec.id!r} failed: {type(exc).__name__}: {exc}") from exc

    async def embed(self, spec: ModelSpec, worker: FrameworkWorker, texts: list[str],
                    timing: RequestTiming) -> tuple[list[list[float]], int]:
        """OpenAI embeddings of a held copy: batched with the copy's other requests when it batches."""
        batcher = self.batchers.for_copy(spec, worker)
        if batcher is not None:
            return await self._batched(spec, timing, batcher, len(texts), lambda: worker.rows_for_embed(texts))
        return await self._run(spec, timing, worker.embed, texts)

    async def _batched(self, spec: ModelSpec, timing: RequestTiming, batcher: Any, rows: int,
                       prepare: Callable[[], Rows]) -> Any:
        """One request through its copy's batcher: it shares a forward pass with what is queued."""
        share = BatchTiming()
        try:
            return await batcher.submit(rows, prepare, share)
        except errors.HotsetError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.backends.require(spec)
            log.error("inference on %s failed", spec.id, exc_info=exc)
            raise errors.HotsetError(f"inference on model {spec.id!r} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            timing.batch_s += share.waited_s
            timing.infer_s += share.pass_s

    async def _run(self, spec: ModelSpec, timing: RequestTiming, function: Any, *args: Any) -> Any:
        started = time.perf_counter()
        job = self.inference_threads.submit(function, *args, namespace=spec.namespace)
        inference = asyncio.wrap_future(job)
        try:
            return await asyncio.shield(inference)
        except asyncio.CancelledError:
            if job.cancel():  # its client left while it waited for a thread: it never runs
                raise
            # The caller went away, but the thread still uses the model: keep holding it
            # (in flight) until the thread is done, so no eviction unloads it underneath.
            await asyncio.gather(inference, return_exceptions=True)
            raise
        except errors.HotsetError:
            raise
        except RecursionError:  # an input nested past what the framework could walk: the input's fault
            raise errors.NestedTooDeeply() from None
        except Exception as exc:
            await self.backends.require(spec)  # a backend that went down: 503 naming it
            log.exception("inference on %s failed", spec.id)
            raise errors.HotsetError(f"inference on model {spec.id!r} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            timing.infer_s += time.perf_counter() - started


# Bodies larger than this are decoded and encoded on a thread; smaller ones (most requests) take
# less than the thread hop itself.
OFF_LOOP_BYTES = 64 * 1024


async def _off_loop(size: int, function: Callable[..., Any], *args: Any) -> Any:
    """Run a codec step on a thread when it is large: the event loop keeps answering probes and status polls."""
    if size <= OFF_LOOP_BYTES:
        return function(*args)
    return await asyncio.to_thread(function, *args)


def _nbytes(outputs: Mapping[str, Any]) -> int:
    return sum(int(getattr(array, "nbytes", 0)) for array in outputs.values())


def check_version(spec: ModelSpec, version: str | None) -> None:
    if version not in (None, "", spec.version):
        raise errors.ModelNotFound(f"model {spec.id!r} has no version {version!r}; available: {spec.version!r}")


def tensor_metadata(tensor: Any) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
