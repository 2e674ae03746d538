"""Hot-model replication on real workers: a second copy under sustained load, gone again when idle."""
from __future__ import annotations

import threading

import httpx

from gateway_helpers import copies, wait_for, worker_metric, write_ballast_store


def served(url: str, model: str) -> float:
    return worker_metric(url, "hotset_requests_total", model=model)


def test_sustained_load_adds_a_copy_on_the_other_pod_and_idleness_removes_it(procs, tmp_path):
    store = write_ballast_store(tmp_path, {"hot": {"mib": 8, "max": 2}, "cool": {"mib": 8, "max": 2}})
    w1, w2 = procs.workers(store, ["200Mi", "200Mi"])
    router = procs.router([w1, w2], store=store, args=[
        "--replicate-rps-per-copy", "5", "--replicate-window", "1", "--idle-copy-seconds", "2", "--churn-guard-seconds", "1",
    ])
    stop = threading.Event()
    failures: list[str] = []

    def traffic() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                response = client.post(f"{router.url}/predict", json={"model_id": "hot", "input_data": [1]})
                if response.status_code != 200:
                    failures.append(response.text)
                stop.wait(0.02)

    # one slow request for "cool" keeps it at one copy: replication is per model
    assert httpx.post(f"{router.url}/predict", json={"model_id": "cool", "input_data": [1]}, timeout=30).status_code == 200
    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        wait_for(lambda: len(copies(router.url, "hot")) == 2, "a second copy of the hot model", 20)
        assert copies(router.url, "hot") == ["worker-1", "worker-2"]
        before = {w.url: served(w.url, "hot") for w in (w1, w2)}
        wait_for(lambda: all(served(w.url, "hot") > before[w.url] + 5 for w in (w1, w2)), "traffic on both copies", 20)
    finally:
        stop.set()
        sender.join()
    assert failures == []
    assert len(copies(router.url, "cool")) == 1
    wait_for(lambda: len(copies(router.url, "hot")) == 1, "the idle extra copy to go", 20)
    assert httpx.post(f"{router.url}/predict", json={"model_id": "hot", "input_data": [1]}, timeout=30).status_code == 200
