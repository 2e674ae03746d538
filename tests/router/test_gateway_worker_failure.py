"""Killing a real worker process mid-traffic: requests keep succeeding on the other copy; the pod leaves the map."""
from __future__ import annotations

import threading

import httpx

from gateway_helpers import copies, wait_for, write_ballast_store


def test_killed_worker_is_routed_around_and_leaves_models(procs, tmp_path):
    store = write_ballast_store(tmp_path, {"shared": {"mib": 8, "max": 2}, "solo": {"mib": 8}})
    w1, w2 = procs.workers(store, ["200Mi", "200Mi"])
    for worker in (w1, w2):
        assert httpx.post(f"{worker.url}/v2/repository/models/shared/load", timeout=30).status_code == 200
    assert httpx.post(f"{w1.url}/v2/repository/models/solo/load", timeout=30).status_code == 200
    router = procs.router([w1, w2], store=store)
    assert copies(router.url, "shared") == ["worker-1", "worker-2"]

    stop = threading.Event()
    codes: list[int] = []

    def traffic() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                codes.append(client.post(f"{router.url}/predict", json={"model_id": "shared", "input_data": [1]}).status_code)

    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        wait_for(lambda: len(codes) > 20, "traffic before the kill")
        w1.kill()
        killed_at = len(codes)
        wait_for(lambda: len(codes) > killed_at + 50, "traffic after the kill")
    finally:
        stop.set()
        sender.join()
    assert set(codes) == {200}, f"{len(codes) - codes.count(200)} of {len(codes)} requests failed: {set(codes)}"

    report = httpx.get(f"{router.url}/models", timeout=5).json()
    assert copies(router.url, "shared") == ["worker-2"]
    assert all(c["pod"] != "worker-1" for cs in report["copies"].values() for c in cs)
    assert [p["pod"] for p in httpx.get(f"{router.url}/router/pods", timeout=5).json()] == ["worker-2"]
    # a model whose only copy died is placed again on a live pod
    response = httpx.post(f"{router.url}/predict", json={"model_id": "solo", "input_data": [2]}, timeout=30)
    assert response.status_code == 200, response.text
    assert copies(router.url, "solo") == ["worker-2"]
