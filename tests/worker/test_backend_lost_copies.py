"""The manager drops copies a backend no longer holds, and only those it could have known about.

Ballast models stand in for the backend's models (their spec says
torchvision); `held_now` is what the backend answers. The real sidecar
restart is in test_triton_sidecar_restart.py.
"""
from __future__ import annotations

from hotset_common.spec import Framework
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB


async def test_lost_copies_are_dropped_with_their_bytes_and_load_again(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {"size": MiB}, "b": {"size": 2 * MiB}})
    manager = ballast.manager(store, budget=10 * MiB)
    try:
        await manager.load("a")
        await manager.load("b")

        async def holds_only_a() -> set[str]:
            return {"a"}

        assert await manager.forget_lost_copies(Framework.TORCHVISION, holds_only_a) == ["b"]
        assert manager.loaded_ids() == ["a"]
        await manager.settled()
        assert manager.used_bytes() == manager.committed_bytes() == MiB and ballast.UNLOADS["b"] == 1

        async with manager.use("b") as worker:  # the next request loads it again
            assert worker.predict([1]) == {"model": "b", "scaled": [2.0]}
        assert ballast.LOADS["b"] == 2

        async def no_answer() -> None:
            return None

        assert await manager.forget_lost_copies(Framework.TORCHVISION, no_answer) == []  # proves nothing
        assert await manager.forget_lost_copies(Framework.TRITON, holds_only_a) == []  # other frameworks only
        assert manager.loaded_ids() == ["a", "b"]
    finally:
        await manager.close()


async def test_a_copy_loaded_while_the_backend_was_asked_is_kept(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"a": {"size": MiB}, "late": {"size": MiB}})
    clock_now = [100.0]
    manager = ballast.manager(store, budget=10 * MiB, clock=lambda: clock_now[0])
    try:
        await manager.load("a")

        async def answer_listing_nothing_after_late_loaded() -> set[str]:
            clock_now[0] += 1.0
            await manager.load("late")  # finished after the question: the answer could not know it
            return set()

        assert await manager.forget_lost_copies(Framework.TORCHVISION, answer_listing_nothing_after_late_loaded) == ["a"]
        assert manager.loaded_ids() == ["late"]
    finally:
        await manager.close()
