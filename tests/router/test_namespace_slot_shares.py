"""The router's request slots shared between namespaces (flood.FloodGuard, hotset_common.shares's rule).

Weighted and work-conserving: a namespace alone may hold all but a small reserve of the slots (here
12 slots, a reserve of 1); once others hold slots, a namespace under its share
``(max_requests - reserve) x w / W`` always gets a free slot, and one over its share gets one only
while the others are not owed it. So a namespace that floods an idle router uses it, and a second
namespace arriving then gets in at once and takes every slot the first gives back until it holds
its share, while the first is refused (503 with Retry-After, naming its share). A model without a
namespace (the local stack) is counted in the slots only. FloodGuard alone, with stand-in lookups
for the namespaces and weights discovery would give it.
"""
from __future__ import annotations

import pytest

from hotset_common import errors
from hotset_router.flood import FloodGuard, Limits

NAMESPACES = {"a1": "team-a", "a2": "team-a", "b1": "team-b", "c1": "team-c", "local": None}


def guard(weights: dict[str, float] | None = None, slots: int = 12) -> FloodGuard:
    given = weights or {}
    return FloodGuard(Limits(max_requests=slots), lambda model: True, 2, namespace_of=NAMESPACES.get,
                      weight_of=lambda namespace: given.get(namespace, 1.0))


def serve(flood: FloodGuard, model: str):
    ticket = flood.admit_whole(10)
    try:
        flood.for_model(ticket, model)
    except errors.HotsetError:
        flood.release(ticket)
        raise
    return ticket


def release_all(flood: FloodGuard, *tickets) -> None:
    for ticket in tickets:
        flood.release(ticket)
    assert flood.held == {} and flood.requests == 0


def test_a_namespace_alone_uses_all_but_the_reserve_and_the_reserve_lets_a_newcomer_in():
    flood = guard()
    a = [serve(flood, "a1" if i % 2 else "a2") for i in range(11)]  # the old rule stopped it at 12 x 1 / (1 + 1)
    with pytest.raises(errors.NoCapacity,
                       match=r"namespace 'team-a' holds 11 of the router's 12 request slots, at or past its share of 11"
                       ) as refused:
        serve(flood, "a1")
    assert refused.value.status_code == 503 and refused.value.headers["Retry-After"] == "2"
    assert flood.requests == 11  # the refused request gave its slot back
    b = serve(flood, "b1")  # the reserve: a namespace not yet served gets in at once
    assert flood.held == {"team-a": 11, "team-b": 1} and flood.requests == 12
    release_all(flood, *a, b)


def test_a_second_namespace_takes_the_slots_the_first_gives_back_until_it_holds_its_share():
    flood = guard()
    a = [serve(flood, "a1") for _ in range(11)]
    b = [serve(flood, "b1")]  # the reserve
    with pytest.raises(errors.NoCapacity, match="serving 12 requests"):
        serve(flood, "b1")  # every slot taken: the slots' own bound, nothing is taken back
    while len(b) < 5:  # team-b's share now: (12 - 1) x 1 / 2
        flood.release(a.pop())
        with pytest.raises(errors.NoCapacity, match=r"team-a' holds \d+ .* its share of 5 .*servingWeight 1 of 2"):
            serve(flood, "a1")  # over its share, and the freed slot is owed to team-b
        b.append(serve(flood, "b1"))  # under its share: never refused while a slot is free
    flood.release(a.pop())
    with pytest.raises(errors.NoCapacity, match="team-a"):
        serve(flood, "a1")  # at its share (6 of 5), and the one free slot is the reserve
    flood.release(a.pop())
    assert flood.held == {"team-a": 5, "team-b": 5} and flood.requests == 10
    a.append(serve(flood, "a1"))  # both hold their shares: the free slots past the reserve go to whoever asks
    for model in ("a1", "b1"):
        with pytest.raises(errors.NoCapacity, match=r"1 free are kept \(0 owed to the others' shares, 1 for a newcomer\)"):
            serve(flood, model)
    c = serve(flood, "c1")  # the reserve lets a third namespace in
    release_all(flood, *a, *b, c)


def test_weights_size_the_shares_and_a_heavier_namespace_waits_for_the_lighter_ones_share():
    flood = guard({"team-a": 3.0}, slots=21)  # reserve 1, 20 to share
    a = [serve(flood, "a1") for _ in range(20)]  # alone: the old rule stopped it at 21 x 3 / (3 + 1)
    b = [serve(flood, "b1")]
    while len(b) < 5:  # team-b's share: 20 x 1 / 4; team-a's 20 x 3 / 4 = 15
        flood.release(a.pop())
        with pytest.raises(errors.NoCapacity, match=r"its share of 15 .*servingWeight 3 of 4"):
            serve(flood, "a1")
        b.append(serve(flood, "b1"))
    flood.release(a.pop())
    flood.release(a.pop())
    a.append(serve(flood, "a1"))  # team-a under its share again (14 of 15): in at once
    assert flood.held == {"team-a": 15, "team-b": 5}
    release_all(flood, *a, *b)


def test_a_light_namespace_alone_is_not_held_to_its_weight():
    flood = guard({"team-a": 0.1})
    a = [serve(flood, "a1") for _ in range(11)]  # its weight matters only against other namespaces'
    release_all(flood, *a)


def test_unnamespaced_models_count_in_the_slots_only():
    flood = guard()
    local = [serve(flood, "local") for _ in range(2)]  # the slots' own bound only
    a = [serve(flood, "a1") for _ in range(9)]  # past the old rule's 6: the slots are idle
    with pytest.raises(errors.NoCapacity, match="its share of 9 "):
        serve(flood, "a1")  # 12 less the reserve less what no namespace holds
    b = serve(flood, "b1")  # a namespace not yet served still gets in
    assert flood.held == {"team-a": 9, "team-b": 1}
    with pytest.raises(errors.NoCapacity, match="serving 12 requests"):
        serve(flood, "local")
    release_all(flood, *local, *a, b)
