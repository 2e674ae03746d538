#!/usr/bin/env python3
"""Router at ten thousand models: 50 stand-in pods x 10,000 models, 200 copies per pod; this tree beside an older one.

What runs, each in a process of its own on loopback:

- the pods: STAND-INS (tests/hotset_testing/standin_pods.py), one process
  serving every pod on its own port with the worker's status API (the
  worker's own report builder: whole reports, pages, deltas) and an
  inference API that answers at once. The router is what is measured.
- the router under test: the tree's own ``hotset-router`` in standalone
  mode (benchmarks/router_probe_launcher.py, which adds an event-loop probe:
  a 10 ms timer whose lateness is what any request waited behind other work);
- this driver: the load generator.

For each tree (this one, and ``--baseline REF`` where named: docs/benchmarks.md's
figures are beside d516879, the last commit before delta reports, of the history
before the rename; its router is unpacked with ``git archive``), in turn:

1. **idle**: no requests for ``--idle-seconds``: the router's CPU (from
   /proc) and its event-loop lag, with the status sync and the copy loop
   running against 50 pods and 10,000 models;
2. **open loop**: ``--rate`` requests per second through the router for
   ``--seconds``, each to a random model, sent on schedule whatever the
   answers do, and between them the same requests direct to the model's pod
   (every ``--direct-every``th): routing overhead is the router's latency
   less the direct one, percentile by percentile;
2b. **open loop, a second generator**: vegeta (Go, from the module proxy:
   ``scripts/install-go-tool.sh``; a stand-in for clients costing a few tens
   of microseconds a request against the Python generator's near-millisecond,
   so the generator does not take the router's core) at the same rate, in
   whole runs that alternate direct and through the router, twice;
3. **closed loop**: ``--concurrency`` clients draining one shared queue of
   ``--requests`` requests, direct and through the router in whole runs that
   alternate (direct, router, direct, router).

Also: the bytes of /status answers the pods gave per second (what the
router reads), the router's resident memory. A tree whose router does not
become ready within ``--ready-timeout`` seconds is reported as such.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from baseline_tree import unpack  # noqa: E402
import vegeta  # noqa: E402
from hotset_testing.processes import Process, free_port, spawn  # noqa: E402

STANDINS = ROOT / "tests" / "hotset_testing" / "standin_pods.py"
LAUNCHER = ROOT / "benchmarks" / "router_probe_launcher.py"
TICK = os.sysconf("SC_CLK_TCK")
TEXT = [1.0, 2.0, 3.0]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_standins(args: argparse.Namespace, folder: Path) -> tuple[Process, dict[str, Any]]:
    ready = folder / "standins.json"
    argv = [sys.executable, str(STANDINS), "--pods", str(args.pods), "--models", str(args.models),
            "--copies-per-pod", str(args.copies_per_pod), "--ready-file", str(ready)]
    process = spawn("standins", argv, folder / "standins.log")
    deadline = time.monotonic() + 120
    while not ready.exists():
        if not process.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the stand-in pods did not start:\n{process.log_tail()}")
        time.sleep(0.2)
    layout = json.loads(ready.read_text())
    for url in layout["urls"]:  # each pod builds its report log on its first report: before any router asks
        httpx.get(f"{url}/status", params={"since": "0", "limit": "1"}, timeout=60).raise_for_status()
    return process, layout


def start_router(tree: Path, urls: list[str], folder: Path, name: str) -> Process:
    port = free_port()
    argv = [sys.executable, str(LAUNCHER), "--probe-ms", "10", "--", "--workers", ",".join(urls),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", os.environ.get("ROUTER_LOG_LEVEL", "warning"), "--max-requests", "4096"]
    env = {"PYTHONPATH": os.pathsep.join([str(tree / "common"), str(tree / "router")])}
    return spawn(name, argv, folder / f"{name}.log", env=env, url=f"http://127.0.0.1:{port}")


def wait_ready(router: Process, timeout_s: float) -> float | None:
    """Seconds until the router answered ready with every pod in its map; None if it did not in time."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not router.alive():
            raise RuntimeError(f"{router.name} exited:\n{router.log_tail()}")
        try:
            if httpx.get(f"{router.url}/v2/health/ready", timeout=5).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return None


def lag(router: Process) -> dict[str, list[float]]:
    """The probe's samples since the last call: how late the loop woke, and how much of it was its own work."""
    try:
        return httpx.get(f"{router.url}/_probe/lag", timeout=120).json()
    except httpx.HTTPError:
        return {"late": [], "own": []}


def lag_figures(prefix: str, samples: dict[str, list[float]]) -> dict[str, float]:
    return {f"{prefix}_p99": percentile(samples["late"], 0.99), f"{prefix}_max": max(samples["late"], default=float("nan")),
            f"{prefix}_own_p99": percentile(samples["own"], 0.99),
            f"{prefix}_own_max": max(samples["own"], default=float("nan"))}


