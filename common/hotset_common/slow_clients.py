"""Slow, idle and vanished clients, bounded the same way on the router and the worker.

uvicorn reads a request's head and body for as long as the client cares to
send them, keeps a connection that never sends a byte, accepts connections
without limit, and lets a handler run on after its client has gone. Each of
those lets a few cheap clients hold what paying ones need (slowloris): 1,024
connections trickling their bodies held every router request slot, and a
client that hung up kept its slot until the worker answered. So, as Apache's
``mod_reqtimeout`` and nginx's ``client_*_timeout`` do:

- **The head** (request line and headers) must arrive within
  ``head_timeout_s`` of the connection opening or of the previous answer's
  end, and within ``max_head_bytes``: else ``408`` or ``431`` and the
  connection closes. (uvicorn's own keep-alive timeout only starts after an
  answer; a connection that never sends stays open without this.)
- **The body** must arrive within ``body_timeout_s``, extended by one second
  per ``body_min_rate`` bytes received, so a large body on a decent link is
  never cut while a trickle is: else ``408`` and the connection closes. The
  handler is cancelled, so what it held (a request slot, reserved body
  bytes) goes back at once.
- **Connections** past ``max_connections`` are answered ``503`` with
  ``Retry-After`` and closed, before anything is parsed.
- **A client that disconnects** before its answer is complete cancels its
  handler: the router's slot and the worker's queue place go back, and the
  router's call to the worker is closed, which the worker sees in turn.

``GuardedHttp`` is uvicorn's httptools protocol with every bound, as timers
and callbacks on the connection (no task or wait per request); ``ClientGuard``
is the thin ASGI wrapper that tells it which task serves each request and
ends a cut-off request quietly; ``serve_options`` gives both to
``uvicorn.Config``.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
from http import HTTPStatus
from typing import Any, Awaitable, Callable, Mapping

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hotset_common import worker_settings
from hotset_common.http import error_body
from hotset_common.worker_settings import CLIENT_LIMITS, WorkerOption, default_of

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class ClientLimits:
    """How long and how much a client may take before it is cut off. The defaults, flags and
    variables are the worker-settings table's (``worker_settings.CLIENT_LIMITS``)."""

    head_timeout_s: float = default_of(WorkerOption.CLIENT_HEAD_TIMEOUT_S)  # type: ignore[assignment]
    max_head_bytes: int = default_of(WorkerOption.MAX_HEAD_BYTES)  # type: ignore[assignment]
    body_timeout_s: float = default_of(WorkerOption.CLIENT_BODY_TIMEOUT_S)  # type: ignore[assignment]
    # bytes per second that extend the body's deadline by one second
    body_min_rate: int = default_of(WorkerOption.CLIENT_BODY_MIN_RATE)  # type: ignore[assignment]
    max_connections: int = default_of(WorkerOption.MAX_CONNECTIONS)  # type: ignore[assignment]
    grpc_connection_age_s: float = default_of(WorkerOption.GRPC_CONNECTION_AGE_S)  # type: ignore[assignment]

    def body_deadline(self, started: float, received: int) -> float:
        return started + self.body_timeout_s + received / max(1, self.body_min_rate)


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """The client bounds as command-line options of a server that does not take every worker option
    (the router), each defaulting to its environment variable; the worker has them in its table."""
    env = os.environ if env is None else env
    group = parser.add_argument_group("slow and idle clients")
    for member in CLIENT_LIMITS.values():
        worker_settings.add_argument(group, member, env)


def from_arguments(args: argparse.Namespace) -> ClientLimits:
    limits = ClientLimits(**{field: getattr(args, member.value.dest) for field, member in CLIENT_LIMITS.items()})
    if min(limits.head_timeout_s, limits.body_timeout_s, limits.grpc_connection_age_s) <= 0 or min(
            limits.max_head_bytes, limits.max_connections) < 1:
        raise ValueError(f"client limits must be positive: {limits}")
    return limits


