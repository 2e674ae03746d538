"""Models addressed by namespace: ``/namespaces/<namespace>/<any route>`` is that route, for that namespace.

``/namespaces/team-a/v2/models/m/infer``, ``/namespaces/team-a/predict`` and
``/namespaces/team-a/v1/chat/completions`` are the routes without the prefix,
with ``x-hotset-namespace: team-a`` (``wire.NAMESPACE_HEADER``) added: the
header is the one form the rest of the router reads (gRPC callers send it as
metadata). A model of another namespace is not found there (callers.py);
listings show that namespace's models only. Bare paths keep working, for the
local stack and single-namespace installs.
"""
from __future__ import annotations

import json
import re
from typing import Any, Awaitable, Callable

from hotset_common import errors, http, wire

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PREFIX = "/namespaces/"
# A namespace is a DNS label (what Kubernetes accepts); the route follows.
NAMESPACED = re.compile(r"^/namespaces/(?P<namespace>[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)(?P<route>/.*)$")
_HEADER = wire.NAMESPACE_HEADER.encode("latin-1")


class NamespacedPaths:
    """Strips the namespace prefix off the path (and the raw path) and names the namespace in the header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        match = NAMESPACED.match(scope["path"])
        if match is None:
            await self._refuse(send, errors.ModelNotFound(
                f"{errors.excerpt(scope['path'], 80)} is not a route: use /namespaces/<namespace>/<route>, "
                "the namespace a Kubernetes name"))
            return
        namespace, route = match.group("namespace"), match.group("route")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != _HEADER]
        named = [v.decode("latin-1") for k, v in scope["headers"] if k.lower() == _HEADER]
        if any(value != namespace for value in named):
            await self._refuse(send, errors.BadInput(
                f"the path names namespace {namespace!r} and the {wire.NAMESPACE_HEADER} header "
                f"{errors.excerpt(named[0])}: name one"))
            return
        raw = scope.get("raw_path") or scope["path"].encode("latin-1")
        raw_route = raw[len(PREFIX) + len(namespace):] if raw.startswith(PREFIX.encode() + namespace.encode()) else \
            route.encode("latin-1")
        await self.app({**scope, "path": route, "raw_path": raw_route,
                        "headers": [*headers, (_HEADER, namespace.encode("latin-1"))]}, receive, send)

    @staticmethod
    async def _refuse(send: Send, exc: errors.HotsetError) -> None:
        body = json.dumps(http.error_body(exc.message)).encode()
        await send({"type": "http.response.start", "status": exc.status_code,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
