#!/usr/bin/env python3
"""LLM streaming: time to first token and the gaps between chunks, direct to a worker vs through the router.

One real worker and one real router in front of it, on loopback. Two
generators: the tiny-chat sample (a causal LM generating in the worker's
process) and a vllm model whose engine is the test-only stand-in, a paced
generator that makes one chunk every ``--token-delay-ms`` and stamps each
with the moment it left (it is not vLLM: the figures are the HTTP path, not
an engine). The client parses the event stream itself (httpx), the same way
on both paths, and every comparison alternates direct/router request by
request, so both see the same machine load.

- Time to first token: from sending a streamed request to receiving its
  first event with text. Target: the router adds <= 2 ms at p50.
- Chunks as they are produced: for the paced generator, each chunk's delay
  from leaving the generator to reaching the client, and each gap between
  two arrivals against the generator's gap between the same two chunks. For
  tiny-chat, a stream's span at the client (first to last text event)
  against the generator's (first to last token: the worker's own time per
  output token for that request times the gaps). Target: gaps through the router match the
  generator's (within 10%), i.e. nothing is held back and bunched.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import local_stack  # noqa: E402
from hotset_worker import samples  # noqa: E402

STANDIN = ROOT / "tests" / "hotset_testing" / "standin_vllm.py"


def write_store(folder: Path) -> Path:
    """The tiny-chat sample (as built at install time) and one paced stand-in engine model."""
    built = samples.generate(ROOT / "build" / "models")
    chat = next(m for m in json.loads(built.read_text())["models"] if m["id"] == "tiny-chat")
    engine_folder = folder / "paced"
    engine_folder.mkdir()
    paced = {"id": "paced", "framework": "vllm", "task": "text-generation", "source": f"file://{engine_folder}",
             "memory": "64Mi", "engineArgs": {"max_model_len": 4096}}
    store = folder / "model-store.json"
    store.write_text(json.dumps({"models": [chat, paced]}))
    return store


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Stream:
    """One streamed answer at the client: when each text event arrived, and when it left the generator."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []  # seconds since the request was sent
        self.delays: list[float] = []  # arrival minus the stand-in's stamp (wall clock, same machine)
        self.emitted: list[float] = []

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]

    def generator_gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.emitted, self.emitted[1:])]


async def stream(client: httpx.AsyncClient, url: str, body: dict) -> Stream:
    started = time.perf_counter()
    seen = Stream()
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            choices = event.get("choices") or []
            if choices and choices[0].get("delta", {}).get("content"):
                seen.arrivals.append(time.perf_counter() - started)
                if "x_emitted_at" in event:
                    seen.delays.append(time.time() - event["x_emitted_at"])
                    seen.emitted.append(event["x_emitted_at"])
    return seen


def chat(model: str, max_tokens: int, min_tokens: int = 0) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "say hello"}], "temperature": 0, "stream": True,
            "max_tokens": max_tokens, "min_tokens": min_tokens}


async def ttft(direct: str, routed: str, model: str, count: int) -> dict[str, list[float]]:
    samples_: dict[str, list[float]] = {"direct": [], "router": []}
    body = chat(model, max_tokens=4)
    async with httpx.AsyncClient(timeout=60) as client:
        for url in (direct, routed, direct, routed):  # warm: the model's load, connections
            await stream(client, url, body)
        for _ in range(count):
            for name, url in (("direct", direct), ("router", routed)):
                samples_[name].append((await stream(client, url, body)).arrivals[0])
    return samples_


async def long_streams(direct: str, routed: str, model: str, streams: int, tokens: int,
                       worker: str) -> dict[str, list[tuple[Stream, float]]]:
    """Per path: each long stream with the worker's mean time per output token for it."""
    samples_: dict[str, list[tuple[Stream, float]]] = {"direct": [], "router": []}
    body = chat(model, max_tokens=tokens, min_tokens=tokens)
    async with httpx.AsyncClient(timeout=120) as client:
        await stream(client, direct, chat(model, max_tokens=4))
        for _ in range(streams):
            for name, url in (("direct", direct), ("router", routed)):
                before = await asyncio.to_thread(worker_tpot, worker, model)
                seen = await stream(client, url, body)
                after = await asyncio.to_thread(worker_tpot, worker, model)
                samples_[name].append((seen, (after[0] - before[0]) / max(after[1] - before[1], 1)))
    return samples_