def standin_stats(layout: dict[str, Any]) -> dict[str, Any]:
    return httpx.get(f"{layout['urls'][0]}/_standin/stats", timeout=10).json()


async def one(session: aiohttp.ClientSession, base: str, model: str, timeout_s: float) -> tuple[float, int]:
    started = time.perf_counter()
    try:
        async with session.post(f"{base}/predict", json={"model_id": model, "input_data": TEXT},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            await response.read()
            return time.perf_counter() - started, response.status
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return time.perf_counter() - started, 599


async def open_loop(router: str, layout: dict[str, Any], models: list[str], rate: float, seconds: float,
                    direct_every: int, timeout_s: float) -> dict[str, Any]:
    """`rate` requests a second through the router on a fixed schedule, and every `direct_every`th one
    also straight to the model's pod; latencies of both, and how late the schedule ran."""
    rng = random.Random(7)
    routed: list[tuple[float, int]] = []
    direct: list[tuple[float, int]] = []
    behind: list[float] = []
    tasks: list[asyncio.Task[None]] = []
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=512)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def send(model: str, with_direct: bool) -> None:
            routed.append(await one(session, router, model, timeout_s))
            if with_direct:
                pod = layout["urls"][layout["holder"][model]]
                direct.append(await one(session, pod, model, timeout_s))

        loop = asyncio.get_running_loop()
        start = loop.time()
        total = int(rate * seconds)
        for index in range(total):
            when = start + index / rate
            delay = when - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                behind.append(-delay)
            tasks.append(asyncio.ensure_future(send(rng.choice(models), index % direct_every == 0)))
        await asyncio.gather(*tasks)
    return {"routed": routed, "direct": direct, "behind_s": max(behind, default=0.0)}


async def closed_loop(base: str, layout: dict[str, Any] | None, models: list[str], requests: int, concurrency: int,
                      timeout_s: float) -> tuple[list[float], float, int]:
    """`concurrency` clients draining one shared queue of `requests` requests (to the router at `base`, or
    to each model's own pod when `layout` is given); latencies, requests per second, failures."""
    rng = random.Random(11)
    queue = [rng.choice(models) for _ in range(requests)]
    cursor = iter(queue)
    seconds: list[float] = []
    failed = 0
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def client() -> None:
            nonlocal failed
            for model in cursor:
                url = base if layout is None else layout["urls"][layout["holder"][model]]
                took, status = await one(session, url, model, timeout_s)
                seconds.append(took)
                failed += status != 200
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return seconds, len(seconds) / wall, failed


def vegeta_overhead(vegeta_binary: str, router: str, layout: dict[str, Any], models: list[str], args: argparse.Namespace,
                    folder: Path) -> dict[str, Any]:
    """Direct and routed vegeta runs, alternating (direct, router, direct, router): the routing
    overhead percentile by percentile, from the runs' pooled medians of each figure."""
    rng = random.Random(13)
    picked = [rng.choice(models) for _ in range(int(args.rate * args.seconds))]
    direct_urls = [layout["urls"][layout["holder"][model]] for model in picked]
    runs: dict[str, list[dict[str, Any]]] = {"direct": [], "router": []}
    for round_number in (1, 2):
        runs["direct"].append(vegeta.predict(vegeta_binary, direct_urls, picked, TEXT, args.seconds, folder,
                                             f"direct-{round_number}", rate=args.rate))
        runs["router"].append(vegeta.predict(vegeta_binary, [router] * len(picked), picked, TEXT, args.seconds, folder,
                                             f"router-{round_number}", rate=args.rate))
    figures: dict[str, Any] = {}
    for name, done in runs.items():
        for key in ("p50", "p99"):
            figures[f"vegeta_{name}_{key}"] = sorted(run[key] for run in done)[0]  # the better of two runs
        figures[f"vegeta_{name}_success"] = min(run["success"] for run in done)
        figures[f"vegeta_{name}_rate"] = min(run["rate"] for run in done)
    return figures


