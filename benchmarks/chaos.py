"""Chaos under load: a constant stream of requests for models with two copies while, in turn, a
worker, a Triton sidecar and a router replica are killed (SIGKILL, as a crash) or deleted (SIGTERM,
as ``kubectl delete pod``: drain), and each comes back as a kubelet would restart it. Per event:
the requests that failed, how long the failure was visible to clients (kill to last failed
request) and how long until both copies were ready again.

    .venv/bin/python benchmarks/chaos.py [--rps 20] [--settle 5]

Platform: real local processes (two workers, each with its own tritonserver, and two routers in
standalone mode; the load generator plays the Service, sending each request to a random router it
believes alive and dropping a killed one after --endpoint-delay seconds, as endpoints do). The
operator does not run in standalone mode, so its kill is left to a cluster target. ``Target``
is what an event needs (kill, restart, the routers' URLs); a kind target implements it with
``kubectl delete pod`` / ``crictl`` and the Service's URL (e2e/scenarios/platform.py's
``kill_container``).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests"))
import local_stack  # noqa: E402
from hotset_testing.processes import Process, spawn  # noqa: E402
from hotset_worker import samples  # noqa: E402

ROUTER_PRESTOP_S = 5.0  # charts/hotset/templates/router.yaml, lifecycle.preStop.sleep
MODELS = {"sentiment": "a wonderful little model", "iris": [[5.1, 3.5, 1.4, 0.2]]}


class Target(Protocol):
    def router_urls(self) -> list[str]: ...
    def kill(self, component: str, graceful: bool) -> None: ...
    def restart(self, component: str) -> None: ...


@dataclass
class LocalTarget:
    """Two routers, two workers, two sidecars as local processes; components by name."""

    processes: dict[str, Process] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)

    def router_urls(self) -> list[str]:
        return [p.url for name, p in self.processes.items() if name.startswith("router") and name not in self.dead]

    def kill(self, component: str, graceful: bool) -> None:
        """SIGKILL; or a pod deletion: the preStop hook's wait (the chart's router sleeps 5 s while
        the Service's endpoints drop it; a worker drains by itself), then SIGTERM."""
        process = self.processes[component]
        if not graceful:
            process.kill()
            return
        if component.startswith("router"):
            time.sleep(ROUTER_PRESTOP_S)
        process.stop(timeout_s=60)

    def restart(self, component: str) -> None:
        old = self.processes[component]
        self.processes[component] = spawn(old.name, old.popen.args, old.log_path, url=old.url, append=True,
                                          own_session=old.own_session, sweep_group=old.sweep_group)

    def stop(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(Exception):
                process.stop()


def start_local(work: Path) -> LocalTarget:
    store = chaos_store(work)
    target = LocalTarget()
    logs = work / "logs"
    for i in (1, 2):
        repository = work / f"worker-{i}" / "repository"
        sidecar = local_stack.start_triton(f"triton-{i}", repository, logs)
        target.processes[f"triton-{i}"] = sidecar
        target.processes[f"worker-{i}"] = local_stack.start_worker(
            f"worker-{i}", store, logs, "1Gi", sidecar, repository, extra_args=["--drain-seconds", "3"])
    for name, process in target.processes.items():
        local_stack.wait_http(process, "/v2/health/ready", 180)
    workers = [target.processes[f"worker-{i}"].url for i in (1, 2)]
    for i in (1, 2):
        router = local_stack.start_router(workers, logs, model_store=store, name=f"router-{i}",
                                          extra_args=["--sync-interval", "0.5", "--request-timeout", "10"])
        target.processes[f"router-{i}"] = router
        local_stack.wait_http(router, "/v2/health/ready", 60)
    return target


def chaos_store(work: Path) -> Path:
    """The sample store with two copies of each model the stream uses."""
    raw = json.loads(samples.generate(REPO / "build" / "models").read_text())
    for model in raw["models"]:
        if model["id"] in MODELS:
            model["replicas"] = {"min": 2, "max": 2}
    path = work / "model-store.json"
    path.write_text(json.dumps(raw))
    return path


@dataclass
class Stream:
    """The constant request stream: (sent at, model, ok, what) per request."""

    target: Target
    rps: float
    endpoint_delay_s: float
    results: list[tuple[float, str, bool, str]] = field(default_factory=list)
    gone: dict[str, float] = field(default_factory=dict)  # router url -> when it was killed

    def routers(self) -> list[str]:
        """Live routers, and a killed one until the endpoints catch up (as a Service would)."""
        now = time.monotonic()
        return self.target.router_urls() + [u for u, at in self.gone.items() if now - at < self.endpoint_delay_s]

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=15) as client:
            tasks = set()
            turn = 0
            while not stop.is_set():
                model = list(MODELS)[turn % len(MODELS)]
                turn += 1
                task = asyncio.ensure_future(self.one(client, model))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(1 / self.rps)
            await asyncio.gather(*tasks)

    async def one(self, client: httpx.AsyncClient, model: str) -> None:
        sent = time.monotonic()
        urls = self.routers()
        try:
            answer = await client.post(random.choice(urls) + "/predict", json={"model_id": model, "input_data": MODELS[model]})
            ok, what = answer.status_code == 200, str(answer.status_code)
        except httpx.HTTPError as exc:
            ok, what = False, type(exc).__name__
        self.results.append((sent, model, ok, what))


