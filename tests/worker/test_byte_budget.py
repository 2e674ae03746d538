"""Capacity is counted in bytes: evict as many LRU models as needed, refuse what can never fit."""
from __future__ import annotations

import pytest

from hotset_common import errors
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB


@pytest.fixture(autouse=True)
def _counters() -> None:
    ballast.reset_counters()


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