def worker_tpot(url: str, model: str) -> tuple[float, float]:
    """(sum, count) of the worker's time-per-output-token histogram for `model`."""
    from prometheus_client.parser import text_string_to_metric_families

    total = count = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name == "hotset_time_per_output_token_seconds_sum":
                total += sample.value
            elif sample.name == "hotset_time_per_output_token_seconds_count":
                count += sample.value
    return total, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="TTFT samples per path and model")
    parser.add_argument("--streams", type=int, default=10, help="long streams per path and model for the gaps")
    parser.add_argument("--tokens", type=int, default=100, help="tokens per long stream")
    parser.add_argument("--token-delay-ms", type=float, default=20.0, help="the paced generator's gap")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llm-streaming-") as tmp:
        folder = Path(tmp)
        store = write_store(folder)
        command = f"{sys.executable} {STANDIN} --standin-token-delay-s {args.token_delay_ms / 1000.0}"
        worker = local_stack.start_worker("worker-1", store, folder / "logs", "1Gi",
                                          extra_args=["--vllm-command", command, "--vllm-device-memory", "1Gi",
                                                      "--log-level", "warning"])
        router = None
        try:
            local_stack.wait_http(worker, "/v2/health/ready", 120)
            router = local_stack.start_router([worker.url], folder / "logs", extra_args=["--log-level", "warning"])
            local_stack.wait_http(router, "/v2/health/ready", 60)
            first = {model: asyncio.run(ttft(worker.url, router.url, model, args.requests)) for model in ("tiny-chat", "paced")}
            long = {model: asyncio.run(long_streams(worker.url, router.url, model, args.streams, args.tokens, worker.url))
                    for model in ("tiny-chat", "paced")}
        finally:
            for process in (router, worker):
                if process is not None:
                    process.stop()
    report(args, first, long)


def report(args: argparse.Namespace, first: dict, long: dict) -> None:
    ms = 1000.0
    print(f"LLM streaming: one worker, one router, load average {os.getloadavg()[0]:.1f}; TTFT over {args.requests} "
          f"streamed requests per path and model; {args.streams} streams of {args.tokens} tokens per path and model; "
          f"all alternating direct/router")
    print(f"{'time to first token':<22}{'direct p50':>12}{'router p50':>12}{'added p50':>12}{'paired p50':>12}"
          f"{'direct p90':>12}{'router p90':>12}")
    for model, figures in first.items():
        d, r = statistics.median(figures["direct"]) * ms, statistics.median(figures["router"]) * ms
        # Each router request followed a direct one: their difference is less exposed to the machine's load drifting.
        paired = statistics.median(b - a for a, b in zip(figures["direct"], figures["router"])) * ms
        print(f"{model:<22}{d:>10.2f}ms{r:>10.2f}ms{r - d:>10.2f}ms{paired:>10.2f}ms"
              f"{percentile(figures['direct'], 0.9) * ms:>10.2f}ms{percentile(figures['router'], 0.9) * ms:>10.2f}ms"
              f"   target <= 2 ms: {'met' if r - d <= 2.0 else 'NOT met'}")

    print(f"paced generator ({args.token_delay_ms:.0f} ms): {'delay p50':>10}{'delay p90':>11}{'gap p50':>10}{'gap p90':>10}"
          f"{'|gap - its gap| p50':>21}{'mean gap / its':>16}")
    for name, runs in long["paced"].items():
        streams = [seen for seen, _ in runs]
        delays = [d for s in streams for d in s.delays]
        gaps = [g for s in streams for g in s.gaps()]
        errors = [abs(g - e) for s in streams for g, e in zip(s.gaps(), s.generator_gaps())]
        ratio = statistics.mean(statistics.mean(s.gaps()) / statistics.mean(s.generator_gaps()) for s in streams)
        print(f"  {name:<30}{statistics.median(delays) * ms:>8.2f}ms{percentile(delays, 0.9) * ms:>9.2f}ms"
              f"{statistics.median(gaps) * ms:>8.2f}ms{percentile(gaps, 0.9) * ms:>8.2f}ms"
              f"{statistics.median(errors) * ms:>19.2f}ms{ratio:>16.3f}"
              + (f"   target within 10%: {'met' if abs(ratio - 1) <= 0.10 else 'NOT met'}" if name == "router" else ""))

    print(f"tiny-chat (in process):   {'stream span':>12}{'its span':>11}{'span/its':>10}{'gap p50':>10}{'gap p90':>10}"
          f"{'gaps < 1 ms':>13}")
    for name, runs in long["tiny-chat"].items():
        # The generator's span: first to last token, from the worker's own time per output token.
        spans = [seen.arrivals[-1] - seen.arrivals[0] for seen, _ in runs]
        its = [tpot * (args.tokens - 1) for _, tpot in runs]
        gaps = [g for seen, _ in runs for g in seen.gaps()]
        ratio = statistics.mean(a / b for a, b in zip(spans, its))
        print(f"  {name:<24}{statistics.mean(spans) * ms:>10.1f}ms{statistics.mean(its) * ms:>9.1f}ms{ratio:>10.3f}"
              f"{statistics.median(gaps) * ms:>8.2f}ms{percentile(gaps, 0.9) * ms:>8.2f}ms"
              f"{sum(g < 0.001 for g in gaps) / len(gaps):>13.0%}"
              + (f"   target within 10%: {'met' if abs(ratio - 1) <= 0.10 else 'NOT met'}" if name == "router" else ""))

if __name__ == "__main__":
    main()
