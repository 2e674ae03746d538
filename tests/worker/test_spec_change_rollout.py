"""A spec change that alters what is loaded is a rollout: the old copy serves until the new one is
loaded and warmed up, then the new one takes over; every answer names the version that computed it."""
from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from hotset_common import errors
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app
from hotset_worker.manager import RequestTiming

FACTOR = {"1": 2.0, "2": 3.0}  # each version's weights answer differently



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


async def test_a_rollout_on_a_full_pod_evicts_first_and_never_holds_more_than_the_budget(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"m": {"size": MiB, "memory": MiB, "factor": FACTOR["1"]},
                                       "other": {"size": MiB, "memory": MiB}})
    manager = ballast.manager(store, budget=2 * MiB)
    try:
        await ask(manager)
        async with manager.use("other"):
            pass
        assert sorted(manager.loaded_ids()) == ["m", "other"] and ballast.HELD["bytes"] == 2 * MiB  # full
        version_2(tmp_path, store, delay=0.1)
        manager.roll_stale_copies()
        await manager.settled()
        assert ballast.UNLOADS["other"] == 1  # room beside the old copy was made first...
        assert await ask(manager) == ("2", FACTOR["2"])  # ...and the new version took over
        await manager.settled()
        assert ballast.HELD["peak"] == 2 * MiB  # old + new, never old + new + other
        assert manager.used_bytes() == MiB
        manager.table.check()
    finally:
        await manager.close()


async def test_a_rollout_that_cannot_fit_beside_the_old_copy_waits_and_says_why(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"m": {"size": MiB, "memory": MiB, "factor": FACTOR["1"]}})
    manager = ballast.manager(store, budget=MiB + MiB // 2)  # room for one version, not for two at once
    try:
        await ask(manager)
        version_2(tmp_path, store)
        assert manager.roll_stale_copies() == []
        await manager.settled()
        assert await ask(manager) == ("1", FACTOR["1"])  # the old version serves on
        (view,) = manager.snapshot()
        assert "rollout of 'm' to version 2 waits" in view.reason and "budget of 1.5Mi" in view.reason
        assert ballast.HELD["peak"] == MiB and ballast.LOADS["m"] == 1  # version 2 never loaded
    finally:
        await manager.close()


async def test_a_model_that_measures_more_than_it_declares_is_refused_with_both_figures(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"small": {"size": MiB, "memory": MiB},
                                       "liar": {"size": 3 * MiB, "memory": MiB}})
    manager = ballast.manager(store, budget=4 * MiB)
    try:
        async with manager.use("small"):
            pass
        with pytest.raises(errors.MemoryUnderstated) as refused:
            async with manager.use("liar"):
                pass
        assert refused.value.status_code == 507
        assert "measured 3.0Mi" in refused.value.message and "1.0Mi its spec declares" in refused.value.message
        await manager.settled()
        assert manager.loaded_ids() == ["small"] and ballast.UNLOADS["liar"] == 1  # nothing else was touched
        assert ballast.HELD["bytes"] == MiB
    finally:
        await manager.close()


def test_answers_and_status_name_the_version(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"m": {"size": MiB, "memory": MiB}})
    with TestClient(ballast_app(store, 10 * MiB)) as client:
        answer = client.post("/predict", json={"model_id": "m", "input_data": [1]})
        assert answer.json()["model_version"] == "1" and answer.headers["x-hotset-model-version"] == "1"
        (copy,) = client.get("/status").json()["models"]
        assert copy["version"] == "1"
