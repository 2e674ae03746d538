"""Two router replicas and minimum copies, against real workers.

Two routers that see the same worker reports choose the same pod for a cold
model, and the worker's single-flight load makes it one load (docs/router.md,
"Several router replicas"). Models with ``replicas.min >= 1`` are loaded
before any request arrives.
"""
from __future__ import annotations

import asyncio

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
