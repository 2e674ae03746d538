"""The worker's OpenAI-compatible routes: ``/v1/models``, completions, chat completions, embeddings.

Each request holds its model through the data plane's one admission path
(``DataPlane.hold``: the model's maxConcurrency slot, its timeoutSeconds
cap, the admission queue, a cold load, the in-flight count) like every other
protocol's request, for as long as its answer lasts, streams included. A
LoRA adapter holds its base model first, so the engine it runs in cannot be
evicted under it. A client that goes away stops its work: a stream at its
next event, a whole answer (a generation, an embedding, an engine's
request) at once, recorded as 499. Then, by framework:

- an engine that speaks the OpenAI API itself (vLLM: ``open_openai``) gets
  the body untouched and its answer goes back as it arrives, event by event;
- an in-process model generates on a thread (``FrameworkWorker.generate``)
  and each token leaves as a server-sent event the moment it is decoded; a
  prompt the model cannot take is refused (400) before the stream starts.

Errors are OpenAI's shape (``openai_wire.error_body``), so the official
clients raise their typed exceptions. Token figures go to the worker's
metrics (token_meter.py), request counts and seconds to the usual series.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import anyio
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from hotset_common import errors, http, openai_wire, wire
from hotset_common.openai_wire import OpenAIError
from hotset_common.spec import ModelSpec, Task
from hotset_worker.dataplane import OFF_LOOP_BYTES, DataPlane
from hotset_worker.frameworks.base import FrameworkWorker, StreamedResponse
from hotset_worker.generation import GenerationRequest, GenerationResult
from hotset_worker.manager import RequestTiming
from hotset_worker.metrics import WorkerMetrics
from hotset_worker.token_meter import EventCounter, TokenMeter, usage_of

log = logging.getLogger(__name__)

OPENAI_TASKS = (Task.TEXT_GENERATION, Task.EMBEDDING)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions (chat: what the context leaves)
# Headers an SSE answer carries so that proxies pass each event on at once.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

TimeoutOf = Callable[[Request], "float | None"]
T = TypeVar("T")


def install(app: FastAPI, dataplane: DataPlane, metrics: WorkerMetrics, *, max_body_bytes: int,
            timeout_of: TimeoutOf) -> None:
    """Add the OpenAI routes to the worker's app."""
    routes = OpenAIRoutes(dataplane, metrics, max_body_bytes, timeout_of)

    @app.get(openai_wire.MODELS)
    async def list_models() -> dict[str, Any]:
        return routes.models()

    @app.post(openai_wire.COMPLETIONS)
    async def completions(request: Request) -> Response:
        return await routes.serve(request, openai_wire.COMPLETIONS)

    @app.post(openai_wire.CHAT_COMPLETIONS)
    async def chat_completions(request: Request) -> Response:
        return await routes.serve(request, openai_wire.CHAT_COMPLETIONS)

    @app.post(openai_wire.EMBEDDINGS)
    async def embeddings(request: Request) -> Response:
        return await routes.serve(request, openai_wire.EMBEDDINGS)


def error_response(exc: errors.HotsetError) -> JSONResponse:
    status, body = openai_wire.body_of_error(exc)
    return JSONResponse(body, status_code=status, headers=exc.headers)


class _Request:
    """One OpenAI request's bookkeeping: its model, what it holds, its metrics, however it ends."""

    def __init__(self, routes: "OpenAIRoutes", spec: ModelSpec, arrived: float) -> None:
        self.routes = routes
        self.spec = spec
        self.arrived = arrived
        self.meter = TokenMeter(arrived)
        self.exact_tokens: int | None = None
        self.timing = RequestTiming()
        self.held = contextlib.AsyncExitStack()
        self.code = 500
        self.metered = False
        self.finished = False

    async def hold(self, timeout_s: float | None) -> FrameworkWorker:
        """Admit the request (``DataPlane.hold``: slot, deadline, get-or-load, in flight), first
        holding an adapter's base within the same deadline, and keep both until ``finish``."""
        dataplane = self.routes.dataplane
        if self.spec.base_model:
            deadline = dataplane.deadline_of(self.spec, timeout_s)
            await self.held.enter_async_context(
                dataplane.manager.use(self.spec.base_model, timing=self.timing, deadline=deadline))
        held = await self.held.enter_async_context(dataplane.hold(self.spec, timeout_s, self.timing))
        self.spec = held.spec  # the model's own when the canary it chose ended meanwhile
        return held.worker

    async def hold_again(self, timeout_s: float | None) -> FrameworkWorker:
        """Let go of what ``hold`` took and hold the model anew, within what is left of the
        request's budget: its copy was lost under it (errors.EngineLost), and the manager drops a
        lost copy and waits for a new one."""
        await self.held.aclose()
        self.held = contextlib.AsyncExitStack()
        budget = self.routes.manager.request_timeout_s if timeout_s is None else timeout_s
        return await self.hold(max(0.0, budget - (time.perf_counter() - self.arrived)))

    def count_tokens(self) -> None:
        self.metered = True

    def answer_headers(self) -> dict[str, str]:
        """Where the time went, and which version computed the answer (a canary's, when it did)."""
        return {"Server-Timing": self.timing.header(), wire.VERSION_HEADER: self.spec.version}

    async def finish(self) -> None:
        """Release the model and record the request (once), even when the client went away mid-stream."""
        if self.finished:
            return
        self.finished = True
        with anyio.CancelScope(shield=True):
            await self.held.aclose()
        routes = self.routes
        routes.metrics.request_finished(self.spec, self.code, time.perf_counter() - self.arrived)
        if self.metered:
            routes.metrics.tokens_finished(self.spec, self.meter.figures(self.exact_tokens))


