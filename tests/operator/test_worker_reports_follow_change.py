"""The operator's pool loop reads what changed on each worker pod, not the pod's whole report each pass.

A real worker (ballast models, 1,000 in its catalog) on loopback, read by the
operator's own ``workers.Reports`` over real HTTP: the first pass reads the
whole state (page by page); a pass over an idle pod reads a few hundred bytes
and no copy or catalog entry; after one request and one load only those two
copies arrive. What the pass hands on is still the pod's whole report, equal
to what the worker says when asked for everything at once, its copies' idle
times aged as the worker ages them.
"""
from __future__ import annotations

import httpx

from hotset_common.wire import CopyState, WorkerStatus
from hotset_operator import workers
from hotset_operator.index import WorkerPod
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread

MODELS = 1000


class RecordingTransport(httpx.AsyncBaseTransport):
    """Real HTTP (httpx's own transport), with every /status answer's body kept for the test."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.bodies: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        body = await response.aread()
        self.bodies.append(body)
        return httpx.Response(response.status_code, headers=response.headers, content=body)

    def taken(self) -> list[WorkerStatus]:
        taken, self.bodies = [WorkerStatus.model_validate_json(b) for b in self.bodies], []
        return taken


def _copies(report: WorkerStatus) -> list[tuple[str, CopyState, int]]:
    return [(c.id, c.state, c.bytes) for c in report.models]


async def test_an_idle_pod_costs_a_few_hundred_bytes_and_only_what_changed_arrives(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {f"m{i:04d}": {"size": MiB} for i in range(MODELS)})
    app = ballast_app(store, budget=200 * MiB)
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as direct:
        for i in range(20):
            assert direct.post("/predict", json={"model_id": f"m{i:04d}", "input_data": [1]}).status_code == 200
        port = int(url.rsplit(":", 1)[1])
        pod = WorkerPod(name="test-pod", ip="127.0.0.1", phase="Running", ready=True, namespace="ns")
        transport = RecordingTransport()
        read: list[int] = []
        async with httpx.AsyncClient(transport=transport, timeout=10) as http:
            reports = workers.Reports(http, port, page=200, on_bytes=read.append)

            first = (await reports.fetch([pod]))[("ns", "test-pod")]
            pages = transport.taken()
            whole = WorkerStatus.model_validate_json(direct.get("/status").content)  # everything at once
            assert len(pages) >= MODELS // 200 and not pages[0].delta  # the whole state, page by page
            assert sum(read) > 100_000 and max(read) < sum(read) / 4
            assert _copies(first) == _copies(whole) and len(first.models) == 20
            assert first.catalog == []  # the operator has its own catalog

            read.clear()
            idle = (await reports.fetch([pod]))[("ns", "test-pod")]
            (answer,) = transport.taken()
            assert answer.delta and answer.models == [] and answer.catalog == []
            assert sum(read) < 1500, f"an idle pod's report took {sum(read)} bytes"
            assert _copies(idle) == _copies(first)
            aged = {c.id: c.last_used_s for c in idle.models}
            assert all(aged[c.id] > c.last_used_s for c in first.models)  # idle times move on with no record

            assert direct.post("/predict", json={"model_id": "m0005", "input_data": [1]}).status_code == 200
            assert direct.post("/predict", json={"model_id": "m0500", "input_data": [1]}).status_code == 200
            read.clear()
            changed = (await reports.fetch([pod]))[("ns", "test-pod")]
            answers = transport.taken()
            assert {c.id for a in answers for c in a.models} == {"m0005", "m0500"}
            assert all(a.catalog == [] or {e.id for e in a.catalog} <= {"m0005", "m0500"} for a in answers)
            assert sum(read) < 5000
            whole = WorkerStatus.model_validate_json(direct.get("/status").content)
            assert _copies(changed) == _copies(whole) and len(changed.models) == 21
            assert next(c for c in changed.models if c.id == "m0005").last_used_s < aged["m0005"]


async def test_a_restarted_worker_is_read_whole_and_a_silent_pod_is_absent(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {f"m{i}": {"size": MiB} for i in range(30)})
    pod = WorkerPod(name="p", ip="127.0.0.1", phase="Running", ready=True, namespace="ns")
    silent = WorkerPod(name="q", ip="127.0.0.2", phase="Running", ready=True, namespace="ns")  # nothing listens
    async with httpx.AsyncClient(timeout=2) as http:
        reports = workers.Reports(http, 0)
        with serve_in_thread(ballast_app(store, budget=100 * MiB)) as url, httpx.Client(base_url=url) as direct:
            assert direct.post("/predict", json={"model_id": "m3", "input_data": [1]}).status_code == 200
            reports.port = int(url.rsplit(":", 1)[1])
            assert _copies((await reports.fetch([pod]))[("ns", "p")]) == [("m3", CopyState.READY, MiB)]
        # The same pod's worker again, a new process: its cursor names another epoch.
        with serve_in_thread(ballast_app(store, budget=100 * MiB)) as url, httpx.Client(base_url=url) as direct:
            assert direct.post("/predict", json={"model_id": "m7", "input_data": [1]}).status_code == 200
            reports.port = int(url.rsplit(":", 1)[1])
            found = await reports.fetch([pod, silent])
            assert list(found) == [("ns", "p")]
            assert _copies(found[("ns", "p")]) == [("m7", CopyState.READY, MiB)]  # m3 went with the old process