def grpc_server_options(limits: ClientLimits) -> dict[str, Any]:
    """The same bounds for a ``grpc.aio.server``: its ``maximum_concurrent_rpcs`` and channel options.

    gRPC multiplexes calls on a connection, so what an HTTP connection is to the connection cap, a
    call is here: past ``max_connections`` calls in progress, gRPC answers RESOURCE_EXHAUSTED
    before reading the message. The head's bounds become the connection's: metadata past
    ``max_head_bytes`` is refused (RESOURCE_EXHAUSTED), and a connection without a call for
    ``head_timeout_s`` is closed (GOAWAY; a client's channel reconnects on its next call). gRPC
    has no deadline for a message to arrive, so a call held open by a message that never ends is
    bounded by the connection's age instead: GOAWAY after ``grpc_connection_age_s``, the calls on
    it cut off as long again later (a call of a well-behaved client starts on a new connection
    meanwhile). Keepalive: the server pings an idle connection every ``body_timeout_s`` and drops
    it when a ping goes ``head_timeout_s`` unanswered (a client that vanished without closing), and
    a client pinging more often than every ``head_timeout_s`` without data is sent away after two
    strikes (gRPC's ping-flood guard, its default interval five minutes, made explicit here)."""
    ms = lambda seconds: max(1, int(seconds * 1000))  # noqa: E731
    return {
        "maximum_concurrent_rpcs": limits.max_connections,
        "options": [
            ("grpc.max_metadata_size", limits.max_head_bytes),
            ("grpc.absolute_max_metadata_size", limits.max_head_bytes),
            ("grpc.max_connection_idle_ms", ms(limits.head_timeout_s)),
            ("grpc.max_connection_age_ms", ms(limits.grpc_connection_age_s)),
            ("grpc.max_connection_age_grace_ms", ms(limits.grpc_connection_age_s)),
            ("grpc.keepalive_time_ms", ms(limits.body_timeout_s)),
            ("grpc.keepalive_timeout_ms", ms(limits.head_timeout_s)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", ms(limits.head_timeout_s)),
            ("grpc.http2.max_ping_strikes", 2),
        ],
    }


def _raw_answer(status: HTTPStatus, message: str, extra: Mapping[str, str] | None = None) -> bytes:
    body = json.dumps(error_body(message)).encode()
    headers = {"content-type": "application/json", "content-length": str(len(body)), "connection": "close",
               **(extra or {})}
    head = f"HTTP/1.1 {status.value} {status.phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode("latin-1") + body


CLIENT = "hotset.client"  # the scope key of a request's `ClientState`


@dataclasses.dataclass(eq=False)
class ClientState:
    """What the protocol and `ClientGuard` share about one request: the task serving it, and why
    the protocol cut it off (None while it has not)."""

    received: int = 0  # body bytes so far
    task: asyncio.Task[Any] | None = None
    cut_off: str | None = None  # "slow": its body missed its deadline; "gone": its client left


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with every bound above: a deadline and a size cap on each
    request's head, a deadline on its body, a cap on open connections, and the request's task
    cancelled when its client leaves. All of it is timers and callbacks on the connection: no task,
    no wait per request. Subclassed per server by `serve_options` (the limits are class state)."""

    limits = ClientLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # raw bytes of a head still arriving
        self._head_seen = 0  # bytes of the head's parts the parser has passed on
        self._head_pending = False
        self._refused = False
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_started = 0.0
        self._client: ClientState | None = None  # the request whose head or body is arriving

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(HTTPStatus.SERVICE_UNAVAILABLE,
                         f"this server holds {self.limits.max_connections} connections, its limit; retry shortly",
                         {"retry-after": "1"})
            return
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        self._stop_body_timer()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self._cut_off(cycle.scope.get(CLIENT), "gone")  # type: ignore[arg-type]
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered and closing: the rest of what it sent is not read
        counted = self._head_pending  # bytes before the head's end are the head's
        super().data_received(data)
        if counted and self._head_pending and not self._refused:
            self._head_bytes += len(data)  # a head still unfinished after this chunk, however it is split
            if self._head_bytes > self.limits.max_head_bytes:
                self._refuse_oversized()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._client = ClientState()
        self.scope[CLIENT] = self._client  # type: ignore[literal-required]

    def on_url(self, url: bytes) -> None:
        self._head_seen += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_seen += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        if self._head_seen > self.limits.max_head_bytes:  # a whole head that came in one chunk
            self._refuse_oversized()
            return
        super().on_headers_complete()
        self._body_started = self.loop.time()
        self._body_timer = self.loop.call_at(self._body_started + self.limits.body_timeout_s, self._body_deadline)

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        if self._client is not None:
            self._client.received += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._stop_body_timer()
        if not self._refused:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self._await_head()  # the next request's head has the same deadline (uvicorn's keep-alive closes idle ones sooner)

    # ----- heads -----------------------------------------------------------

    def _refuse_oversized(self) -> None:
        self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                     f"the request's head passed {self.limits.max_head_bytes} bytes, the limit")

    def _await_head(self) -> None:
        self._stop_head_timer()
        self._head_pending, self._head_bytes, self._head_seen = True, 0, 0
        self._head_timer = self.loop.call_later(self.limits.head_timeout_s, self._head_too_slow)

    def _stop_head_timer(self) -> None:
        self._head_pending = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._head_pending and not self.transport.is_closing():
            self._refuse(HTTPStatus.REQUEST_TIMEOUT,
                         f"the request's head did not arrive within {self.limits.head_timeout_s:g}s")

    # ----- bodies ----------------------------------------------------------

    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_deadline(self) -> None:
        """The body's deadline, as far as it got: later by what arrived since, else cut off."""
        self._body_timer = None
        client = self._client
        received = client.received if client is not None else 0
        deadline = self.limits.body_deadline(self._body_started, received)
        if self.loop.time() < deadline:
            self._body_timer = self.loop.call_at(deadline, self._body_deadline)
            return
        cycle = self.cycle
        message = (f"the request's body did not arrive in time ({received} bytes in "
                   f"{self.loop.time() - self._body_started:.0f}s; allowed {self.limits.body_timeout_s:g}s plus a "
                   f"second per {self.limits.body_min_rate} bytes)")
        answer = cycle is not None and not cycle.response_started  # else the handler's answer has begun
        if answer and cycle is not None:
            cycle.disconnected = True  # its handler's answer, if any, goes nowhere: this one is sent
        self._refuse(HTTPStatus.REQUEST_TIMEOUT, message, write=answer)
        self._cut_off(client, "slow")

    # ----- both ------------------------------------------------------------

    def _cut_off(self, client: ClientState | None, why: str) -> None:
        """Cancel the request's handler: what it holds (a slot, a queue place, a call to a worker)
        goes back now rather than when it would have answered."""
        if client is None or client.cut_off is not None:
            return
        client.cut_off = why
        if client.task is not None and not client.task.done():
            client.task.cancel()

    def _refuse(self, status: HTTPStatus, message: str, extra: Mapping[str, str] | None = None,
                write: bool = True) -> None:
        self._stop_head_timer()
        self._stop_body_timer()
        self._refused = True
        log.info("client %s: %d %s", self.client, status.value, message)
        if not self.transport.is_closing():
            if write:
                self.transport.write(_raw_answer(status, message, extra))
            self.transport.close()


class ClientGuard:
    """ASGI wrapper: tells the protocol which task serves each request, and ends quietly a request
    the protocol cut off (its client left, or its body missed its deadline and got a 408)."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client: ClientState | None = scope.get(CLIENT) if scope["type"] == "http" else None
        if client is None:
            await self.app(scope, receive, send)
            return
        task = client.task = asyncio.current_task()
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if client.cut_off is None or task is None:
                raise  # the server's own cancellation (shutdown): pass it on
            task.uncancel()


def serve_options(app: App, limits: ClientLimits) -> dict[str, Any]:
    """What ``uvicorn.Config``/``uvicorn.run`` take to serve `app` under `limits`."""
    protocol = type("GuardedHttpServer", (GuardedHttp,), {"limits": limits})
    return {"app": ClientGuard(app), "http": protocol}
