"""A load that fails evicts nothing, names its cause, and the worker keeps serving."""
from __future__ import annotations

import pytest

from hotset_common import errors
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB



@pytest.mark.parametrize(("broken", "cause"), [({"missing": True}, "ballast.json is missing"), ({"corrupt": True}, "corrupt")])
async def test_a_failed_load_into_a_full_cache_evicts_nothing(tmp_path, broken, cause) -> None:
    store = ballast.catalog(
        tmp_path,
        {"a": {"size": MiB, "memory": MiB}, "b": {"size": MiB, "memory": MiB}, "broken": {"memory": MiB, **broken}},
    )
    manager = ballast.manager(store, budget=2 * MiB)
    try:
        await manager.load("a")
        await manager.load("b")
        with pytest.raises(errors.ModelLoadFailed, match=f"'broken'.*{cause}"):
            await manager.load("broken")
        await manager.settled()
        assert manager.loaded_ids() == ["a", "b"]
        assert ballast.UNLOADS == {"broken": 1}  # only its own half-load was cleaned up
        assert manager.failures()["broken"].startswith("loading model 'broken' failed")
        async with manager.use("a") as worker:
            assert worker.predict([1]) == {"model": "a", "scaled": [2.0]}
    finally:
        await manager.close()


async def test_a_source_outside_any_mounted_volume_fails_cleanly(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {"size": MiB}})
    spec = store.get("a").model_copy(update={"id": "elsewhere", "source": "pvc://not-mounted/model"})
    store.put(spec)
    manager = ballast.manager(store, budget=2 * MiB)
    try:
        with pytest.raises(errors.ModelLoadFailed, match="'not-mounted'.*not mounted"):
            await manager.load("elsewhere")
        assert manager.loaded_ids() == []
    finally:
        await manager.close()


async def test_a_framework_that_cannot_be_created_fails_the_load_and_evicts_nothing(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "memory": MiB} for key in ["a", "b", "exotic"]})

    def create_worker(spec, context):
        if spec.id == "exotic":
            raise ImportError("No module named 'exotic_framework'")
        return ballast.create_worker(spec, context)

    manager = ballast.ModelManager(store, ballast.WorkerContext(), 2 * MiB, create_worker=create_worker)
    try:
        await manager.load("a")
        await manager.load("b")
        with pytest.raises(errors.ModelLoadFailed, match="'exotic' failed: ImportError: No module named 'exotic_framework'"):
            await manager.load("exotic")
        assert manager.loaded_ids() == ["a", "b"]
    finally:
        await manager.close()
