"""Two router replicas and minimum copies, against real workers.

Two routers that see the same worker reports choose the same pod for a cold
model, and the worker's single-flight load makes it one load (docs/router.md,
"Several router replicas"). They count the same demand (what the workers
served), so a model hot across both gets its copy though neither alone sees
enough. Models with ``replicas.min >= 1`` are loaded before any request arrives.
"""
from __future__ import annotations

import asyncio
import threading
import time

import httpx

from gateway_helpers import copies, loads, wait_for, write_ballast_store


def test_two_routers_asked_for_the_same_cold_model_at_once_load_it_once(procs, tmp_path):
    store = write_ballast_store(tmp_path, {"cold": {"mib": 8, "delay": 0.5}, "other": {"mib": 8}})
    w1, w2 = procs.workers(store, ["200Mi", "200Mi"])
    r1 = procs.router([w1, w2])
    r2 = procs.router([w1, w2])

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"model_id": "cold", "input_data": [1]}
            return await asyncio.gather(*(client.post(f"{r.url}/predict", json=body) for r in (r1, r2) for _ in range(10)))

    answers = asyncio.run(burst())
    assert [a.status_code for a in answers] == [200] * 20
    assert loads(w1.url, "cold") + loads(w2.url, "cold") == 1
    assert len(copies(r1.url, "cold")) == 1
    assert copies(r1.url, "cold") == copies(r2.url, "cold")


def test_models_with_min_copies_are_loaded_before_any_request(procs, tmp_path):
    store = write_ballast_store(tmp_path, {"latency": {"mib": 8, "min": 2, "max": 2}, "on-demand": {"mib": 8}})
    w1, w2 = procs.workers(store, ["200Mi", "200Mi"])
    router = procs.router([w1, w2], store=store)
    wait_for(lambda: copies(router.url, "latency") == ["worker-1", "worker-2"], "two pre-loaded copies", 30)
    assert copies(router.url, "on-demand") == []


def test_two_routers_count_the_demand_both_send_and_add_one_copy(procs, tmp_path):
    store = write_ballast_store(tmp_path, {"hot": {"mib": 8, "max": 2}})
    w1, w2 = procs.workers(store, ["200Mi", "200Mi"])
    args = ["--replicate-rps-per-copy", "12", "--replicate-window", "2", "--idle-copy-seconds", "600"]
    routers = [procs.router([w1, w2], store=store, args=args) for _ in range(2)]
    stop = threading.Event()
    failures: list[str] = []

    def traffic(url: str) -> None:  # about 10 requests a second: below the threshold through one router
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                started = time.monotonic()
                response = client.post(f"{url}/predict", json={"model_id": "hot", "input_data": [1]})
                if response.status_code != 200:
                    failures.append(response.text)
                stop.wait(max(0.0, 0.1 - (time.monotonic() - started)))

    senders = [threading.Thread(target=traffic, args=(r.url,)) for r in routers]
    for sender in senders:
        sender.start()
    try:
        wait_for(lambda: len(copies(routers[0].url, "hot")) == 2, "a second copy for the load of both routers", 40)
        wait_for(lambda: len(copies(routers[1].url, "hot")) == 2, "the other router to see it", 10)
    finally:
        stop.set()
        for sender in senders:
            sender.join()
    assert failures == []
    assert loads(w1.url, "hot") + loads(w2.url, "hot") == 2  # the first copy and one more
