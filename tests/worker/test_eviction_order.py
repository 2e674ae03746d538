"""Which models stay when the cache is full: least recently used goes first."""
from __future__ import annotations

import pytest

from modelplane_testing import ballast_framework as ballast
from modelplane_testing.ballast_framework import MiB
from modelplane_worker import eviction


@pytest.fixture(autouse=True)
def _counters() -> None:
    ballast.reset_counters()


async def request_in_order(manager, ids: list[str]) -> None:
    for model_id in ids:
        async with manager.use(model_id):
            pass


@pytest.mark.parametrize(
    ("requests", "expected"),
    [(["a", "b", "c"], ["b", "c"]), (["a", "b", "a", "c"], ["a", "c"])],
)
async def test_room_for_two_by_bytes_keeps_the_two_most_recent(tmp_path, requests, expected) -> None:
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "memory": MiB} for key in "abc"})
    manager = ballast.manager(store, budget=2 * MiB)
    try:
        await request_in_order(manager, requests)
        assert manager.loaded_ids() == expected
        await manager.settled()
        assert ballast.UNLOADS == {key: 1 for key in "abc" if key not in expected}
    finally:
        await manager.close()


@pytest.mark.parametrize(
    ("requests", "expected"),
    [(["a", "b", "c"], ["b", "c"]), (["a", "b", "a", "c"], ["a", "c"])],
)
async def test_room_for_two_by_count_keeps_the_two_most_recent(tmp_path, requests, expected) -> None:
    store = ballast.catalog(tmp_path, {key: {"size": 1024} for key in "abc"})
    manager = ballast.manager(store, budget=100 * MiB, max_models=2)
    try:
        await request_in_order(manager, requests)
        assert manager.loaded_ids() == expected
    finally:
        await manager.close()


async def test_a_just_loaded_model_is_kept_while_an_older_one_can_go(tmp_path) -> None:
    now = [0.0]
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "memory": MiB} for key in "abc"})
    manager = ballast.manager(store, budget=2 * MiB, clock=lambda: now[0], policy=eviction.LRUPolicy(min_residency_s=5))
    try:
        await request_in_order(manager, ["a"])
        now[0] = 100.0
        await request_in_order(manager, ["b"])  # b loaded at t=100
        now[0] = 100.5
        await request_in_order(manager, ["a"])  # a is now the most recently used...
        now[0] = 100.6
        await request_in_order(manager, ["c"])  # ...but b was loaded 0.6 s ago, so a goes
        assert manager.loaded_ids() == ["b", "c"]
    finally:
        await manager.close()


def test_lru_policy_orders_idle_before_busy_and_old_before_new() -> None:
    policy = eviction.LRUPolicy(min_residency_s=10)
    candidates = [
        eviction.Candidate("fresh", 1, last_used=95, loaded_at=95),
        eviction.Candidate("busy", 1, last_used=10, loaded_at=0, inflight=3),
        eviction.Candidate("idle-recent", 1, last_used=50, loaded_at=0),
        eviction.Candidate("idle-old", 1, last_used=20, loaded_at=0),
    ]
    order = [c.model_id for c in policy.order(candidates, now=100)]
    assert order == ["idle-old", "idle-recent", "busy", "fresh"]


def test_choose_victims_takes_the_shortest_prefix_that_frees_enough() -> None:
    policy = eviction.LRUPolicy(min_residency_s=0)
    candidates = [eviction.Candidate(name, size, last_used=t, loaded_at=0) for name, size, t in [("x", 3, 1), ("y", 3, 2), ("z", 3, 3)]]
    assert [c.model_id for c in eviction.choose_victims(policy, candidates, 10, bytes_needed=4)] == ["x", "y"]
    assert eviction.choose_victims(policy, candidates, 10, bytes_needed=10) is None
    assert eviction.choose_victims(policy, candidates, 10, bytes_needed=0) == []
