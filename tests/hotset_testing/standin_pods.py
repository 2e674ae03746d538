#!/usr/bin/env python3
"""Stand-in worker pods for router benchmarks: many labelled pods in one process, on loopback ports.

A STAND-IN, not a worker: it runs no model. What the router under test sees
is the worker's API: ``GET /status`` built by the worker's own report
builder (``hotset_worker.status_report``: whole reports, pages and deltas
from a cursor, the routers list), ``POST /predict`` and ``POST
/v2/models/{name}/infer`` answered at once (each request counts on its copy
as a worker counts it: last use, decayed request count, in flight), load
and unload, and the health probes. Pods are named ``standin-<n>``. One
process and one event loop serve every pod (aiohttp: little CPU per
request), so 50 pods cost one process on a shared machine.

Layout: every pod's catalog lists every model (one shared pool); model
``m-<j>`` has a copy on pod ``j % pods`` while that pod holds fewer than
``copies_per_pod`` (so 50 pods x 200 copies hold 10,000 models once each).

A whole report without a cursor (what a router before delta reports asks
for) is assembled from a catalog serialised once, so the stand-in's own
CPU stays small however often it is asked.

    python tests/hotset_testing/standin_pods.py --pods 50 --models 10000 --copies-per-pod 200 --ready-file F

With ``--first-ip 127.0.70.1 --port P`` pod n listens on its own loopback
address (127.0.70.1 + n) and the one port P, as pods of a pool do (the
operator asks every pod at ``http://<pod IP>:<worker port>``);
``--name-format 'm-{:05d}'`` names the models as the caller's ServedModels.
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from hotset_common import errors, wire
from hotset_common.spec import LatencyClass
from hotset_common.eviction import DEFAULT_HALF_LIFE_S, DecayedCount, EvictionPolicy
from hotset_worker import status_report
from hotset_worker.changes import ChangeFeed

MiB = 2**20


class _Head(msgspec.Struct):
    model_id: str


@dataclass
class _Spec:
    """What the report builder reads of a model spec (status_report.catalog_entry)."""

    id: str
    memory_bytes: int
    framework: Any = None
    task: Any = None
    name: str = ""
    version: str = "1"
    description: str = ""
    base_model: str = ""
    pinned: bool = False
    latency_class: LatencyClass = LatencyClass.STANDARD
    load_timeout_seconds: float | None = None
    priority: int = 0

    def canary_variant(self) -> None:
        return None


@dataclass
class _Enum:
    value: str


@dataclass
class _View:
    """What the report builder reads of a copy (manager.CopyView's fields)."""

    model_id: str
    framework: str
    state: wire.CopyState
    bytes: int
    pinned: bool
    inflight: int
    last_used_s: float
    loaded_at_s: float
    load_seconds: float = 0.05
    frequency: float = 0.0
    queued: int = 0
    version: str = "1"
    reason: str = ""
    priority: int = 0


class _Store:
    def __init__(self, specs: list[_Spec]) -> None:
        self._specs = specs
        self.generation = 1

    def list(self) -> list[_Spec]:
        return self._specs


@dataclass
class _Copy:
    loaded_at: float
    last_used: float
    inflight: int = 0


@dataclass
class StandinPod:
    """One stand-in pod: its copies, counted as a worker counts them, and its report builder."""

    name: str
    store: _Store
    specs: dict[str, _Spec]
    budget: int
    clock: Any = time.monotonic
    entries: dict[str, wire.CatalogEntry] = field(default_factory=dict)  # shared by every pod
    changes: ChangeFeed = field(default_factory=ChangeFeed)
    copies: dict[str, _Copy] = field(default_factory=dict)
    demand: dict[str, DecayedCount] = field(default_factory=dict)
    policy: EvictionPolicy = field(default_factory=EvictionPolicy)
    max_models: int | None = None
    demand_half_life_s: float = DEFAULT_HALF_LIFE_S
    preemptions: tuple[wire.Preemption, ...] = ()  # stand-ins evict by the cost model alone

    def __post_init__(self) -> None:
        self.memory_budget = self.budget
        self.reports = status_report.StatusReports(self, self.name, clock=self.clock,
                                                   entry_of=lambda spec: self.entries[spec.id])

    # --- what status_report.ReportSource reads ----------------------------------------------
    def view(self, model_id: str) -> _View | None:
        copy = self.copies.get(model_id)
        if copy is None:
            return None
        now = self.clock()
        demand = self.demand.get(model_id)
        return _View(model_id, "standin", wire.CopyState.READY, self.specs[model_id].memory_bytes, False, copy.inflight,
                     now - copy.last_used, now - copy.loaded_at, frequency=demand.value(now) if demand else 0.0)

    def failed_load(self, model_id: str) -> None:
        return None

    def now(self) -> float:
        return self.clock()

    def known_size(self, spec: _Spec) -> int:
        return spec.memory_bytes

    def used_bytes(self) -> int:
        return sum(self.specs[m].memory_bytes for m in self.copies)

    def committed_bytes(self) -> int:
        return self.used_bytes()

    def queued_requests(self) -> int:
        return 0

    def waiting(self) -> list[tuple[str, int, float]]:
        return []

    def pinned_ids(self) -> list[str]:
        return []

    def loading_ids(self) -> list[str]:
        return []  # a stand-in's loads download nothing: no progress to report

    def load_progress(self, model_id: str) -> str:
        return ""

    # --- what the pod does ------------------------------------------------------------------
    def load(self, model_id: str) -> None:
        if model_id not in self.copies:
            now = self.clock()
            self.copies[model_id] = _Copy(now, now)
            self.changes.touch(model_id)

    def unload(self, model_id: str) -> None:
        if self.copies.pop(model_id, None) is not None:
            self.changes.touch(model_id)

    def begin(self, model_id: str) -> None:
        if model_id not in self.copies:
            self.load(model_id)  # a worker loads a model on its first request
        now = self.clock()
        copy = self.copies[model_id]
        copy.last_used = now
        copy.inflight += 1
        self.demand.setdefault(model_id, DecayedCount(self.demand_half_life_s)).add(now)
        self.changes.touch(model_id)

    def end(self, model_id: str) -> None:
        copy = self.copies.get(model_id)
        if copy is not None:
            copy.inflight -= 1
            self.changes.touch(model_id)


class Standins:
    """Every stand-in pod, each on its own loopback port, in one aiohttp server process."""

    def __init__(self, pods: int, models: int, copies_per_pod: int, model_bytes: int, budget: int,
                 infer_delay_s: float = 0.0, name_format: str = "m-{}") -> None:
        names = [name_format.format(j) for j in range(models)]
        specs = [_Spec(name, model_bytes, _Enum("standin"), _Enum("tensor"), name=name) for name in names]
        by_id = {spec.id: spec for spec in specs}
        store = _Store(specs)
        self.infer_delay_s = infer_delay_s
        entries = {spec.id: status_report.catalog_entry(spec, spec.memory_bytes) for spec in specs}  # type: ignore[arg-type]
        self.pods = [StandinPod(f"standin-{i}", store, by_id, budget, entries=entries) for i in range(pods)]
        for j, name in enumerate(names):
            pod = self.pods[j % pods]
            if len(pod.copies) < copies_per_pod:
                pod.load(name)
        # The whole catalog, serialised once (for callers that ask without a cursor).
        self._catalog_json = b"[" + b",".join(e.model_dump_json().encode() for e in entries.values()) + b"]"
        self.status_answers = 0  # /status answers given, over every pod
        self.status_bytes = 0  # and their bytes

    def app(self, pod: StandinPod) -> web.Application:
        app = web.Application()
        app["pod"] = pod
        app.router.add_get("/status", self.status)
        app.router.add_get("/v2/health/ready", self.ready)
        app.router.add_get("/v2/health/live", self.ready)
        app.router.add_post("/predict", self.predict)
        app.router.add_post("/v2/models/{name}/infer", self.infer)
        app.router.add_post("/v2/repository/models/{name}/load", self.load)
        app.router.add_post("/v2/repository/models/{name}/unload", self.unload)
        app.router.add_get("/_standin/stats", self.stats)
        return app

    async def stats(self, request: web.Request) -> web.Response:
        """What the stand-ins served: /status answers and bytes over every pod, copies per pod."""
        return web.json_response({"status_answers": self.status_answers, "status_bytes": self.status_bytes,
                                  "copies": [len(pod.copies) for pod in self.pods]})

    async def ready(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    async def status(self, request: web.Request) -> web.Response:
        pod: StandinPod = request.app["pod"]
        readiness = {"ready": True, "triton_ready": False}
        since = request.query.get(wire.STATUS_SINCE)
        try:
            limit = wire.parse_status_limit(request.query.get(wire.STATUS_LIMIT))
            if since is None:
                body = self._whole(pod, readiness)
            else:
                body = pod.reports.report(readiness, since, limit,
                                          request.headers.get(wire.ROUTER_ID_HEADER)).model_dump_json().encode()
        except errors.HotsetError as exc:
            return web.json_response({"error": exc.message}, status=exc.status_code)
        self.status_answers += 1
        self.status_bytes += len(body)
        return web.Response(body=body, content_type="application/json")

    def _whole(self, pod: StandinPod, readiness: dict[str, Any]) -> bytes:
        """A whole report in one answer, its catalog spliced in from the bytes serialised once."""
        report = pod.reports.report(readiness, wire.FROM_SCRATCH, limit=1)  # the pod's own figures
        copies = [status_report.copy_of(view) for m in sorted(pod.copies) if (view := pod.view(m)) is not None]
        head = report.model_copy(update={"models": copies, "catalog": [], "cursor": "", "more": False, "delta": False})
        text = head.model_dump_json().encode()
        marker = b'"catalog":[]'
        return text.replace(marker, b'"catalog":' + self._catalog_json, 1)

    async def predict(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            model = msgspec.json.decode(body, type=_Head).model_id
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return web.json_response({"error": f"invalid /predict request: {exc}"}, status=422)
        return await self._serve(request.app["pod"], model, lambda: {"model_id": model, "predictions": [0.5],
                                                                      "model_version": "1"})

    async def infer(self, request: web.Request) -> web.Response:
        await request.read()
        model = request.match_info["name"]
        return await self._serve(request.app["pod"], model, lambda: {
            "model_name": model, "model_version": "1",
            "outputs": [{"name": "out", "shape": [1], "datatype": "FP32", "data": [0.5]}]})

    async def _serve(self, pod: StandinPod, model: str, answer: Any) -> web.Response:
        if model not in pod.specs:
            return web.json_response({"error": f"model {model!r} is not in this worker's model store"}, status=404)
        pod.begin(model)
        try:
            if self.infer_delay_s:
                await asyncio.sleep(self.infer_delay_s)
            return web.json_response(answer(), headers={wire.VERSION_HEADER: "1"})
        finally:
            pod.end(model)

    async def load(self, request: web.Request) -> web.Response:
        request.app["pod"].load(request.match_info["name"])
        return web.json_response({})

    async def unload(self, request: web.Request) -> web.Response:
        request.app["pod"].unload(request.match_info["name"])
        return web.json_response({})


async def serve(args: argparse.Namespace) -> None:
    standins = Standins(args.pods, args.models, args.copies_per_pod, args.model_mib * MiB, args.budget_mib * MiB,
                        args.infer_delay_ms / 1000, args.name_format)
    runners = []
    urls = []
    for index, pod in enumerate(standins.pods):
        runner = web.AppRunner(standins.app(pod), access_log=None)
        await runner.setup()
        host = str(ipaddress.IPv4Address(args.first_ip) + index) if args.first_ip else args.host
        site = web.TCPSite(runner, host, args.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        urls.append(f"http://{host}:{port}")
        runners.append(runner)
    layout = {"urls": urls, "pods": [p.name for p in standins.pods],
              "holder": {m: i for i, pod in enumerate(standins.pods) for m in pod.copies}}
    Path(args.ready_file).write_text(json.dumps(layout))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--copies-per-pod", type=int, default=200)
    parser.add_argument("--model-mib", type=int, default=8)
    parser.add_argument("--budget-mib", type=int, default=4096)
    parser.add_argument("--infer-delay-ms", type=float, default=0.0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--first-ip", default="", help="pod n listens on this loopback address + n (with --port)")
    parser.add_argument("--port", type=int, default=0, help="every pod's port (0: a free one each)")
    parser.add_argument("--name-format", default="m-{}", help="model j's name (str.format of j)")
    parser.add_argument("--ready-file", required=True, help="written with the pods' URLs once every pod listens")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
