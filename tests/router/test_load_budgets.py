"""How long the router lets a worker take over a load: the model's own loadTimeoutSeconds, else
the router's --load-timeout, never more than a request's time left.

Against a real HTTP server on loopback that stands in for a worker's load route (it records the
budget each call carries in ``X-Hotset-Timeout``, the header a real worker waits by).
"""
from __future__ import annotations

from aiohttp import web

from hotset_common.wire import TIMEOUT_HEADER
from hotset_router.upstream import WorkerClient


async def _recording_worker(budgets: list[float]) -> tuple[web.AppRunner, str]:
    async def load(request: web.Request) -> web.Response:
        budgets.append(float(request.headers[TIMEOUT_HEADER]))
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v2/repository/models/{model}/load", load)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def test_the_models_own_load_timeout_replaces_the_routers_both_ways() -> None:
    budgets: list[float] = []
    runner, url = await _recording_worker(budgets)
    client = WorkerClient(load_timeout_s=300.0)
    try:
        await client.load(url, "plain")  # the router's value
        await client.load(url, "huge", load_timeout_s=3600.0)  # longer than the router's
        await client.load(url, "small", load_timeout_s=20.0)  # shorter
        await client.load(url, "huge", timeout_s=45.0, load_timeout_s=3600.0)  # a request's time left still caps it
    finally:
        await client.aclose()
        await runner.cleanup()
    assert budgets == [300.0, 3600.0, 20.0, 45.0]
