"""Which models stay when the cache is full: the shared cost model, as the manager applies it.

Between equals (same size, same load cost, one request each) the least recently
used goes first; a model that is wanted often, or costs more to load again,
stays longer; a model that requests are waiting for is never the victim.
"""
from __future__ import annotations

import pytest

from hotset_common.eviction import DEFAULT_HALF_LIFE_S, Candidate, EvictionPolicy, choose_victims, eviction_cost
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB



async def request_in_order(manager, ids: list[str], now: list[float] | None = None) -> None:
    """One request each, in order; with `now` (the manager's clock), ten demand half-lives apart, so
    recency outweighs any difference in the measured load seconds of equal models (real time,
    which a busy machine spreads by a few ms)."""
    for model_id in ids:
        if now is not None:
            now[0] += 10 * DEFAULT_HALF_LIFE_S
        async with manager.use(model_id):
            pass


@pytest.mark.parametrize(
    ("requests", "expected"),
    [(["a", "b", "c"], ["b", "c"]), (["a", "b", "a", "c"], ["a", "c"])],
)
async def test_room_for_two_by_bytes_keeps_the_two_most_recent(tmp_path, requests, expected) -> None:
    now = [0.0]
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "memory": MiB} for key in "abc"})
    manager = ballast.manager(store, budget=2 * MiB, clock=lambda: now[0])
    try:
        await request_in_order(manager, requests, now)
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
    now = [0.0]
    store = ballast.catalog(tmp_path, {key: {"size": 1024} for key in "abc"})
    manager = ballast.manager(store, budget=100 * MiB, max_models=2, clock=lambda: now[0])
    try:
        await request_in_order(manager, requests, now)
        assert manager.loaded_ids() == expected
    finally:
        await manager.close()


async def test_a_popular_model_outlives_a_more_recent_one_hit_model(tmp_path) -> None:
    now = [0.0]
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "memory": MiB} for key in "hoc"})
    manager = ballast.manager(store, budget=2 * MiB, clock=lambda: now[0], policy=EvictionPolicy(churn_guard_s=0))
    try:
        for _ in range(5):
            await request_in_order(manager, ["h"])  # h: five requests
        now[0] = 1.0
        await request_in_order(manager, ["o"])  # o: one request, more recent than h's last
        now[0] = 2.0
        await request_in_order(manager, ["c"])  # LRU would evict h; its demand keeps it
        assert manager.loaded_ids() == ["c", "h"]
    finally:
        await manager.close()


async def test_a_just_loaded_model_is_kept_while_an_older_one_can_go(tmp_path) -> None:
    now = [0.0]
    store = ballast.catalog(tmp_path, {key: {"size": MiB, "memory": MiB} for key in "abc"})
    manager = ballast.manager(store, budget=2 * MiB, clock=lambda: now[0], policy=EvictionPolicy(churn_guard_s=5),
                              admission_control=False)  # the victim's choice, not whether c is worth keeping
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


def test_the_policy_orders_by_reload_seconds_per_byte_with_its_guards_folded_in() -> None:
    policy = EvictionPolicy(churn_guard_s=10)
    candidates = [
        Candidate("fresh", 1, idle_s=5, age_s=5, load_seconds=0.1, frequency=1),
        Candidate("busy", 1, idle_s=90, age_s=100, load_seconds=0.1, frequency=1, inflight=3),
        Candidate("costly", 1, idle_s=80, age_s=100, load_seconds=2.0, frequency=1),
        Candidate("popular", 1, idle_s=80, age_s=100, load_seconds=0.1, frequency=30),
        Candidate("big", 10, idle_s=50, age_s=100, load_seconds=0.1, frequency=1),
        Candidate("idle-old", 1, idle_s=80, age_s=100, load_seconds=0.1, frequency=1),
        Candidate("waited-for", 1, idle_s=99, age_s=100, load_seconds=0.1, frequency=0.1, queued=2),
    ]
    order = [c.model_id for c in policy.order(candidates)]
    # big frees the most bytes per reload second; fresh counts 1.5x inside the churn guard (so it outlives
    # an equal older copy, not a more valuable one); busy goes after every idle copy; waited-for never.
    assert order == ["big", "idle-old", "fresh", "costly", "popular", "busy"]
    # When only a model-count slot is short, size does not matter: big is as valuable as idle-old.
    assert [c.model_id for c in policy.order(candidates, per_byte=False)][:2] == ["idle-old", "big"]


def test_choose_victims_takes_the_shortest_prefix_that_frees_enough() -> None:
    policy = EvictionPolicy(churn_guard_s=0)
    candidates = [Candidate(name, size, idle_s=t) for name, size, t in [("x", 3, 9), ("y", 3, 8), ("z", 3, 7)]]
    assert [c.model_id for c in choose_victims(policy, candidates, bytes_needed=4)] == ["x", "y"]
    assert [c.model_id for c in choose_victims(policy, candidates, bytes_needed=0, slots_needed=1)] == ["x"]
    assert choose_victims(policy, candidates, bytes_needed=10) is None
    assert choose_victims(policy, candidates, bytes_needed=0) == []
    assert eviction_cost([Candidate("q", 1, load_seconds=2.0, frequency=3)]) == pytest.approx(6.0)


def test_lower_priorities_go_first_and_a_load_never_evicts_a_higher_one() -> None:
    policy = EvictionPolicy(churn_guard_s=0)
    candidates = [Candidate("vip", 1, idle_s=900, priority=100), Candidate("std", 1, idle_s=5),
                  Candidate("backfill", 1, idle_s=1, load_seconds=5.0, frequency=40, priority=-5)]
    # the least recently used and the cheapest copy is kept: priority decides before the cost model
    assert [c.model_id for c in policy.order(candidates)] == ["backfill", "std", "vip"]
    assert [c.model_id for c in choose_victims(policy, candidates, bytes_needed=2, priority=0)] == ["backfill", "std"]
    assert choose_victims(policy, candidates, bytes_needed=3, priority=0) is None  # vip stays: the load waits
    assert choose_victims(policy, candidates, bytes_needed=1, priority=-10) is None  # below every copy here
    assert len(choose_victims(policy, candidates, bytes_needed=3, priority=100)) == 3  # equals may evict each other
