"""Placement: best fit for cold models, cheapest eviction when nothing fits, spread for replicas."""
from __future__ import annotations

from modelplane_router.placement import (
    PlacementSettings,
    PodRoom,
    ResidentCopy,
    best_fit,
    place_cold,
    place_replica,
    spread_first,
)

MiB = 2**20
SETTINGS = PlacementSettings(granularity_bytes=1, churn_guard_s=30.0)


def pod(name: str, free_mib: int, budget_mib: int = 1000, node: str = "", copies: tuple[ResidentCopy, ...] = ()) -> PodRoom:
    return PodRoom(f"http://{name}", name, free_mib * MiB, budget_mib * MiB, node, copies)


def copy(model: str, mib: int, idle_s: float, age_s: float = 600.0, pinned: bool = False) -> ResidentCopy:
    return ResidentCopy(model, mib * MiB, idle_s=idle_s, age_s=age_s, pinned=pinned)


def test_cold_model_goes_to_the_tightest_pod_it_fits():
    pods = [pod("roomy", 900), pod("tight", 320), pod("too-small", 250)]
    decision = place_cold("m", 300 * MiB, pods, SETTINGS)
    assert decision.url == "http://tight" and decision.reason == "fit" and decision.evicts == ()


def test_spread_first_picks_the_emptiest_pod_instead():
    pods = [pod("roomy", 900), pod("tight", 320)]
    assert spread_first("m", 300 * MiB, pods).url == "http://roomy"


def test_model_that_fits_nowhere_evicts_where_it_costs_least():
    # a: must drop a big, recently used model; b: two small idle ones.
    a = pod("a", 100, copies=(copy("big-hot", 500, idle_s=1),))
    b = pod("b", 100, copies=(copy("small-idle", 150, idle_s=900), copy("tiny-idle", 100, idle_s=800)))
    decision = place_cold("new", 300 * MiB, [a, b], SETTINGS)
    assert decision.url == "http://b"
    assert decision.reason == "evict"
    assert decision.evicts == ("small-idle", "tiny-idle")


def test_eviction_plan_follows_the_workers_lru_order():
    b = pod("b", 0, copies=(copy("recent", 200, idle_s=5), copy("oldest", 200, idle_s=500), copy("older", 200, idle_s=50)))
    decision = place_cold("new", 350 * MiB, [b], SETTINGS)
    assert decision.evicts == ("oldest", "older")


def test_pinned_and_just_loaded_copies_are_never_planned_for_eviction():
    guarded = pod("guarded", 0, copies=(copy("pinned", 500, idle_s=999, pinned=True), copy("fresh", 500, idle_s=999, age_s=2)))
    other = pod("other", 0, copies=(copy("busy", 500, idle_s=1),))
    decision = place_cold("new", 400 * MiB, [guarded, other], SETTINGS)
    assert decision.url == "http://other" and decision.evicts == ("busy",)
    assert place_cold("new", 400 * MiB, [guarded], SETTINGS) is None


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
