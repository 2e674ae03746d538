"""A spec change that alters what is loaded is a rollout: the old copy serves until the new one is
loaded and warmed up, then the new one takes over; every answer names the version that computed it."""
from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app
from hotset_worker.manager import RequestTiming

FACTOR = {"1": 2.0, "2": 3.0}  # each version's weights answer differently


@pytest.fixture(autouse=True)
def _counters() -> None:
    ballast.reset_counters()


def version_2(tmp_path, store, delay: float = 0.3, warmup=None, missing: bool = False):
    folder = tmp_path / "m-v2"
    if not missing:
        ballast.write_model(folder, MiB, load_delay_s=delay, factor=FACTOR["2"])
    spec = ballast.make_spec("m", folder, memory=MiB, version="2", warmup=warmup or [])
    store.put(spec)


async def ask(manager) -> tuple[str, float]:
    timing = RequestTiming()
    async with manager.use("m", timing=timing) as worker:
        answer = await asyncio.to_thread(worker.predict, [1])
    return timing.version, answer["scaled"][0]


async def test_a_new_version_takes_over_without_a_failed_request_or_a_mislabelled_answer(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"m": {"size": MiB, "memory": MiB, "factor": FACTOR["1"]}})
    manager = ballast.manager(store, budget=2 * MiB)
    try:
        assert await ask(manager) == ("1", 2.0)
        version_2(tmp_path, store, warmup=[[1]])
        answers = []
        for _ in range(60):  # requests keep coming while version 2 loads (0.3 s) and takes over
            answers.append(await ask(manager))
            await asyncio.sleep(0.01)
        assert all(value == FACTOR[version] for version, value in answers)  # each answer from the weights it names
        versions = [version for version, _ in answers]
        assert versions[0] == "1" and versions[-1] == "2"  # the old copy served while the new one loaded
        assert versions == sorted(versions)  # once switched, never back
        await manager.settled()
        assert manager.loaded_ids() == ["m"] and ballast.UNLOADS["m"] == 1  # the old copy is gone
        assert manager.used_bytes() == MiB
    finally:
        await manager.close()


async def test_a_failed_rollout_leaves_the_old_version_serving_and_says_why(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"m": {"size": MiB, "memory": MiB, "factor": FACTOR["1"]}})
    manager = ballast.manager(store, budget=2 * MiB, failure_backoff_s=60)
    try:
        await ask(manager)
        version_2(tmp_path, store, missing=True)
        assert manager.roll_stale_copies() == ["m"]
        await manager.settled()
        assert await ask(manager) == ("1", 2.0)  # still served, by the version that works
        (view,) = manager.snapshot()
        assert view.version == "1" and "rollout to version 2 failed" in view.reason and "m-v2" in view.reason
        assert manager.roll_stale_copies() == []  # not retried within the back-off
    finally:
        await manager.close()


def test_answers_and_status_name_the_version(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"m": {"size": MiB, "memory": MiB}})
    with TestClient(ballast_app(store, 10 * MiB)) as client:
        answer = client.post("/predict", json={"model_id": "m", "input_data": [1]})
        assert answer.json()["model_version"] == "1" and answer.headers["x-hotset-model-version"] == "1"
        (copy,) = client.get("/status").json()["models"]
        assert copy["version"] == "1"
