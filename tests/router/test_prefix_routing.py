"""Prefix-aware choice among ready copies: one prefix, one copy, while that copy has room."""
from __future__ import annotations

import collections

from hotset_router import prefix_routing

COPIES = ["http://a:1", "http://b:1", "http://c:1"]


def idle(_: str) -> int:
    return 0


def test_the_same_prefix_goes_to_the_same_copy_whatever_the_order_of_copies() -> None:
    first = prefix_routing.choose("system: you are terse\n", COPIES, idle)
    assert all(prefix_routing.choose("system: you are terse\n", order, idle) == first
               for order in (COPIES, COPIES[::-1], COPIES[1:] + COPIES[:1]))


def test_different_prefixes_spread_over_the_copies() -> None:
    chosen = collections.Counter(prefix_routing.choose(f"user: question {i}", COPIES, idle) for i in range(300))
    assert set(chosen) == set(COPIES) and min(chosen.values()) > 60


def test_a_busy_favourite_spills_to_the_prefixs_next_choice_and_only_then() -> None:
    prefix = "system: a long shared preamble"
    favourite, second, _ = prefix_routing.ranked(prefix, COPIES)
    inflight = {favourite: 12}
    # 12 in flight over 3 copies: room is max(8, ceil(1.25 * 13 / 3)) = 8 each, so the favourite has none.
    assert prefix_routing.choose(prefix, COPIES, lambda u: inflight.get(u, 0)) == second
    inflight[favourite] = 7  # room again: back to the favourite
    assert prefix_routing.choose(prefix, COPIES, lambda u: inflight.get(u, 0)) == favourite


def test_at_low_load_a_prefix_stays_on_its_copy() -> None:
    prefix = "system: shared"
    favourite = prefix_routing.ranked(prefix, COPIES)[0]
    inflight = {favourite: prefix_routing.DEFAULT_MIN_ROOM - 1}
    assert prefix_routing.choose(prefix, COPIES, lambda u: inflight.get(u, 0)) == favourite
