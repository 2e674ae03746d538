"""A failed load shows up as a FAILED copy (and UNAVAILABLE in the index) until it is fixed or unloaded.

It holds no memory and counts as loaded nowhere; within the back-off window a
retry answers the recorded error without loading again; after the window a
fixed source loads. Time is an injected clock, so nothing here sleeps.
"""
from __future__ import annotations

import httpx

from hotset_common import wire
from hotset_common.spec import ModelSpec
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, free_port, serve_in_thread

BACKOFF_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now



def status_of(client: httpx.Client) -> wire.WorkerStatus:
    return wire.WorkerStatus.model_validate(client.get("/status").json())


def index_of(client: httpx.Client) -> dict[str, dict[str, str]]:
    return {entry["name"]: entry for entry in client.post("/v2/repository/index").json()}


def predict(client: httpx.Client, model_id: str) -> httpx.Response:
    return client.post("/predict", json={"model_id": model_id, "input_data": [1]})


def test_a_failed_load_is_reported_backs_off_and_a_fixed_source_then_loads(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {"size": MiB}, "b": {"size": MiB}, "broken": {"missing": True, "memory": MiB}})
    clock = Clock()
    app = ballast_app(store, budget=2 * MiB, clock=clock, failure_backoff_s=BACKOFF_S)
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as client:
        assert predict(client, "a").status_code == 200 and predict(client, "b").status_code == 200

        failed = predict(client, "broken")
        assert failed.status_code == 500 and "ballast.json is missing" in failed.json()["error"]
        clock.now += 2.0

        status = status_of(client)
        copies = {copy.id: copy for copy in status.models}
        assert copies["broken"].state is wire.CopyState.FAILED and copies["broken"].bytes == 0
        assert "ballast.json is missing" in copies["broken"].reason and copies["broken"].failed_at_s == 2.0
        assert {key: copy.state for key, copy in copies.items() if key != "broken"} == {"a": wire.CopyState.READY, "b": wire.CopyState.READY}
        assert status.used_bytes == 2 * MiB and status.ready  # nothing evicted, the pod still serves
        assert list(client.get("/models").json()["loaded_models"]) == ["a", "b"]
        assert client.get("/v2/models/broken/ready").status_code == 503
        entry = index_of(client)["broken"]
        assert entry["state"] == "UNAVAILABLE" and "ballast.json is missing" in entry["reason"]
        assert [e["name"] for e in client.post("/v2/repository/index", json={"ready": True}).json()] == ["a", "b"]

        # Within the back-off: the same error at once, no new load, even once the source is fixed.
        ballast.write_model(tmp_path / "broken", MiB)
        for retry in (predict(client, "broken"), client.post("/v2/repository/models/broken/load")):
            assert retry.status_code == 500 and "ballast.json is missing" in retry.json()["error"]
            assert "not retried for another 28.0s" in retry.json()["error"] and retry.headers["Retry-After"] == "28"
        assert ballast.ATTEMPTS["broken"] == 1

        clock.now += BACKOFF_S  # after the window, a request loads again (evicting the least recently used)
        assert predict(client, "broken").json()["predictions"] == {"model": "broken", "scaled": [2.0]}
        assert ballast.ATTEMPTS["broken"] == 2
        copies = {copy.id: copy for copy in status_of(client).models}
        assert copies["broken"].state is wire.CopyState.READY and copies["broken"].reason == ""
        assert index_of(client)["broken"] == {"name": "broken", "version": "1", "state": "READY", "reason": ""}
        assert ballast.UNLOADS["a"] == 1 and "b" in copies


def test_unloading_a_model_clears_its_failure(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"broken": {"corrupt": True}})
    with serve_in_thread(ballast_app(store, budget=2 * MiB)) as url, httpx.Client(base_url=url) as client:
        assert client.post("/v2/repository/models/broken/load").status_code == 500
        assert [c.state for c in status_of(client).models] == [wire.CopyState.FAILED]
        assert client.post("/v2/repository/models/broken/unload").status_code == 200
        assert status_of(client).models == []
        assert index_of(client)["broken"]["reason"] == "unloaded"


def test_a_down_sidecar_is_asked_again_at_once_rather_than_backed_off(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {})
    store.put(ModelSpec(id="tri", framework="triton", source=f"file://{tmp_path}/tri"))
    app = ballast_app(store, budget=2 * MiB, triton_url=f"127.0.0.1:{free_port()}", failure_backoff_s=BACKOFF_S)
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as client:
        for _ in range(2):
            down = predict(client, "tri")
            assert down.status_code == 503 and "not ready" in down.json()["error"]
            assert "not retried" not in down.json()["error"]
        (copy,) = status_of(client).models
        assert copy.state is wire.CopyState.FAILED and "not ready" in copy.reason
