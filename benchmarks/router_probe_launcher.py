#!/usr/bin/env python3
"""Runs a tree's ``hotset-router`` (whichever ``hotset_router`` is first on PYTHONPATH) with an event-loop probe.

The probe is a task on the router's own event loop that asks to wake every
``--probe-ms`` and records how late it woke: what any request arriving then
waited (``late``). On a machine shared with other work a process also waits
for a core; so each sample also says how much of the lateness the loop's
own thread spent running (``own``: the lesser of the lateness and the
thread's CPU time meanwhile), which is what the router's own work (a
control-loop pass, a report being applied) held the loop.
``GET /_probe/lag`` answers the samples since the last call and starts
afresh. Everything else is the router's own app and main(), so the same
launcher measures this tree and an older one (benchmarks/router_scale_models.py).

    PYTHONPATH=<tree>/common:<tree>/router python router_probe_launcher.py [--probe-ms 10] -- <hotset-router args>
"""
from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Any

import uvicorn

from hotset_common import quantity
from hotset_router import main as router_main
from hotset_router.api import create_app
from hotset_router.flood import Limits
from hotset_router.service import RouterService


class WithLagProbe:
    def __init__(self, app: Any, period_s: float) -> None:
        self.app = app
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []  # (seconds late, of which the loop's own work)
        self._task: asyncio.Task[None] | None = None

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked, cpu = loop.time(), time.thread_time()
            await asyncio.sleep(self.period_s)
            late = max(0.0, loop.time() - asked - self.period_s)
            self.samples.append((late, min(late, time.thread_time() - cpu)))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._probe())
        if scope["type"] == "http" and scope["path"] == "/_probe/lag":
            samples, self.samples = self.samples, []
            body = json.dumps({"late": [late for late, _ in samples], "own": [own for _, own in samples]}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def main() -> None:
    argv = sys.argv[1:]
    period_ms = 10.0
    if argv[:1] == ["--probe-ms"]:
        period_ms, argv = float(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    args = router_main.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = RouterService(router_main.build_discovery(args), router_main.build_settings(args))
    limits = Limits(max_requests=args.max_requests,
                    max_body_bytes_in_flight=quantity.parse_bytes(args.max_body_bytes_in_flight),
                    max_cold_waiters=args.max_cold_waiters)
    app = create_app(service, args.admin_token, quantity.parse_bytes(args.max_body_bytes), limits)
    uvicorn.run(WithLagProbe(app, period_ms / 1000), host=args.host, port=args.port, log_level=args.log_level.lower(),
                access_log=False)


if __name__ == "__main__":
    main()
