"""The catalog feed: worker pods follow their pool's catalog over HTTP from the operator.

``GET /v1/catalogs/<namespace>/<store>?since=<epoch>.<revision>&wait=<s>``
(hotset_common.model_store.CatalogUpdate): without a cursor, or with one from
another operator process or older than the changes kept, the complete catalog;
otherwise what changed after that revision, the request held open up to
`wait` seconds until something does. With worker identity on, a pool's
catalog answers only that pool's own pods, each presenting its catalog token
(``Readers``: worker_proofs.CatalogReaders; docs/security.md); until the
operator has judged every model once after it started, the feed answers 503
with Retry-After, so a restarted operator never hands a pod an incomplete
catalog to replace its own with.

aiohttp, which kopf itself runs on, serves it on kopf's event loop: a long
poll is a parked coroutine, so a thousand pods following cost no thread each.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Callable, Protocol

from aiohttp import web

from hotset_common import model_store
from hotset_operator.catalog import Answer, Catalogs

log = logging.getLogger(__name__)
MAX_WAIT_S = 60.0
BATCH_S = 0.05  # after a change wakes a reader, what else changed meanwhile goes in the same answer


def _encode(epoch: str, answer: Answer) -> bytes:
    """A CatalogUpdate's JSON from entries encoded once, when their model changed."""
    head = (f'{{"epoch":{json.dumps(epoch)},"revision":{answer.revision},'
            f'"complete":{"true" if answer.complete else "false"},"models":[').encode()
    return head + b",".join(answer.entries) + b'],"removed":' + json.dumps(list(answer.removed)).encode() + b"}"


def _cursor(text: str, epoch: str) -> int | None:
    """The revision of a cursor from this operator process; None: send everything."""
    cursor_epoch, _, revision = text.partition(".")
    if cursor_epoch != epoch or not revision.isdigit():
        return None
    return int(revision)


def _wait_s(text: str) -> float:
    try:
        return min(max(float(text or 0), 0.0), MAX_WAIT_S)
    except ValueError:
        return 0.0


class Readers(Protocol):
    async def refusal(self, authorization: str, namespace: str, store: str) -> tuple[int, str] | None:
        """None: the request (its Authorization header) may read catalog `store` of `namespace`;
        else the status and message of its refusal."""


def build_app(catalogs: Catalogs, ready: Callable[[], bool], readers: Readers | None = None) -> web.Application:
    """The feed's routes over `catalogs`; `ready()`: every model has been judged once; `readers`:
    who may read which catalog (None: anyone, as on a local stack)."""

    async def catalog(request: web.Request) -> web.Response:
        store = (request.match_info["namespace"], request.match_info["store"])
        if readers is not None:
            refused = await readers.refusal(request.headers.get("Authorization", ""), *store)
            if refused is not None:
                status, message = refused
                headers = {"WWW-Authenticate": "Bearer"} if status == 401 else \
                    {"Retry-After": "5"} if status == 503 else {}
                return web.json_response({"error": message}, status=status, headers=headers)
        if not ready():
            return web.json_response({"error": "the operator is still reading its models"}, status=503,
                                     headers={"Retry-After": "1"})
        since = _cursor(request.query.get(model_store.CURSOR_PARAM, ""), catalogs.epoch)
        wait_s = _wait_s(request.query.get(model_store.WAIT_PARAM, ""))
        current = catalogs.get(store)
        if since is not None and since == current.revision and wait_s > 0:
            await current.changed_after(since, wait_s)
            if current.revision > since:
                await asyncio.sleep(BATCH_S)
        body = _encode(catalogs.epoch, current.read(since))
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get(model_store.FEED_PATH + "/{namespace}/{store:.+}", catalog)
    return app


class FeedServer:
    """The feed on `host`:`port` (0: a free port), started and stopped with the operator."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        self.host = host
        self.port = port

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self._runner.addresses:
            self.port = self._runner.addresses[0][1]
        log.info("catalog feed on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        await self._runner.cleanup()
