"""Capacity is counted in bytes: evict as many LRU models as needed, refuse what can never fit."""
from __future__ import annotations

import pytest

from hotset_common import errors
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_common.budget import BudgetMode



@pytest.fixture
def store(tmp_path):
    return ballast.catalog(
        tmp_path,
        {
            "a": {"size": 3 * MiB, "memory": 3 * MiB},
            "b": {"size": 3 * MiB, "memory": 3 * MiB},
            "c": {"size": 3 * MiB, "memory": 3 * MiB},
            "big": {"size": 7 * MiB, "memory": 7 * MiB},
            "huge": {"size": 11 * MiB, "memory": 11 * MiB},
            "understated": {"size": 11 * MiB, "memory": MiB},
            "overstated": {"size": MiB, "memory": 5 * MiB},
        },
    )


async def load_all(manager, ids) -> None:
    for model_id in ids:
        await manager.load(model_id)


async def test_a_model_larger_than_the_free_bytes_evicts_as_many_lru_models_as_needed(store) -> None:
    manager = ballast.manager(store, budget=10 * MiB)
    try:
        await load_all(manager, ["a", "b", "c"])  # 9 of 10 MiB used
        await manager.load("big")  # needs 7: a and b (least recently used) go, c stays
        assert manager.loaded_ids() == ["big", "c"]
        await manager.settled()
        assert manager.used_bytes() == 10 * MiB
    finally:
        await manager.close()


async def test_a_model_larger_than_the_whole_budget_is_refused_and_evicts_nothing(store) -> None:
    manager = ballast.manager(store, budget=10 * MiB)
    try:
        await load_all(manager, ["a", "b", "c"])
        with pytest.raises(errors.ModelTooLarge, match="'huge'.*whole memory budget"):
            await manager.load("huge")
        assert manager.loaded_ids() == ["a", "b", "c"]
        assert ballast.ATTEMPTS["huge"] == 0  # refused on its estimate, before reading anything
    finally:
        await manager.close()


async def test_a_model_measured_larger_than_the_budget_is_refused_after_loading_and_evicts_nothing(store) -> None:
    manager = ballast.manager(store, budget=10 * MiB)
    try:
        await load_all(manager, ["a", "b", "c"])
        with pytest.raises(errors.ModelTooLarge, match="'understated' measured 11.0Mi"):
            await manager.load("understated")
        await manager.settled()
        assert manager.loaded_ids() == ["a", "b", "c"]
        assert ballast.UNLOADS == {"understated": 1}  # its own memory was given back
        assert manager.used_bytes() == 9 * MiB
    finally:
        await manager.close()


async def test_the_measured_size_replaces_the_estimate(store) -> None:
    manager = ballast.manager(store, budget=10 * MiB)
    try:
        await load_all(manager, ["overstated", "a", "b"])  # estimates 11 MiB, measured 7 MiB
        assert manager.loaded_ids() == ["a", "b", "overstated"]
        assert {view.model_id: view.bytes for view in manager.snapshot()} == {"a": 3 * MiB, "b": 3 * MiB, "overstated": MiB}
    finally:
        await manager.close()


@pytest.mark.parametrize(("mode", "peak"), [(BudgetMode.HARD, 10 * MiB), (BudgetMode.LOAD_FIRST, 16 * MiB)])
async def test_a_hard_budget_evicts_before_loading_and_memory_never_passes_it(store, mode, peak) -> None:
    manager = ballast.manager(store, budget=10 * MiB, budget_mode=mode)
    try:
        await load_all(manager, ["a", "b", "c"])  # 9 of 10 MiB
        await manager.load("big")  # 7: a and b make room
        await manager.settled()
        assert manager.loaded_ids() == ["big", "c"] and ballast.HELD["bytes"] == 10 * MiB
        assert ballast.HELD["peak"] == peak  # hard: a and b were gone before big allocated; load-first: beside it
        manager.table.check()
    finally:
        await manager.close()


async def test_a_hard_budget_still_evicts_nothing_for_a_missing_source_or_framework(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "memory": MiB} for key in ["a", "b", "exotic"]})
    store.put(store.get("a").model_copy(update={"id": "elsewhere", "source": "pvc://not-mounted/model"}))

    def create_worker(spec, context):
        if spec.id == "exotic":
            raise ImportError("No module named 'exotic_framework'")
        return ballast.create_worker(spec, context)

    manager = ballast.ModelManager(store, ballast.WorkerContext(), 2 * MiB, create_worker=create_worker,
                                   budget_mode=BudgetMode.HARD)
    try:
        await load_all(manager, ["a", "b"])  # full
        with pytest.raises(errors.ModelLoadFailed, match="'not-mounted'.*not mounted"):
            await manager.load("elsewhere")
        with pytest.raises(errors.ModelLoadFailed, match="No module named 'exotic_framework'"):
            await manager.load("exotic")
        await manager.settled()
        assert manager.loaded_ids() == ["a", "b"] and not ballast.UNLOADS  # prepared before anything was evicted
    finally:
        await manager.close()


async def test_under_a_hard_budget_weights_that_fail_after_the_room_was_made_leave_it_free(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {"size": MiB, "memory": MiB}, "broken": {"memory": MiB, "corrupt": True}})
    manager = ballast.manager(store, budget=MiB, budget_mode=BudgetMode.HARD)
    try:
        await manager.load("a")
        with pytest.raises(errors.ModelLoadFailed, match="'broken'.*corrupt"):
            await manager.load("broken")
        await manager.settled()
        assert manager.loaded_ids() == [] and ballast.UNLOADS["a"] == 1  # the price of never passing the budget
        async with manager.use("a") as worker:  # ...and the victim loads again on its next request
            assert worker.predict([1]) == {"model": "a", "scaled": [2.0]}
    finally:
        await manager.close()


def test_the_budget_is_hard_on_a_gpu_by_default() -> None:
    assert BudgetMode.AUTO.on("cuda") is BudgetMode.HARD
    assert BudgetMode.AUTO.on("cpu") is BudgetMode.LOAD_FIRST
    assert BudgetMode.HARD.on("cpu") is BudgetMode.HARD
