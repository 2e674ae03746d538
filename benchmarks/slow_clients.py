#!/usr/bin/env python3
"""Clients that send at once, alone and beside slow or vanishing ones, side by side in one run.

Starts one real worker (the test-only ballast framework: a trivial model and
a "slow" one that answers in 3 s) and one real router with its default
client bounds and `--max-requests` R. Then, in alternating phases, a closed
loop of C clients sends `/predict` for the trivial model while:

- quiet: nothing else happens;
- trickle: R connections each send a head and part of a body, then one byte
  a second (a slowloris; each reconnects when it is cut off);
- hang-up: R clients each send a whole request for the slow model and
  disconnect 0.2 s later, once a second, spread over the second (held for
  its whole 3 s answer, each would keep 3 slots busy: every slot, R times
  over; let go at the hang-up, a fifth of one).

It prints, per phase, the share of the closed loop's requests answered 200,
their p50 and p99, and the p99 ratio against the quiet phase. Before the
client bounds (docs/security.md, "Hostile requests") the trickle and hang-up
phases held every router slot: the loop's requests got 503 with
Retry-After.

    .venv/bin/python benchmarks/slow_clients.py [--seconds 8] [--rounds 2]
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import local_stack  # noqa: E402

LAUNCHER = [sys.executable, str(ROOT / "tests/router/ballast_worker_main.py")]
FAST = json.dumps({"model_id": "fast", "input_data": [1.0]}).encode()
SLOW = json.dumps({"model_id": "slow", "input_data": [1.0]}).encode()


def write_store(folder: Path) -> Path:
    entries = []
    for name, delay in (("fast", 0.0), ("slow", 3.0)):
        path = folder / name
        path.mkdir(parents=True)
        (path / "ballast.json").write_text(json.dumps({"bytes": 1024, "load_delay_s": 0, "factor": 2.0,
                                                       "predict_delay_s": delay}))
        entries.append({"id": name, "framework": "torchvision", "source": f"file://{path}", "memory": 1024})
    store = folder / "model-store.json"
    store.write_text(json.dumps({"models": entries}))
    return store


def head(length: int) -> bytes:
    return (f"POST /predict HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def trickler(url: str, stop: threading.Event, offset_s: float = 0.0) -> None:
    """A slowloris: part of a body, then a byte a second; again when the router cuts it off."""
    stop.wait(offset_s)
    while not stop.is_set():
        try:
            with socket.create_connection(address(url), timeout=5) as sock:
                sock.sendall(head(len(FAST)) + FAST[:4])
                for byte in FAST[4:-1]:
                    if stop.wait(1.0):
                        return
                    sock.sendall(bytes([byte]))
        except OSError:
            stop.wait(0.1)


def hanger_up(url: str, stop: threading.Event, offset_s: float = 0.0) -> None:
    """A whole request for the slow model, then gone before its answer (`offset_s`: when it starts
    within its second, so that the hanger-ups arrive spread out)."""
    stop.wait(offset_s)
    while not stop.is_set():
        try:
            with socket.create_connection(address(url), timeout=5) as sock:
                sock.sendall(head(len(SLOW)) + SLOW)
                stop.wait(0.2)
            stop.wait(0.8)  # one request a second per hanger-up
        except OSError:
            stop.wait(0.1)


def closed_loop(url: str, clients: int, seconds: float) -> tuple[int, list[float], collections.Counter[int]]:
    """(requests sent, latencies of the 200s, the other answers' statuses) of `clients` clients for `seconds`."""
    deadline = time.monotonic() + seconds
    lock = threading.Lock()
    sent, ok, other = [0], [], collections.Counter()

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                answer = http.post(url + "/predict", content=FAST, headers={"content-type": "application/json"})
                status = answer.status_code
                if status != 200 and os.environ.get("BENCH_DEBUG"):
                    print(status, answer.text[:200], file=sys.stderr)
                elapsed = time.perf_counter() - started
                with lock:
                    sent[0] += 1
                    if status == 200:
                        ok.append(elapsed)
                    else:
                        other[status] += 1

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda _: client(), range(clients)))
    return sent[0], ok, other


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def phase(url: str, kind: str, slots: int, clients: int, seconds: float) -> dict[str, Any]:
    stop = threading.Event()
    attackers = {"trickle": trickler, "hang-up": hanger_up}.get(kind)
    threads = [threading.Thread(target=attackers, args=(url, stop, i / slots), daemon=True)
               for i in range(slots)] if attackers else []
    for thread in threads:
        thread.start()
    if threads:
        time.sleep(1.0)  # load generation: the attackers connect first
    try:
        sent, ok, other = closed_loop(url, clients, seconds)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    return {"sent": sent, "ok": len(ok), "p50_ms": percentile(ok, 0.5) * 1000, "p99_ms": percentile(ok, 0.99) * 1000,
            "other": other}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--slots", type=int, default=32, help="the router's --max-requests (and the attackers)")
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        worker = local_stack.start_worker("bench-worker", write_store(folder), folder / "logs", "64Mi",
                                          # threads for every abandoned 3 s answer still running (4 a slot) and the loop
                                          extra_args=["--inference-threads", str(4 * args.slots + args.clients)],
                                          launcher=LAUNCHER)
        router = None
        try:
            local_stack.wait_http(worker, "/v2/health/ready", 90)
            router = local_stack.start_router([worker.url], folder / "logs",
                                              extra_args=["--max-requests", str(args.slots)])
            local_stack.wait_http(router, "/v2/health/ready", 60)
            for body in (FAST, SLOW):  # both loaded before the first phase
                httpx.post(router.url + "/predict", content=body, headers={"content-type": "application/json"},
                           timeout=30)
            results: dict[str, list[dict[str, Any]]] = {"quiet": [], "trickle": [], "hang-up": []}
            for round_ in range(args.rounds):
                order = list(results) if round_ % 2 == 0 else list(reversed(results))
                for kind in order:
                    results[kind].append(phase(router.url, kind, args.slots, args.clients, args.seconds))
            quiet_p99 = min(r["p99_ms"] for r in results["quiet"])
            print(f"router --max-requests {args.slots}, {args.clients} closed-loop clients, {args.seconds:g} s phases, "
                  f"{args.rounds} rounds alternating")
            print(f"{'phase':10} {'answered 200':>14} {'p50 ms':>8} {'p99 ms':>8} {'p99 / quiet':>12}  other answers")
            for kind, runs in results.items():
                sent, ok = sum(r["sent"] for r in runs), sum(r["ok"] for r in runs)
                p50 = min(r["p50_ms"] for r in runs)
                p99 = min(r["p99_ms"] for r in runs)
                other = sum((r["other"] for r in runs), collections.Counter())
                print(f"{kind:10} {ok:>6}/{sent:<7} {p50:8.1f} {p99:8.1f} {p99 / quiet_p99:11.2f}x  "
                      f"{dict(other) or '-'}")
        finally:
            if router is not None:
                router.stop()
            worker.stop()


if __name__ == "__main__":
    main()