class _Relay:
    """The TokenSink of one in-process generation: its thread's output, handed to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, meter: TokenMeter) -> None:
        self._loop = loop
        self._meter = meter
        self._cancelled = threading.Event()
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def put(self, kind: str, value: Any) -> None:
        self._loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))

    def started(self, prompt_tokens: int) -> None:
        self._meter.prompt_tokens = prompt_tokens
        self.put("started", prompt_tokens)

    def text(self, delta: str) -> None:
        self.put("text", delta)

    def tokens(self, count: int) -> None:
        self._meter.tokens(count)

    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()


class OpenAIRoutes:
    def __init__(self, dataplane: DataPlane, metrics: WorkerMetrics, max_body_bytes: int, timeout_of: TimeoutOf) -> None:
        self.dataplane = dataplane
        self.embed = dataplane.embed  # batched with the copy's other requests
        self.manager = dataplane.manager
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.timeout_of = timeout_of

    def models(self) -> dict[str, Any]:
        """The generative and embedding models this worker can serve (adapters name their base)."""
        cards = [openai_wire.model_card(spec.id, parent=spec.base_model or None)
                 for spec in self.manager.store.list() if spec.task in OPENAI_TASKS]
        return {"object": "list", "data": cards}

    async def serve(self, request: Request, route: str) -> Response:
        arrived = time.perf_counter()
        state: _Request | None = None
        try:
            raw = await http.read_body_limited(request, self.max_body_bytes)
            # The canary version the router chose for this request, when it chose one.
            spec = self.dataplane.resolve(openai_wire.peek(raw).model, request.headers.get(wire.VARIANT_HEADER))
            self.dataplane.note_share_weight(request.headers.get(wire.SHARE_WEIGHT_HEADER))
            state = _Request(self, spec, arrived)
            check_task(spec, route)
            return await unless_the_client_leaves(request, self._answer(state, route, raw, request))
        except errors.HotsetError as exc:
            if state is not None:
                state.code = openai_wire.body_of_error(exc)[0]
                await state.finish()
            else:
                self.metrics.request_finished(None, openai_wire.body_of_error(exc)[0], time.perf_counter() - arrived)
            return error_response(exc)
        except asyncio.CancelledError:  # its client left (slow_clients.py): recorded as 499
            if state is not None:
                state.code = errors.ClientClosedRequest.status_code
                await state.finish()
            raise
        except Exception as exc:
            log.exception("OpenAI request on %s failed", route)
            if state is not None:
                await state.finish()
            return error_response(errors.HotsetError(f"internal error: {type(exc).__name__}: {exc}"))

    async def _answer(self, state: _Request, route: str, raw: bytes, request: Request) -> Response:
        timeout_s = self.timeout_of(request)
        worker = await state.hold(timeout_s)
        if worker.forwards_openai():
            try:
                return await self._forward(state, worker, route, raw, request)
            except errors.EngineLost as lost:  # it died since the copy was last checked: wait for a new one
                log.warning("%s; %s waits for a new engine", lost, route)
                return await self._forward(state, await state.hold_again(timeout_s), route, raw, request)
        if route == openai_wire.EMBEDDINGS:
            return await self._embed(state, worker, raw)
        return await self._generate(state, worker, route, raw)

    # ----- an engine that answers OpenAI requests itself -----------------------------------

    async def _forward(self, state: _Request, worker: FrameworkWorker, route: str, raw: bytes,
                       request: Request) -> Response:
        answer = await worker.open_openai(route, raw, request.headers)
        assert answer is not None
        state.code = answer.status
        media = answer.headers.get("content-type", "application/json")
        if answer.status >= 400 or not media.startswith(openai_wire.EVENT_STREAM):
            try:
                body = b"".join([chunk async for chunk in answer.chunks])
            finally:
                await answer.close()
            if answer.status == 200 and (usage := usage_of(body)) is not None:
                state.meter.prompt_tokens, state.exact_tokens = usage
                state.count_tokens()
            await state.finish()
            return Response(body, status_code=answer.status, media_type=media,
                            headers=state.answer_headers())
        state.count_tokens()
        return StreamingResponse(self._pass_events(state, answer), media_type=media,
                                 headers={**STREAM_HEADERS, **state.answer_headers()})

    async def _pass_events(self, state: _Request, answer: StreamedResponse) -> AsyncIterator[bytes]:
        counter = EventCounter(state.meter)
        try:
            async for chunk in answer.chunks:
                counter.feed(chunk)
                yield chunk
            state.exact_tokens = counter.exact_output_tokens()
        finally:
            with anyio.CancelScope(shield=True):
                await answer.close()
            await state.finish()

    # ----- embeddings in this process ------------------------------------------------------

    async def _embed(self, state: _Request, worker: FrameworkWorker, raw: bytes) -> Response:
        body: openai_wire.EmbeddingRequest = await parse_request(openai_wire.EmbeddingRequest, raw)
        if body.dimensions is not None:
            raise OpenAIError("dimensions: this model's embeddings have a fixed size", param="dimensions")
        vectors, prompt_tokens = await self.embed(state.spec, worker, body.texts(), state.timing)
        state.meter.prompt_tokens = prompt_tokens
        state.count_tokens()
        state.code = 200
        await state.finish()
        return JSONResponse(openai_wire.embeddings(state.spec.id, vectors, body.encoding_format, prompt_tokens),
                            headers=state.answer_headers())

    # ----- generation in this process ------------------------------------------------------

    async def _generate(self, state: _Request, worker: FrameworkWorker, route: str, raw: bytes) -> Response:
        chat = route == openai_wire.CHAT_COMPLETIONS
        body = await parse_request(openai_wire.ChatCompletionRequest if chat else openai_wire.CompletionRequest, raw)
        generation = generation_request(body, chat)
        relay = _Relay(asyncio.get_running_loop(), state.meter)
        thread = asyncio.ensure_future(asyncio.to_thread(_run_generation, worker, generation, relay))
        try:
            kind, value = await relay.queue.get()  # "started", or the prompt's refusal
            if kind == "error":
                raise value
        except BaseException:
            relay.cancel()
            await asyncio.gather(thread, return_exceptions=True)
            raise
        state.count_tokens()
        answer = _Answer(state, relay, thread, chat, body, prompt_tokens=value)
        if body.stream:
            return StreamingResponse(answer.events(), media_type=openai_wire.EVENT_STREAM,
                                     headers={**STREAM_HEADERS, **state.answer_headers()})
        return await answer.whole()


async def parse_request(model: type[T], raw: bytes) -> T:
    """`raw` as `model` (a 400 naming the first bad field), off the event loop when the body is large:
    building and checking a body of megabytes takes tenths of a second, and the loop carries every
    other request and the status polls."""
    if len(raw) <= OFF_LOOP_BYTES:
        return openai_wire.parse(model, raw)
    return await asyncio.to_thread(openai_wire.parse, model, raw)


async def unless_the_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, unless the client goes away first: then `work` is cancelled (a generation
    stops at its next token, an engine's request is closed, the model is released) and the
    request ends as 499. A stream's answer is handed on once it starts; its own disconnect watch
    (Starlette's) takes over from there."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the request itself was cancelled (its client left: slow_clients.py)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # it lets go of its model before the request ends
        raise
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise errors.ClientClosedRequest("the client went away before its answer was ready")


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (its body was read whole before)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def check_task(spec: ModelSpec, route: str) -> None:
    """A 400 naming the mismatch when the model's task does not fit the route."""
    wanted = Task.EMBEDDING if route == openai_wire.EMBEDDINGS else Task.TEXT_GENERATION
    if spec.task != wanted:
        raise OpenAIError(f"model {spec.id!r} is a {spec.task.value} model; {route} needs a {wanted.value} model",
                          param="model")


