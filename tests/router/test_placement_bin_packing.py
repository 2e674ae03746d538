"""Placement: best fit for cold models, the worker's own cheapest eviction when nothing fits, the
shortest admission queue when nothing can be evicted now, spread for replicas."""
from __future__ import annotations

from hotset_common.eviction import Candidate, EvictionPolicy
from hotset_router.placement import (
    PlacementSettings,
    PodRoom,
    best_fit,
    place_cold,
    place_replica,
    spread_first,
)

MiB = 2**20
SETTINGS = PlacementSettings(granularity_bytes=1)
POLICY = EvictionPolicy(churn_guard_s=30.0)


def pod(name: str, free_mib: int, budget_mib: int = 1000, node: str = "", copies: tuple[Candidate, ...] = (),
        pinned_mib: int = 0, queued: int = 0, free_slots: int | None = None) -> PodRoom:
    return PodRoom(f"http://{name}", name, free_mib * MiB, budget_mib * MiB, node, copies, POLICY, free_slots,
                   pinned_mib * MiB, queued)


def copy(model: str, mib: int, idle_s: float, age_s: float = 600.0, load_s: float = 1.0, frequency: float = 1.0,
         queued: int = 0, priority: int = 0) -> Candidate:
    return Candidate(model, mib * MiB, idle_s=idle_s, age_s=age_s, load_seconds=load_s, frequency=frequency, queued=queued,
                     priority=priority)


def test_cold_model_goes_to_the_tightest_pod_it_fits():
    pods = [pod("roomy", 900), pod("tight", 320), pod("too-small", 250)]
    decision = place_cold("m", 300 * MiB, pods, SETTINGS)
    assert decision.url == "http://tight" and decision.reason == "fit" and decision.evicts == ()


def test_spread_first_picks_the_emptiest_pod_instead():
    pods = [pod("roomy", 900), pod("tight", 320)]
    assert spread_first("m", 300 * MiB, pods).url == "http://roomy"


def test_model_that_fits_nowhere_evicts_where_it_costs_least():
    # a: must drop a model that is wanted often and slow to load; b: two rarely wanted quick ones.
    a = pod("a", 100, copies=(copy("big-hot", 500, idle_s=1, load_s=5.0, frequency=40),))
    b = pod("b", 100, copies=(copy("small-idle", 150, idle_s=900, load_s=0.2), copy("tiny-idle", 100, idle_s=800, load_s=0.2)))
    decision = place_cold("new", 300 * MiB, [a, b], SETTINGS)
    assert decision.url == "http://b"
    assert decision.reason == "evict"
    assert decision.evicts == ("small-idle", "tiny-idle")
    assert decision.cost == 2 * 0.2  # reload seconds given up: frequency x load seconds


def test_eviction_plan_follows_the_workers_policy_order():
    b = pod("b", 0, copies=(copy("recent", 200, idle_s=5), copy("oldest", 200, idle_s=500), copy("older", 200, idle_s=50)))
    assert place_cold("new", 350 * MiB, [b], SETTINGS).evicts == ("oldest", "older")  # equals: LRU order
    costly = pod("c", 0, copies=(copy("slow-to-load", 200, idle_s=500, load_s=8.0), copy("quick", 200, idle_s=5)))
    assert place_cold("new", 150 * MiB, [costly], SETTINGS).evicts == ("quick",)  # cheap to reload goes first


def test_pinned_and_waited_for_copies_are_never_planned_and_just_loaded_ones_go_last():
    guarded = pod("guarded", 0, copies=(copy("waited-for", 500, idle_s=999, queued=3),), pinned_mib=500)
    other = pod("other", 0, copies=(copy("fresh", 300, idle_s=1, age_s=2), copy("busy", 500, idle_s=1)))
    decision = place_cold("new", 400 * MiB, [guarded, other], SETTINGS)
    assert decision.url == "http://other" and decision.evicts == ("busy",)  # fresh is inside the churn guard
    assert place_cold("new", 700 * MiB, [other], SETTINGS).evicts == ("busy", "fresh")  # ...which orders, never refuses


def test_a_model_that_cannot_be_admitted_now_queues_on_the_shortest_queue_where_it_could_ever_fit():
    busy = (copy("x", 500, idle_s=1, queued=1),)
    pods = [pod("long", 0, copies=busy, queued=7), pod("short", 0, copies=busy, queued=2),
            pod("pinned-full", 0, pinned_mib=900, queued=0)]
    decision = place_cold("new", 400 * MiB, pods, SETTINGS)
    assert (decision.url, decision.reason) == ("http://short", "queue")


def test_the_model_count_limit_is_planned_like_bytes():
    full = pod("full", 900, free_slots=0, copies=(copy("idle", 10, idle_s=60),))
    decision = place_cold("new", 100 * MiB, [full], SETTINGS)
    assert (decision.reason, decision.evicts) == ("evict", ("idle",))
    assert place_cold("new", 100 * MiB, [pod("spare", 900, free_slots=1)], SETTINGS).reason == "fit"


def test_model_larger_than_every_budget_has_no_placement():
    assert place_cold("huge", 2000 * MiB, [pod("a", 1000), pod("b", 1000)], SETTINGS) is None


def test_ties_are_broken_the_same_way_every_time():
    pods = [pod(f"p{i}", 500) for i in range(5)]
    chosen = {best_fit("m", 100 * MiB, pods, SETTINGS).url for _ in range(10)}
    reversed_choice = best_fit("m", 100 * MiB, list(reversed(pods)), SETTINGS).url
    assert len(chosen) == 1 and reversed_choice in chosen
    # different models spread over the tied pods instead of all landing on one
    assert len({best_fit(f"model-{i}", 100 * MiB, pods, SETTINGS).url for i in range(20)}) > 1


def test_replica_goes_to_another_pod_preferring_another_node():
    pods = [pod("holder", 500, node="n1"), pod("same-node", 200, node="n1"), pod("other-node", 800, node="n2")]
    decision = place_replica("m", 100 * MiB, pods, ["http://holder"], SETTINGS)
    assert decision.url == "http://other-node"


def test_replica_falls_back_to_the_same_node_when_no_other_node_has_room():
    pods = [pod("holder", 500, node="n1"), pod("same-node", 200, node="n1"), pod("other-node", 50, node="n2", budget_mib=50)]
    assert place_replica("m", 100 * MiB, pods, ["http://holder"], SETTINGS).url == "http://same-node"
    assert place_replica("m", 100 * MiB, pods[:1], ["http://holder"], SETTINGS) is None


def test_a_load_is_placed_where_it_may_evict_and_waits_where_only_higher_priorities_are():
    # a holds one idle, cheap copy of priority 50; b a busy, costly one of priority 0
    a = pod("a", 0, copies=(copy("vip", 300, idle_s=900, load_s=0.1, priority=50),))
    b = pod("b", 0, copies=(copy("popular", 300, idle_s=1, load_s=5.0, frequency=40),))
    assert place_cold("new", 300 * MiB, [a, b], SETTINGS, priority=50).evicts == ("vip",)  # equals: the cost model
    decision = place_cold("new", 300 * MiB, [a, b], SETTINGS, priority=10)
    assert (decision.url, decision.evicts) == ("http://b", ("popular",))  # vip is above it: never its victim
    assert place_cold("new", 300 * MiB, [a], SETTINGS, priority=10).reason == "queue"  # waits for room there