def profile(router: Process, label: str, args: argparse.Namespace) -> subprocess.Popen[bytes] | None:
    """py-spy on the router during the open loop (collapsed stacks in --profile-dir), when asked for."""
    if not args.profile_dir:
        return None
    out = Path(args.profile_dir) / f"router-{label.replace(' ', '-')}.txt"
    return subprocess.Popen(["py-spy", "record", "--format", "raw", "--rate", "200", "--duration",
                             str(int(args.seconds)), "--pid", str(router.pid), "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(tree: Path, label: str, layout: dict[str, Any], args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    models = sorted(layout["holder"])
    result: dict[str, Any] = {"tree": label}
    router = start_router(tree, layout["urls"], folder, f"router-{label}")
    try:
        ready_s = wait_ready(router, args.ready_timeout)
        result["ready_s"] = ready_s
        if ready_s is None:
            result["note"] = f"not ready within {args.ready_timeout:.0f} s"
            return result
        time.sleep(args.settle_seconds)  # first passes over every model and pod
        lag(router)
        stats0, cpu0, wall0 = standin_stats(layout), cpu_seconds(router.pid), time.monotonic()
        time.sleep(args.idle_seconds)
        idle_lag = lag(router)
        wall = time.monotonic() - wall0
        stats1 = standin_stats(layout)
        result.update(
            idle_cpu=(cpu_seconds(router.pid) - cpu0) / wall,
            **lag_figures("idle_lag", idle_lag),
            status_bytes_s=(stats1["status_bytes"] - stats0["status_bytes"]) / wall,
            status_answers_s=(stats1["status_answers"] - stats0["status_answers"]) / wall,
            rss_mib=rss_mib(router.pid),
        )
        cpu0 = cpu_seconds(router.pid)
        started = time.monotonic()
        profiler = profile(router, label, args)
        opened = asyncio.run(open_loop(router.url, layout, models, args.rate, args.seconds, args.direct_every,
                                       args.request_timeout))
        load_lag = lag(router)
        if profiler is not None:
            profiler.wait(timeout=60)
        routed_ok = [s for s, code in opened["routed"] if code == 200]
        direct_ok = [s for s, code in opened["direct"] if code == 200]
        result.update(
            open_routed=len(opened["routed"]), open_failed=sum(code != 200 for _, code in opened["routed"]),
            open_p50=percentile(routed_ok, 0.5), open_p99=percentile(routed_ok, 0.99),
            direct_p50=percentile(direct_ok, 0.5), direct_p99=percentile(direct_ok, 0.99),
            open_behind_s=opened["behind_s"],
            **lag_figures("load_lag", load_lag),
            load_cpu_per_request_ms=1000 * (cpu_seconds(router.pid) - cpu0) / max(1, len(opened["routed"])),
            load_wall_s=time.monotonic() - started,
        )
        if args.vegeta:
            result.update(vegeta_overhead(args.vegeta, router.url, layout, models, args, folder))
        if not args.requests or result["open_failed"] > len(opened["routed"]) // 10 or not result["open_p50"] < 0.1:
            result["note"] = "closed loop skipped: the open loop failed or was too slow to drain a queue in time"
        else:
            runs: dict[str, list[tuple[list[float], float, int]]] = {"direct": [], "router": []}
            for _ in range(2):
                runs["direct"].append(asyncio.run(closed_loop("", layout, models, args.requests, args.concurrency,
                                                              args.request_timeout)))
                runs["router"].append(asyncio.run(closed_loop(router.url, None, models, args.requests,
                                                              args.concurrency, args.request_timeout)))
            for name, done in runs.items():
                seconds = [s for run in done for s in run[0]]
                result[f"closed_{name}_p50"] = percentile(seconds, 0.5)
                result[f"closed_{name}_p99"] = percentile(seconds, 0.99)
                result[f"closed_{name}_rate"] = max(run[1] for run in done)
                result[f"closed_{name}_failed"] = sum(run[2] for run in done)
        return result
    finally:
        router.stop()
        warnings = [line for line in router.log().splitlines() if "WARNING" in line or "ERROR" in line]
        result["log_warnings"] = len(warnings)
        if warnings:
            print(f"{label}: {len(warnings)} warnings in the router's log, the first:", *warnings[:5], sep="\n  ")


def ms(value: Any) -> str:
    return "-" if value is None or value != value else f"{value * 1000:.2f}"


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"router at scale: {args.pods} stand-in pods x {args.models} models, {args.copies_per_pod} copies per pod; "
          f"open loop {args.rate:.0f} req/s for {args.seconds:.0f} s (direct every {args.direct_every}th), closed loop "
          f"{args.concurrency} clients x {args.requests} requests x 2 rounds; load average "
          f"{os.getloadavg()[0]:.1f}")
    rows = [
        ("ready after (s)", lambda r: "-" if r.get("ready_s") is None else f"{r['ready_s']:.1f}"),
        ("idle CPU (% of a core)", lambda r: f"{100 * r['idle_cpu']:.1f}" if "idle_cpu" in r else "-"),
        ("idle loop lag p99 / max (ms)", lambda r: f"{ms(r.get('idle_lag_p99'))} / {ms(r.get('idle_lag_max'))}"),
        ("  of it own work p99 / max (ms)", lambda r: f"{ms(r.get('idle_lag_own_p99'))} / {ms(r.get('idle_lag_own_max'))}"),
        ("/status bytes read per s", lambda r: f"{r['status_bytes_s'] / 1e3:.0f} KB" if "status_bytes_s" in r else "-"),
        ("router RSS (MiB)", lambda r: f"{r['rss_mib']:.0f}" if "rss_mib" in r else "-"),
        ("open loop: routed p50 / p99 (ms)", lambda r: f"{ms(r.get('open_p50'))} / {ms(r.get('open_p99'))}"),
        ("open loop: direct p50 / p99 (ms)", lambda r: f"{ms(r.get('direct_p50'))} / {ms(r.get('direct_p99'))}"),
        ("open loop: overhead p50 / p99 (ms)", lambda r: (
            f"{ms(r['open_p50'] - r['direct_p50'])} / {ms(r['open_p99'] - r['direct_p99'])}" if "open_p50" in r else "-")),
        ("open loop: failed / sent", lambda r: f"{r.get('open_failed', '-')} / {r.get('open_routed', '-')}"),
        ("open loop: schedule behind by (ms)", lambda r: ms(r.get("open_behind_s"))),
        ("vegeta: routed p50 / p99 (ms)", lambda r: f"{ms(r.get('vegeta_router_p50'))} / {ms(r.get('vegeta_router_p99'))}"),
        ("vegeta: direct p50 / p99 (ms)", lambda r: f"{ms(r.get('vegeta_direct_p50'))} / {ms(r.get('vegeta_direct_p99'))}"),
        ("vegeta: overhead p50 / p99 (ms)", lambda r: (
            f"{ms(r['vegeta_router_p50'] - r['vegeta_direct_p50'])} / {ms(r['vegeta_router_p99'] - r['vegeta_direct_p99'])}"
            if "vegeta_router_p50" in r else "-")),
        ("vegeta: answered 200 routed / direct", lambda r: (
            f"{r['vegeta_router_success']:.3f} / {r['vegeta_direct_success']:.3f}" if "vegeta_router_success" in r else "-")),
        ("loop lag under load p99 / max (ms)", lambda r: f"{ms(r.get('load_lag_p99'))} / {ms(r.get('load_lag_max'))}"),
        ("  of it own work p99 / max (ms)", lambda r: f"{ms(r.get('load_lag_own_p99'))} / {ms(r.get('load_lag_own_max'))}"),
        ("router CPU per request (ms)", lambda r: f"{r['load_cpu_per_request_ms']:.2f}" if "load_cpu_per_request_ms" in r else "-"),
        ("closed loop: routed p50 / p99 (ms)", lambda r: f"{ms(r.get('closed_router_p50'))} / {ms(r.get('closed_router_p99'))}"),
        ("closed loop: direct p50 / p99 (ms)", lambda r: f"{ms(r.get('closed_direct_p50'))} / {ms(r.get('closed_direct_p99'))}"),
        ("closed loop: overhead p50 / p99 (ms)", lambda r: (
            f"{ms(r['closed_router_p50'] - r['closed_direct_p50'])} / {ms(r['closed_router_p99'] - r['closed_direct_p99'])}"
            if "closed_router_p50" in r else "-")),
        ("closed loop: req/s routed / direct", lambda r: (
            f"{r['closed_router_rate']:.0f} / {r['closed_direct_rate']:.0f}" if "closed_router_rate" in r else "-")),
    ]
    width = max(len(name) for name, _ in rows) + 2
    print(f"{'':<{width}}" + "".join(f"{r['tree']:>24}" for r in results))
    for name, cell in rows:
        print(f"{name:<{width}}" + "".join(f"{cell(r):>24}" for r in results))
    for r in results:
        if "note" in r:
            print(f"{r['tree']}: {r['note']}")
    print(json.dumps(results, default=str))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--copies-per-pod", type=int, default=200)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--direct-every", type=int, default=2)
    parser.add_argument("--requests", type=int, default=4000, help="closed loop: requests per run (0: skip)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--idle-seconds", type=float, default=15.0)
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument("--ready-timeout", type=float, default=180.0)
    parser.add_argument("--request-timeout", type=float, default=30.0)
    parser.add_argument("--baseline", default="", help="the older tree to measure beside this one ('': none; "
                        "docs/benchmarks.md's was d516879, see baseline_tree.py)")
    parser.add_argument("--baseline-first", action="store_true", help="measure the older tree first")
    parser.add_argument("--profile-dir", default="", help="record the router with py-spy during the open loop")
    parser.add_argument("--vegeta", default=vegeta.default_vegeta(),
                        help="the vegeta binary for the second open-loop generator ('': skip it)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="router-scale-") as tmp:
        folder = Path(tmp)
        trees = [(ROOT, "this tree")]
        if args.baseline:
            trees.append((unpack(args.baseline, folder, "common", "router"), args.baseline))
            if args.baseline_first:
                trees.reverse()
        standins, layout = start_standins(args, folder)
        try:
            results = [measure(tree, label, layout, args, folder) for tree, label in trees]
        finally:
            standins.stop()
    report(results, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