def generation_request(body: Any, chat: bool) -> GenerationRequest:
    """The worker's request from an OpenAI body; a 400 naming options the in-process generator lacks."""
    if body.n != 1:
        raise OpenAIError("n: this model generates one choice per request", param="n")
    for unsupported in ("logprobs", "top_logprobs", "tools", "functions", "best_of"):
        value = (body.model_extra or {}).get(unsupported)
        if value not in (None, False, [], 0, 1):
            raise OpenAIError(f"{unsupported}: not supported by this model's engine", param=unsupported)
    if not chat and body.echo:
        raise OpenAIError("echo: not supported by this model's engine", param="echo")
    common = dict(min_tokens=body.min_tokens, temperature=1.0 if body.temperature is None else body.temperature,
                  top_p=1.0 if body.top_p is None else body.top_p, seed=body.seed, stop=body.stop_strings())
    if chat:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        return GenerationRequest(messages=messages, max_tokens=body.token_limit(), **common)
    return GenerationRequest(prompt=body.prompt_text(), max_tokens=body.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS,
                             **common)


def _run_generation(worker: FrameworkWorker, request: GenerationRequest, relay: _Relay) -> None:
    """The generation thread: the result or the error ends the relay's queue."""
    try:
        relay.put("done", worker.generate(request, relay))
    except BaseException as exc:  # noqa: BLE001 - every outcome must reach the event loop
        relay.put("error", exc)