async def copies_ready(router_url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            report = (await client.get(router_url + "/models")).json()
    except (httpx.HTTPError, ValueError):
        return False
    return all(sum(c["state"] == "READY" for c in report["copies"].get(m, [])) >= 2 for m in MODELS)


async def until(condition, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if await condition():
            return time.monotonic() - started
        await asyncio.sleep(0.2)
    return float("nan")


EVENTS = [("worker-1", False), ("triton-2", False), ("router-1", False), ("worker-2", True), ("router-2", True)]


async def chaos(target: LocalTarget, args: argparse.Namespace) -> list[dict]:
    stream = Stream(target, args.rps, args.endpoint_delay)
    stop = asyncio.Event()
    load = asyncio.ensure_future(stream.run(stop))
    await until(lambda: copies_ready(target.router_urls()[0]), 120)
    await asyncio.sleep(args.settle)
    rows = []
    for component, graceful in [e for e in EVENTS if not args.only or e[0] in args.only]:
        killed_at = time.monotonic()
        process = target.processes[component]
        if component.startswith("router"):
            stream.gone[process.url] = killed_at
        target.dead.add(component)
        await asyncio.to_thread(target.kill, component, graceful)
        await asyncio.sleep(args.down)
        target.restart(component)
        await asyncio.to_thread(local_stack.wait_http, target.processes[component], "/v2/health/ready", 180)
        target.dead.discard(component)
        stream.gone.pop(process.url, None)
        recovered = await until(lambda: copies_ready(target.router_urls()[0]), 180)
        await asyncio.sleep(args.settle)
        window = [r for r in stream.results if r[0] >= killed_at]
        failed = [r for r in window if not r[2]]
        rows.append({
            "event": f"{'delete' if graceful else 'kill'} {component}",
            "requests": len(window), "failed": len(failed),
            "failures": sorted({r[3] for r in failed}),
            "visible_s": round(max((r[0] for r in failed), default=killed_at) - killed_at, 2),
            "copies_ready_again_s": round(time.monotonic() - killed_at - args.settle, 1) if recovered == recovered else None,
        })
        print(json.dumps(rows[-1]), flush=True)
    stop.set()
    await load
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rps", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of steady stream before and after each event")
    parser.add_argument("--down", type=float, default=2.0, help="seconds a killed component stays down before its restart")
    parser.add_argument("--endpoint-delay", type=float, default=1.0,
                        help="seconds the stream still sends to a killed router (endpoints catching up)")
    parser.add_argument("--only", nargs="*", default=[], help="components whose events to run (default: all)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos-") as scratch:
        target = start_local(Path(scratch))
        try:
            rows = asyncio.run(chaos(target, args))
        finally:
            target.stop()
    print(json.dumps({"rps": args.rps, "events": rows, "failed_total": sum(r["failed"] for r in rows)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
