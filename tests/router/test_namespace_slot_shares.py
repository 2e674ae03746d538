"""The router's request slots shared between namespaces (flood.FloodGuard's share rule).

A namespace may hold ``max_requests x w / (W + 1)`` slots: W the weights of the namespaces holding
slots now (its own included), the 1 room for a namespace not yet served. So a namespace that floods
the router is refused (503 with Retry-After, naming its share) while another still gets in; a
model without a namespace (the local stack) is not counted.
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


def test_a_namespace_that_floods_is_refused_at_its_share_and_another_still_gets_in():
    flood = guard()
    held = [serve(flood, "a1" if i % 2 else "a2") for i in range(6)]  # alone: 12 x 1 / (1 + 1)
    with pytest.raises(errors.NoCapacity, match="namespace 'team-a' holds 6 of the router's 12 request slots") as refused:
        serve(flood, "a1")
    assert refused.value.status_code == 503 and refused.value.headers["Retry-After"] == "2"
    assert flood.requests == 6  # the refused request gave its slot back
    b = [serve(flood, "b1") for _ in range(4)]  # team-b: 12 x 1 / (2 + 1)
    with pytest.raises(errors.NoCapacity, match="team-b"):
        serve(flood, "b1")
    # team-a, now one of two, is over its new share (4) until its requests end
    with pytest.raises(errors.NoCapacity, match="team-a"):
        serve(flood, "a1")
    for ticket in held[:3]:
        flood.release(ticket)
    held.append(serve(flood, "a1"))  # 3 held, its share 4: one more fits, then no more
    with pytest.raises(errors.NoCapacity):
        serve(flood, "a1")
    for ticket in [*held[3:], *b]:
        flood.release(ticket)
    assert flood.held == {} and flood.requests == 0


def test_weights_size_the_shares_and_unnamespaced_models_are_not_counted():
    flood = guard({"team-a": 3.0}, slots=20)
    b = serve(flood, "b1")
    a = [serve(flood, "a1") for _ in range(12)]  # 20 x 3 / (3 + 1 + 1)
    with pytest.raises(errors.NoCapacity, match=r"servingWeight 3 of 4"):
        serve(flood, "a1")
    local = [serve(flood, "local") for _ in range(7)]  # the slots' own bound only
    assert flood.held == {"team-a": 12, "team-b": 1}
    for ticket in [b, *a, *local]:
        flood.release(ticket)
    assert flood.held == {} and flood.requests == 0
