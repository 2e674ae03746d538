"""Where a model's next copy goes: pure functions over snapshots of pods.

Cold models are bin-packed: the pod where the model fits with the least room
left over (best fit), so pods fill up and idle pods can be removed. When no
pod has room, the pod whose evictions cost least: the worker evicts least
recently used copies first, so the plan takes them in that order, and a copy
costs its bytes weighted by how recently it was used. Pinned copies and
copies loaded less than the churn guard ago are never planned for eviction.

Every choice is deterministic: free bytes are compared in buckets of
``granularity_bytes`` and ties are broken by rendezvous hashing of
(model, pod name), so two router replicas that see the same reports choose
the same pod (see docs/router.md).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Iterable, Sequence

from modelplane_common.wire import CopyState

DEFAULT_GRANULARITY_BYTES = 16 * 2**20
DEFAULT_RECENCY_SCALE_S = 60.0


@dataclasses.dataclass(frozen=True)
class ResidentCopy:
    """A copy already on a pod, with what eviction needs to know about it."""

    model: str
    bytes: int
    idle_s: float = 0.0  # seconds since it last served a request
    age_s: float = 0.0  # seconds since its load finished
    pinned: bool = False
    ready: bool = True


@dataclasses.dataclass(frozen=True)
class PodRoom:
    """A snapshot of one ready pod for placement."""

    url: str
    name: str
    free_bytes: int
    budget_bytes: int
    node: str = ""
    copies: tuple[ResidentCopy, ...] = ()


@dataclasses.dataclass(frozen=True)
class Decision:
    url: str
    reason: str  # "fit" or "evict"
    evicts: tuple[str, ...] = ()
    cost: float = 0.0


@dataclasses.dataclass(frozen=True)
class PlacementSettings:
    granularity_bytes: int = DEFAULT_GRANULARITY_BYTES
    recency_scale_s: float = DEFAULT_RECENCY_SCALE_S
    churn_guard_s: float = 30.0


def rendezvous_score(model: str, pod_name: str) -> int:
    """A stable pseudo-random rank of a pod for a model (highest random weight hashing)."""
    digest = hashlib.blake2b(f"{model}|{pod_name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def eviction_plan(
    pod: PodRoom, need_bytes: int, settings: PlacementSettings
) -> tuple[tuple[str, ...], float] | None:
    """Copies the worker would evict (LRU first) to make room, and their cost; None if it cannot."""
    if need_bytes > pod.budget_bytes:
        return None
    evictable = sorted(
        (c for c in pod.copies if c.ready and not c.pinned and c.age_s >= settings.churn_guard_s),
        key=lambda c: c.idle_s,
        reverse=True,
    )
    free, victims, cost = pod.free_bytes, [], 0.0
    for copy in evictable:
        if free >= need_bytes:
            break
        victims.append(copy.model)
        free += copy.bytes
        cost += copy.bytes / (1.0 + copy.idle_s / settings.recency_scale_s)
    if free < need_bytes:
        return None
    return tuple(victims), cost


def best_fit(
    model: str, need_bytes: int, pods: Iterable[PodRoom], settings: PlacementSettings = PlacementSettings()
) -> Decision | None:
    """The pod with the least room left after the model fits, or None if it fits nowhere as is."""
    fitting = [p for p in pods if p.free_bytes >= need_bytes]
    if not fitting:
        return None
    g = max(1, settings.granularity_bytes)
    chosen = min(fitting, key=lambda p: ((p.free_bytes - need_bytes) // g, -rendezvous_score(model, p.name)))
    return Decision(chosen.url, "fit")


def cheapest_eviction(
    model: str, need_bytes: int, pods: Iterable[PodRoom], settings: PlacementSettings = PlacementSettings()
) -> Decision | None:
    """The pod whose evictions cost least, or None if no pod can make room."""
    plans = []
    for pod in pods:
        plan = eviction_plan(pod, need_bytes, settings)
        if plan is not None:
            plans.append((plan[1], -rendezvous_score(model, pod.name), pod, plan[0]))
    if not plans:
        return None
    cost, _, pod, victims = min(plans, key=lambda t: (t[0], t[1]))
    return Decision(pod.url, "evict", victims, cost)


def place_cold(
    model: str, need_bytes: int, pods: Sequence[PodRoom], settings: PlacementSettings = PlacementSettings()
) -> Decision | None:
    """Where a model with no copy goes: best fit, else cheapest eviction, else None (no capacity)."""
    return best_fit(model, need_bytes, pods, settings) or cheapest_eviction(model, need_bytes, pods, settings)


def place_replica(
    model: str,
    need_bytes: int,
    pods: Sequence[PodRoom],
    holders: Iterable[str],
    settings: PlacementSettings = PlacementSettings(),
) -> Decision | None:
    """Where an extra copy of a hot model goes: another pod, on another node where one is known."""
    holder_urls = set(holders)
    busy_nodes = {p.node for p in pods if p.url in holder_urls and p.node}
    others = [p for p in pods if p.url not in holder_urls]
    other_nodes = [p for p in others if not p.node or p.node not in busy_nodes]
    for candidates in (other_nodes, others):
        decision = place_cold(model, need_bytes, candidates, settings)
        if decision is not None:
            return decision
    return None


def spread_first(model: str, need_bytes: int, pods: Sequence[PodRoom]) -> Decision | None:
    """The baseline other systems use: the pod with the most free bytes. For benchmarks only."""
    fitting = [p for p in pods if p.free_bytes >= need_bytes]
    if not fitting:
        return None
    chosen = max(fitting, key=lambda p: (p.free_bytes, rendezvous_score(model, p.name)))
    return Decision(chosen.url, "fit")


def rooms_from_map(model_map: "ModelMapLike") -> list[PodRoom]:
    """Snapshots of the map's ready pods, with the router's own pending loads subtracted."""
    rooms = []
    for pod in model_map.ready_pods():
        copies = tuple(
            ResidentCopy(
                model=c.model,
                bytes=c.bytes,
                idle_s=c.last_used_s,
                age_s=c.loaded_at_s,
                pinned=c.pinned,
                ready=c.state == CopyState.READY,
            )
            for c in pod.copies.values()
        )
        rooms.append(PodRoom(pod.url, pod.name, model_map.free_bytes(pod.url), pod.budget_bytes, pod.node, copies))
    return rooms


class ModelMapLike:  # pragma: no cover - typing aid only
    def ready_pods(self) -> list: ...
    def free_bytes(self, url: str) -> int: ...
