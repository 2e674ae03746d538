"""Pinned models stay loaded whatever else is requested."""
from __future__ import annotations

import pytest

from hotset_common import errors
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB



async def test_pinned_models_survive_any_sequence_of_requests(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "memory": MiB, "pinned": key == "p"} for key in "pabcd"})
    manager = ballast.manager(store, budget=2 * MiB)
    try:
        assert await manager.load_pinned()
        for model_id in ["a", "b", "c", "d", "a"]:
            async with manager.use(model_id):
                pass
            assert "p" in manager.loaded_ids()
        assert manager.loaded_ids() == ["a", "p"]
        await manager.settled()
        assert "p" not in ballast.UNLOADS
    finally:
        await manager.close()


async def test_pinned_by_the_command_line_counts_as_pinned(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "memory": MiB} for key in "xyz"})
    manager = ballast.manager(store, budget=2 * MiB, pinned=["x"])
    try:
        assert await manager.load_pinned()
        await manager.load("y")
        await manager.load("z")
        assert manager.loaded_ids() == ["x", "z"]
        with pytest.raises(errors.Conflict, match="'x' is pinned"):
            await manager.unload("x")
    finally:
        await manager.close()


async def test_no_room_beside_pinned_models_is_a_503_that_evicts_nothing(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"p": {"size": 2 * MiB, "memory": 2 * MiB, "pinned": True}, "a": {"size": MiB, "memory": MiB}})
    manager = ballast.manager(store, budget=2 * MiB)
    try:
        assert await manager.load_pinned()
        with pytest.raises(errors.NoCapacity, match="pinned: p") as raised:
            await manager.load("a")
        assert raised.value.status_code == 503 and "Retry-After" in raised.value.headers
        assert manager.loaded_ids() == ["p"]
    finally:
        await manager.close()
