"""Simulated workers for the placement and eviction benchmarks, driving the real shared code.

A ``PolicyPod`` keeps copies the way the worker's manager does and picks its
victims with the same function (``hotset_common.eviction.choose_victims``
over the same ``Candidate`` figures); its ``room()`` is the snapshot the
router's real ``placement.place_cold`` plans with. ``LruPod`` is the
baseline a plain LRU gives (least recently used first, by bytes). Time is a
simulated clock, so a trace of hours replays in a second.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Iterable, Sequence

from hotset_common.eviction import Candidate, DecayedCount, EvictionPolicy, choose_victims, eviction_cost
from hotset_router import placement


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    bytes: int
    load_s: float


@dataclasses.dataclass
class _Copy:
    model: Model
    loaded_at: float
    last_used: float


class PolicyPod:
    """A worker under the shared cost model: the manager's accounting, victims by choose_victims,
    and its admission control (a copy worth less than its victims serves once and leaves)."""

    def __init__(self, url: str, budget: int, policy: EvictionPolicy, demand: dict[str, DecayedCount],
                 admission_control: bool = True) -> None:
        self.url = url
        self.admission_control = admission_control
        self.transient = 0
        self.budget = budget
        self.policy = policy
        self.demand = demand  # per model, as the manager keeps it (survives evictions)
        self.copies: dict[str, _Copy] = {}
        self.load_seconds = 0.0
        self.loads = 0

    def free(self) -> int:
        return self.budget - sum(c.model.bytes for c in self.copies.values())

    def holds(self, name: str) -> bool:
        return name in self.copies

    def _candidates(self, now: float) -> list[Candidate]:
        return [
            Candidate(name, c.model.bytes, now - c.last_used, now - c.loaded_at, c.model.load_s,
                      self.demand[name].value(now))
            for name, c in self.copies.items()
        ]

    def serve(self, model: Model, now: float) -> bool:
        """One request; True if it needed a load."""
        self.demand.setdefault(model.name, DecayedCount()).add(now)
        copy = self.copies.get(model.name)
        if copy is None:
            victims = choose_victims(self.policy, self._candidates(now), model.bytes - self.free())
            if victims is None:
                raise RuntimeError(f"{model.name} does not fit on {self.url}")
            self.loads += 1
            self.load_seconds += model.load_s
            own = Candidate(model.name, model.bytes, 0.0, 0.0, model.load_s, self.demand[model.name].value(now))
            if self.admission_control and victims and eviction_cost([own]) < eviction_cost(victims):
                self.transient += 1  # the manager's admission control: served, then unloaded again
                return True
            for victim in victims:
                del self.copies[victim.model_id]
            self.copies[model.name] = _Copy(model, now, now)
            return True
        copy.last_used = now
        return False

    def room(self, now: float) -> placement.PodRoom:
        return placement.PodRoom(self.url, self.url, self.free(), self.budget, "", tuple(self._candidates(now)),
                                 self.policy)


class LruPod:
    """A plain LRU cache by bytes: the least recently used copies go first."""

    def __init__(self, url: str, budget: int) -> None:
        self.url = url
        self.budget = budget
        self.copies: collections.OrderedDict[str, Model] = collections.OrderedDict()
        self.load_seconds = 0.0
        self.loads = 0

    def free(self) -> int:
        return self.budget - sum(m.bytes for m in self.copies.values())

    def holds(self, name: str) -> bool:
        return name in self.copies

    def serve(self, model: Model, now: float) -> bool:
        if model.name in self.copies:
            self.copies.move_to_end(model.name)
            return False
        while self.free() < model.bytes:
            self.copies.popitem(last=False)
        self.copies[model.name] = model
        self.loads += 1
        self.load_seconds += model.load_s
        return True

    def room(self, now: float) -> placement.PodRoom:
        candidates = tuple(Candidate(name, m.bytes, idle_s=float(len(self.copies) - i)) for i, (name, m) in enumerate(self.copies.items()))
        return placement.PodRoom(self.url, self.url, self.free(), self.budget, "", candidates, EvictionPolicy(churn_guard_s=0))


def routed(pods: Sequence[PolicyPod | LruPod], trace: Iterable[tuple[float, Model]]) -> None:
    """Requests go where their model is; a cold model goes where the router's real placement says."""
    by_url = {p.url: p for p in pods}
    settings = placement.PlacementSettings(granularity_bytes=1)
    for now, model in trace:
        holder = next((p for p in pods if p.holds(model.name)), None)
        if holder is None:
            decision = placement.place_cold(model.name, model.bytes, [p.room(now) for p in pods], settings)
            if decision is None:
                raise RuntimeError(f"{model.name} fits on no pod")
            holder = by_url[decision.url]
        holder.serve(model, now)


def offline_bound(trace: Sequence[tuple[float, Model]], capacity: int) -> tuple[int, float]:
    """(loads, load seconds) of one cache of `capacity` bytes that knows the future: on a miss it evicts
    the copies whose next use is furthest away per reload second (Belady's rule weighted by load
    seconds and by bytes). A reference point, not a proven optimum."""
    next_use: list[float] = [math.inf] * len(trace)
    seen: dict[str, int] = {}
    for index in range(len(trace) - 1, -1, -1):
        name = trace[index][1].name
        next_use[index] = seen.get(name, math.inf)
        seen[name] = index
    cache: dict[str, tuple[Model, float]] = {}
    loads, seconds = 0, 0.0
    for index, (_, model) in enumerate(trace):
        if model.name not in cache:
            loads += 1
            seconds += model.load_s
            free = capacity - sum(m.bytes for m, _ in cache.values()) - model.bytes
            while free < 0:
                def worthless(name: str) -> float:
                    resident, next_index = cache[name]
                    distance = next_index - index
                    return distance * resident.bytes / resident.load_s

                victim = max(cache, key=worthless)
                free += cache.pop(victim)[0].bytes
        cache[model.name] = (model, next_use[index])
    return loads, seconds