class _Answer:
    """One in-process generation's output as OpenAI answers: a stream of events, or one body."""

    def __init__(self, state: _Request, relay: _Relay, thread: asyncio.Future, chat: bool, body: Any,
                 prompt_tokens: int) -> None:
        self.state = state
        self.relay = relay
        self.thread = thread
        self.chat = chat
        self.body = body
        self.prompt_tokens = prompt_tokens
        self.id = openai_wire.new_id("chatcmpl" if chat else "cmpl")
        self.model = state.spec.variant_of or state.spec.id  # a canary answers as the model asked for
        self.started = time.perf_counter()

    def _chunk(self, text: str | None, finish_reason: str | None = None) -> bytes:
        if self.chat:
            delta = {} if text is None else {"content": text}
            return openai_wire.event(openai_wire.chat_chunk(self.id, self.model, delta, finish_reason))
        return openai_wire.event(openai_wire.completion_chunk(self.id, self.model, text or "", finish_reason))

    async def _next(self) -> tuple[str, Any]:
        kind, value = await self.relay.queue.get()
        if kind == "error":
            raise value
        return kind, value

    async def events(self) -> AsyncIterator[bytes]:
        try:
            if self.chat:
                yield openai_wire.event(openai_wire.chat_chunk(self.id, self.model, {"role": "assistant", "content": ""}))
            while True:
                try:
                    kind, value = await self._next()
                except Exception as exc:  # the stream has started: the error is its last event
                    if not isinstance(exc, errors.HotsetError):
                        log.error("generation on %s failed", self.model, exc_info=exc)
                        exc = errors.HotsetError(f"generation on model {self.model!r} failed: {type(exc).__name__}: {exc}")
                    self.state.code, payload = openai_wire.body_of_error(exc)
                    yield openai_wire.event(payload)
                    break
                if kind == "text":
                    yield self._chunk(value)
                    continue
                result: GenerationResult = value
                yield self._chunk(None, result.finish_reason)
                if self.body.include_usage():
                    kind_name = "chat.completion.chunk" if self.chat else "text_completion"
                    yield openai_wire.event(openai_wire.usage_chunk(self.id, self.model, kind_name, result.prompt_tokens,
                                                                     result.completion_tokens))
                yield openai_wire.DONE_EVENT
                self.state.code = 200
                break
        finally:
            await self._close()

    async def whole(self) -> Response:
        parts: list[str] = []
        try:
            while True:
                kind, value = await self._next()
                if kind == "text":
                    parts.append(value)
                    continue
                result: GenerationResult = value
                build = openai_wire.chat_completion if self.chat else openai_wire.completion
                self.state.code = 200
                self.state.timing.infer_s = time.perf_counter() - self.started
                return Response(json.dumps(build(self.id, self.model, "".join(parts), result.finish_reason,
                                                 result.prompt_tokens, result.completion_tokens)),
                                media_type="application/json",
                                headers=self.state.answer_headers())
        finally:
            await self._close()

    async def _close(self) -> None:
        """Stop generating (the client may be gone), wait for the thread, then release the model."""
        self.relay.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(self.thread, return_exceptions=True)
        await self.state.finish()
