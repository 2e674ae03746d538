"""A copy is ready only after its spec's warm-up inputs ran; a failing warm-up fails the load, evicts nothing."""
from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from hotset_common import errors
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app



async def test_no_request_reaches_a_copy_before_its_warm_up_ran(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {"size": MiB, "delay": 0.2, "warmup": [[1], [2], [3]]}})
    manager = ballast.manager(store, budget=100 * MiB)
    try:
        async def request(value: int) -> dict:
            async with manager.use("a") as worker:
                return await asyncio.to_thread(worker.predict, [value])

        answers = await asyncio.gather(*(request(v) for v in (10, 20)))  # both arrive while a loads
        assert [a["scaled"] for a in answers] == [[20.0], [40.0]]
        predicts = [e for e in ballast.EVENTS if e.startswith("predict:")]
        assert predicts[:3] == ["predict:a:[1]", "predict:a:[2]", "predict:a:[3]"]  # the warm-up, in order...
        assert sorted(predicts[3:]) == ["predict:a:[10]", "predict:a:[20]"]  # ...before any request
    finally:
        await manager.close()


async def test_a_failing_warm_up_fails_the_load_names_it_and_evicts_nothing(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"kept": {"size": MiB}, "bad": {"size": MiB, "warmup": [[1], "not numbers"]}})
    manager = ballast.manager(store, budget=MiB, failure_backoff_s=60)
    try:
        await manager.load("kept")
        with pytest.raises(errors.WarmupFailed, match="warm-up of model 'bad' failed on input 1 of 2: input_data must be"):
            await manager.load("bad")
        await manager.settled()
        assert manager.loaded_ids() == ["kept"] and ballast.UNLOADS == {"bad": 1}  # its own memory given back
        (failed,) = manager.failed_loads()
        assert (failed.model_id, failed.failure) == ("bad", "WarmupFailed")
    finally:
        await manager.close()


def test_status_names_the_warm_up_failure_and_the_metric_records_warm_ups(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"good": {"size": MiB, "warmup": [[1]]}, "bad": {"size": MiB, "warmup": ["x"]}})
    with TestClient(ballast_app(store, 10 * MiB)) as client:
        assert client.post("/predict", json={"model_id": "good", "input_data": [2]}).status_code == 200
        refused = client.post("/predict", json={"model_id": "bad", "input_data": [2]})
        assert refused.status_code == 500 and "warm-up of model 'bad'" in refused.json()["detail"]
        copies = {c["id"]: c for c in client.get("/status").json()["models"]}
        assert copies["bad"]["state"] == "FAILED" and copies["bad"]["failure"] == "WarmupFailed"
        metrics = client.get("/metrics").text
        assert 'hotset_model_warmup_seconds_count{framework="torchvision",model="good",pod="test-pod"} 1.0' in metrics
