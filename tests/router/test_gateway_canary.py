"""Versions side by side, through a real router to real workers: version 1, a 10% canary of version 2,
the canary at 100%, then version 2 promoted and version 1 gone, with zero failed requests. Every answer
names the version that computed it, and its numbers are that version's (v1 doubles, v2 triples)."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx

from gateway_helpers import wait_for
from hotset_testing import ballast_framework as ballast

MiB = 2**20
FACTOR = {"1": 2.0, "2": 3.0}


def write_store(path: Path, folders: dict[str, Path], version: str, canary_weight: int | None) -> None:
    """The model store file as the operator writes it (workers follow it; routers learn it from their reports)."""
    entry = {"id": "m", "framework": "torchvision", "task": "tensor", "version": version,
             "source": f"file://{folders[version]}", "memory": MiB}
    if canary_weight is not None:
        entry["rollout"] = {"canary": {"version": "2", "source": f"file://{folders['2']}", "weight": canary_weight}}
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps({"models": [entry]}))
    scratch.replace(path)  # atomically, as a ConfigMap volume swaps its files


class Traffic:
    """Requests for `m` back to back on a thread; every answer's status, version and value."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[int, str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                answer = client.post("/predict", json={"model_id": "m", "input_data": [1]})
                version = answer.headers.get("x-hotset-model-version", "")
                value = answer.json()["predictions"]["scaled"][0] if answer.status_code == 200 else float("nan")
                self.answers.append((answer.status_code, version, value))

    def __enter__(self) -> "Traffic":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def since(self, mark: int) -> list[tuple[int, str, float]]:
        return self.answers[mark:]


def versions_held(workers) -> set[str]:
    return {c["version"] for w in workers for c in httpx.get(f"{w.url}/status", timeout=5).json()["models"]
            if c["state"] in ("READY", "UNLOADING")}


def test_a_canary_takes_its_share_then_all_then_is_promoted_with_no_failed_request(procs, tmp_path) -> None:
    folders = {v: ballast.write_model(tmp_path / f"m-v{v}", MiB, factor=f) for v, f in FACTOR.items()}
    store = tmp_path / "model-store.json"
    write_store(store, folders, version="1", canary_weight=None)
    workers = procs.workers(store, ["64Mi", "64Mi"])
    router = procs.router(workers)
    with Traffic(router.url) as traffic:
        wait_for(lambda: len(traffic.answers) >= 20, "answers from version 1", 30)

        write_store(store, folders, version="1", canary_weight=10)
        wait_for(lambda: any(v == "2" for _, v, _ in traffic.answers), "a first answer from the canary", 30)
        mark = len(traffic.answers)
        wait_for(lambda: len(traffic.since(mark)) >= 400, "400 answers with the canary at 10%", 120)
        share = sum(v == "2" for _, v, _ in traffic.since(mark)[:400]) / 400
        assert 0.04 <= share <= 0.18, share  # 10% +- 3 standard deviations of 400 draws

        write_store(store, folders, version="1", canary_weight=100)
        wait_for(lambda: all(v == "2" for _, v, _ in traffic.answers[-20:]), "the canary answering everything", 30)
        mark = len(traffic.answers)
        wait_for(lambda: len(traffic.since(mark)) >= 50, "50 answers with the canary at 100%", 60)
        assert {v for _, v, _ in traffic.since(mark)} == {"2"}

        write_store(store, folders, version="2", canary_weight=None)  # promote: version 2 is the model's own
        wait_for(lambda: versions_held(workers) == {"2"} and all(v == "2" for _, v, _ in traffic.answers[-20:]),
                 "version 1 gone from every worker", 60)

    statuses = {status for status, _, _ in traffic.answers}
    assert statuses == {200}, [a for a in traffic.answers if a[0] != 200][:5]
    assert all(value == FACTOR[version] for _, version, value in traffic.answers)  # each answer from its own weights
