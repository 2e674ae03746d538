"""How many pods a pool or a dedicated group should have: grow at once, shrink after a delay.

Pure decisions with an injected clock. The shared pool's target is the
packing of its wanted copies (``demand.py``, ``pool.pack``) within the
WorkerPool's bounds; a dedicated group's is its wanted copies, one per pod,
within ``replicas.min..max``. Growth happens as soon as it is asked for;
a smaller size must have sufficed for ``scale_down_delay_s`` before it is
taken (the HPA's stabilization window), so a pause between bursts does not
cost pods that the next burst must start again. A min-0 dedicated group's
own idle time is its delay.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from hotset_common import quantity
from hotset_operator import pool
from hotset_operator.pool import Want


@dataclass(frozen=True)
class PoolTarget:
    """What demand alone asks of a pool, clamped to its bounds."""

    pods: int
    floor: int  # what declared min copies and waiting requests need, whoever scales (HPA included)
    packed: int  # pods the wanted copies pack into
    lower_bound: int  # no packing of them uses fewer pods
    wanted_bytes: int
    reason: str


def pool_target(wants: Sequence[Want], budget: int, min_pods: int, max_pods: int) -> PoolTarget:
    """The pods the wanted copies need, within min_pods..max_pods, and a reason a person can read."""
    packed = pool.pack(wants, budget)
    lower = pool.bound(wants, budget)
    floor = min(max(pool.pack([w.floor() for w in wants], budget), min_pods), max_pods)
    pods = min(max(packed, min_pods), max_pods)
    total = sum(w.bytes * w.copies for w in wants)
    copies = sum(w.copies for w in wants)
    summary = f"{copies} wanted copies ({quantity.format_bytes(total)}) pack into {packed} pods"
    if packed > max_pods:
        reason = f"at its maximum of {max_pods} pods: {summary}"
    elif packed < min_pods:
        reason = f"at its minimum of {min_pods} pods: {summary}"
    else:
        reason = summary
    busiest = sorted((w for w in wants if w.why not in ("min", "in use")), key=lambda w: w.model)
    if busiest:
        reason += "; " + ", ".join(f"{w.model}: {w.why}" for w in busiest[:3])
    return PoolTarget(pods, floor, packed, lower, total, reason)


class Stabilizer:
    """Scale up at once; scale down only after the smaller size sufficed for `delay_s` (per key)."""

    def __init__(self, delay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.delay_s = delay_s
        self.clock = clock
        self._below_since: dict[Hashable, float] = {}

    def settle(self, key: Hashable, target: int, current: int, delay_s: float | None = None) -> tuple[int, float]:
        """(pods to have now, seconds left before shrinking to `target`; 0 when not waiting)."""
        delay = self.delay_s if delay_s is None else delay_s
        if target >= current:
            self._below_since.pop(key, None)
            return target, 0.0
        since = self._below_since.setdefault(key, self.clock())
        left = delay - (self.clock() - since)
        if left <= 0:
            return target, 0.0
        return current, left

    def forget(self, key: Hashable) -> None:
        self._below_since.pop(key, None)
