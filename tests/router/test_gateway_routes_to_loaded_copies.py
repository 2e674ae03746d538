"""Through the router to real worker processes: a loaded copy is used where it is; a cold model loads once."""
from __future__ import annotations

import asyncio

import httpx

from gateway_helpers import copies, loads, worker_models, write_ballast_store


def test_model_loaded_on_pod_two_is_routed_there_not_loaded_on_pod_one(procs, tmp_path):
    store = write_ballast_store(tmp_path, {"a": {"mib": 8}, "b": {"mib": 8}})
    w1, w2 = procs.workers(store, ["200Mi", "200Mi"])
    assert httpx.post(f"{w2.url}/v2/repository/models/a/load", timeout=30).status_code == 200
    router = procs.router([w1, w2])
    for _ in range(10):
        response = httpx.post(f"{router.url}/predict", json={"model_id": "a", "input_data": [1, 2]}, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["predictions"] == {"model": "a", "scaled": [2.0, 4.0]}
    assert worker_models(w1.url) == {}
    assert loads(w1.url, "a") == 0 and loads(w2.url, "a") == 1
    assert copies(router.url, "a") == ["worker-2"]


def test_twenty_concurrent_requests_for_a_cold_model_cause_one_load(procs, tmp_path):
    store = write_ballast_store(tmp_path, {"slow": {"mib": 8, "delay": 1.0}})
    w1, w2 = procs.workers(store, ["200Mi", "200Mi"])
    router = procs.router([w1, w2])

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"model_id": "slow", "input_data": [1.5]}
            return await asyncio.gather(*(client.post(f"{router.url}/predict", json=body) for _ in range(20)))

    answers = asyncio.run(burst())
    assert [a.status_code for a in answers] == [200] * 20
    assert all(a.json()["predictions"]["scaled"] == [3.0] for a in answers)
    assert loads(w1.url, "slow") + loads(w2.url, "slow") == 1
    assert len(copies(router.url, "slow")) == 1
