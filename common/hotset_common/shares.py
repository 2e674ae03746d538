"""Namespaces sharing a bounded resource, weighted and work-conserving: the router's request slots
(router flood.py) and a worker's admission-queue places (worker admission.py).

The rule (``over_share``). A namespace N of weight ``w`` asks for one more place of ``capacity``
while ``in_use`` places are taken (by every namespace, and by requests of no namespace). Let
``W`` be the weights of the namespaces holding places now, N included, ``R`` the reserve
(``reserve_of``: 1/32 of the capacity, at least one place), and a namespace's share
``P × w / W`` (``share_of``; at least one place) of ``P = capacity - R - (places held by no
namespace)``. N gets the place when one is free and either

1. N holds less than its share, or
2. after taking it, at least ``R`` places stay free besides what the other namespaces holding
   places are still owed (each one's share less what it holds, where it holds less).

Places held by no namespace (a local store's models; at the router, also requests whose model is
not known yet) are the capacity's bound only: they come out of what is shared, so they neither
spend the reserve through rule 1 nor count as anyone's share.

Why this rule:

- **Work-conserving.** Nothing is kept for namespaces that do not ask: a namespace alone may
  hold all but ``R`` places, two of them may together, whichever holds more (the old rule,
  ``capacity × w / (W + 1)``, let a namespace alone hold only half and refused it while the
  other half stood idle).
- **Protection without preemption.** A place is never taken back; what protects a namespace is
  that, once it holds places, a namespace over its share may take a freed place only while
  enough others stay free for what it is owed. So when N arrives while M holds everything past
  its share, N gets the reserve at once (its share is at least one place, and ``R`` are free),
  and every place M gives back afterwards is N's until N holds its share: M is refused then.
- **A newcomer is never shut out.** ``R`` places stay free for a namespace not yet served:
  rule 2 never spends them, and rule 1 spends them only for a namespace under its share.
- **Cheap.** One pass over the namespaces holding places: O(namespaces) per admission.

A refusal names the share (``Over.describe``); the callers answer 503 with Retry-After. The
weights are the ModelQuotas' ``servingWeight``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

RESERVE_FRACTION = 32  # 1/32 of the places stay free for a namespace not yet served


def reserve_of(capacity: int) -> int:
    """Places of `capacity` kept free for a namespace that holds none yet (at least one)."""
    return max(1, capacity // RESERVE_FRACTION)


def share_of(places: int, weight: float, weights_holding: float) -> int:
    """Of the `places` shared (the capacity less the reserve and what no namespace holds), those a
    namespace of `weight` is owed while the namespaces holding places (itself included) weigh
    `weights_holding` in all; at least one."""
    return max(1, int(places * (weight / weights_holding)))  # alone: exactly all


@dataclasses.dataclass(frozen=True)
class Over:
    """Why a namespace may not take one more place: it holds its share, and the free places are
    kept for what the other namespaces are owed and the reserve."""

    namespace: str
    held: int
    share: int
    weight: float
    weights: float
    namespaces: int  # namespaces holding places, the asking one included
    free: int  # places free now, every one of them kept for:
    owed: int  # what the other namespaces holding places are owed under their shares
    reserve: int  # a namespace not yet served

    def describe(self, places: str) -> str:
        """`places` names the resource, e.g. "the router's 12 request slots"."""
        return (f"namespace {self.namespace!r} holds {self.held} of {places}, at or past its share of {self.share} "
                f"while {self.namespaces} namespaces are served (servingWeight {self.weight:g} of {self.weights:g}), "
                f"and the {self.free} free are kept ({self.owed} owed to the others' shares, {self.reserve} for a newcomer)")


def over_share(capacity: int, in_use: int, namespace: str, held: Mapping[str, int],
               weight_of: Callable[[str], float]) -> Over | None:
    """None when `namespace` may take one more place (the module docstring's rule), else why not.
    `in_use`: places taken by everyone else (all namespaces and none), not counting the asking
    request; `held`: namespace -> places it holds now (those holding none may be absent; the
    group of no namespace, "" or None, is in no share and owed nothing). The
    caller refuses a request past `capacity` itself, before asking (its own message)."""
    free = capacity - in_use
    weight = weight_of(namespace)
    own = held.get(namespace, 0)
    others = [(weight_of(other), count) for other, count in held.items() if other and other != namespace and count > 0]
    weights = weight + sum(other_weight for other_weight, _ in others)
    outside = max(0, in_use - own - sum(count for _, count in others))  # held by no namespace
    reserve = reserve_of(capacity)
    places = max(0, capacity - reserve - outside)
    share = share_of(places, weight, weights)
    if free > 0 and own < share:
        return None
    owed = sum(max(0, share_of(places, other_weight, weights) - count) for other_weight, count in others)
    if free - 1 >= reserve + owed:
        return None
    return Over(namespace, own, share, weight, weights, len(others) + 1, max(free, 0), owed, reserve)
