"""The OpenAI-compatible routes of the gateway, as plain ASGI: answers pass through as they arrive.

``POST /v1/completions``, ``/v1/chat/completions`` and ``/v1/embeddings``
are routed by the body's ``model`` like every other request (ready copy,
else the copy loading it, else a placement whose pod loads it for this
request), with the prompt's prefix steering the choice among ready copies
(prefix_routing.py). The worker's answer is never read whole: each chunk of
a server-sent event stream is sent on the moment it arrives (no buffering,
no re-framing), and a client that goes away closes the worker's connection,
so generation stops there too. ``GET /v1/models`` lists the generative and
embedding models the workers' catalogs name. Errors are OpenAI's shape.
Everything else goes to the next app (inference_asgi, then FastAPI).
"""
from __future__ import annotations

import asyncio
import functools
import json
from typing import Any, Awaitable, Mapping

from hotset_common import errors, openai_wire
from hotset_common.spec import Task
from hotset_router.flood import FloodGuard
from hotset_router.inference_asgi import ASGIApp, Receive, Scope, Send, metric_label
from hotset_router.request_record import RequestRecord
from hotset_router.service import RouterService
from hotset_router.upstream import PASSED_RESPONSE_HEADERS, UpstreamStream

OPENAI_TASKS = (Task.TEXT_GENERATION.value, Task.EMBEDDING.value)
# Said on every event stream, so that proxies in front of the router do not hold events back.
STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _raw_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def respond_json(send: Send, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
    body = json.dumps(payload).encode()
    raw = _raw_headers({"content-type": "application/json", **(headers or {})})
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the request body was read before)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class OpenAIRoutes:
    """Serves the OpenAI routes itself and hands every other request to `app`."""

    def __init__(self, app: ASGIApp, service: RouterService, guard: FloodGuard) -> None:
        self.app = app
        self.service = service
        self.router = service.router
        self.metrics = service.metrics
        self.guard = guard
        self.label = functools.partial(metric_label, self.router)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if scope["method"] == "POST" and path in openai_wire.INFERENCE_ROUTES:
                await self.serve(scope, receive, send)
                return
            if scope["method"] == "GET" and path == openai_wire.MODELS:
                await self.list_models(scope, send)
                return
        await self.app(scope, receive, send)

    async def list_models(self, scope: Scope, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            payload = await self.models(headers)
        except errors.HotsetError as exc:
            code, error = openai_wire.body_of_error(exc)
            await respond_json(send, code, error, exc.headers)
            return
        await respond_json(send, 200, payload)

    async def models(self, headers: Mapping[str, str]) -> dict[str, Any]:
        """Every generative or embedding model some worker can serve and this request may see
        (callers.py); adapters name their base."""
        entries = [entry for entry in self.service.sync.catalog.entries() if entry["type"] in OPENAI_TASKS]
        shown = set(await self.service.callers.visible(headers, [entry["id"] for entry in entries]))
        cards = [openai_wire.model_card(entry["id"], parent=entry["base_model"] or None)
                 for entry in entries if entry["id"] in shown]
        return {"object": "list", "data": sorted(cards, key=lambda card: card["id"])}

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        gone: asyncio.Future | None = None
        with RequestRecord(self.guard, self.metrics, self.label) as record:  # a stream counts until it ends
            try:
                try:
                    record.ticket = ticket = self.guard.admit(headers)
                    body = await self.guard.read_body(ticket, receive, headers)
                    request = openai_wire.peek(body)
                    model = record.model = request.model
                    base = self.service.sync.catalog.base_of(model)
                    gone = asyncio.ensure_future(wait_for_disconnect(receive))
                    answer = await self._open(gone, self.router.open_stream(model, "POST", scope["path"], body,
                                                                             headers, prefix=request.prefix, base=base,
                                                                             on_admitted=lambda: self.guard.for_model(ticket, model)))
                    self.guard.done_waiting(ticket)
                except errors.HotsetError as exc:
                    record.code, payload = openai_wire.body_of_error(exc)
                    await respond_json(send, record.code, payload, exc.headers)
                    return
                record.code = answer.status_code
                try:
                    await self._pass_on(answer, gone, send)
                finally:
                    answer.close()
            finally:
                if gone is not None:
                    gone.cancel()

    @staticmethod
    async def _open(gone: asyncio.Future, opening: Awaitable[UpstreamStream]) -> UpstreamStream:
        """The worker's answer as it starts, unless the client leaves first (a whole answer starts only
        when it is done): then the call is cancelled, which closes the worker's connection, and the
        worker stops generating."""
        task = asyncio.ensure_future(opening)
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the request itself was cancelled (its client left: slow_clients.py)
            task.cancel()
            results = await asyncio.gather(task, return_exceptions=True)
            if isinstance(results[0], UpstreamStream):
                results[0].close()
            raise
        if task.done():
            return task.result()
        task.cancel()
        results = await asyncio.gather(task, return_exceptions=True)
        if isinstance(results[0], UpstreamStream):
            results[0].close()
        raise errors.ClientClosedRequest("the client went away before its answer started")

    async def _pass_on(self, answer: UpstreamStream, gone: asyncio.Future, send: Send) -> None:
        """The worker's status and headers, then each chunk as it arrives, until either side ends
        (`gone`: the client left)."""
        passed = {k.lower(): v for k, v in answer.headers.items() if k.lower() in PASSED_RESPONSE_HEADERS}
        if passed.get("content-type", "").startswith(openai_wire.EVENT_STREAM):
            passed.update(STREAM_HEADERS)
        await send({"type": "http.response.start", "status": answer.status_code, "headers": _raw_headers(passed)})
        if gone.done():
            return
        gone.add_done_callback(lambda _: answer.close())  # drops the worker's connection: it stops generating
        async for chunk in answer.chunks():
            if gone.done():
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
