"""Where a model's next copy goes: pure functions over snapshots of pods.

Cold models are bin-packed: the pod where the model fits with the least room
left over (best fit), so pods fill up and idle pods can be removed. When no
pod has room, the pod whose evictions cost least, planned with the worker's
own eviction policy (``hotset_common.eviction``, fed from the worker's
report), so the router's plan is the worker's decision: the victims are the
ones the worker will pick, and their cost is the reload seconds they give up.
Pinned copies are never planned for eviction, copies requests wait for
neither. When no pod can make room now, the model queues on the pod where
it could fit with the shortest admission queue (the worker waits for room
within the request's deadline) rather than being refused.

Every choice is deterministic: free bytes are compared in buckets of
``granularity_bytes`` and ties are broken by rendezvous hashing of
(model, pod name), so two router replicas that see the same reports choose
the same pod (see docs/router.md).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Iterable, Sequence

from hotset_common.eviction import Candidate, EvictionPolicy, choose_victims, eviction_cost, value_band
from hotset_common.wire import CopyState

DEFAULT_GRANULARITY_BYTES = 16 * 2**20


@dataclasses.dataclass(frozen=True)
class PodRoom:
    """A snapshot of one ready pod for placement."""

    url: str
    name: str
    free_bytes: int
    budget_bytes: int
    node: str = ""
    evictable: tuple[Candidate, ...] = ()  # ready, unpinned copies, as the worker's policy sees them
    policy: EvictionPolicy = EvictionPolicy()  # the worker's own settings
    free_slots: int | None = None  # room left under the worker's model count limit; None: no limit
    pinned_bytes: int = 0  # held by copies that never leave
    queued: int = 0  # requests waiting in its admission queue


@dataclasses.dataclass(frozen=True)
class Decision:
    url: str
    reason: str  # "fit", "evict" or "queue"
    evicts: tuple[str, ...] = ()
    cost: float = 0.0  # reload seconds the evictions give up


@dataclasses.dataclass(frozen=True)
class PlacementSettings:
    granularity_bytes: int = DEFAULT_GRANULARITY_BYTES


def rendezvous_score(model: str, pod_name: str) -> int:
    """A stable pseudo-random rank of a pod for a model (highest random weight hashing)."""
    digest = hashlib.blake2b(f"{model}|{pod_name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def has_room(pod: PodRoom, need_bytes: int) -> bool:
    return pod.free_bytes >= need_bytes and (pod.free_slots is None or pod.free_slots >= 1)


def could_ever_fit(pod: PodRoom, need_bytes: int) -> bool:
    """Whether evicting everything that may leave would make room (pinned copies never do)."""
    return need_bytes <= pod.budget_bytes - pod.pinned_bytes


@dataclasses.dataclass(frozen=True)
class EvictionPlan:
    victims: tuple[str, ...]
    cost: float  # reload seconds given up
    bytes: int  # bytes given up

    def rank(self) -> tuple[int, int]:
        """Cheaper first; costs within the policy's noise band tie, and then fewer bytes lost wins."""
        return value_band(self.cost), self.bytes


def eviction_plan(pod: PodRoom, need_bytes: int, priority: int = 0) -> EvictionPlan | None:
    """Copies the worker would evict to make room now for a model of `priority` (it evicts none of
    higher priority), and what they cost; None if it cannot now."""
    if need_bytes > pod.budget_bytes:
        return None
    slots_needed = 0 if pod.free_slots is None else 1 - pod.free_slots
    victims = choose_victims(pod.policy, pod.evictable, need_bytes - pod.free_bytes, slots_needed, priority)
    if victims is None:
        return None
    return EvictionPlan(tuple(v.model_id for v in victims), eviction_cost(victims), sum(v.bytes for v in victims))


def best_fit(
    model: str, need_bytes: int, pods: Iterable[PodRoom], settings: PlacementSettings = PlacementSettings()
) -> Decision | None:
    """The pod with the least room left after the model fits, or None if it fits nowhere as is."""
    fitting = [p for p in pods if has_room(p, need_bytes)]
    if not fitting:
        return None
    g = max(1, settings.granularity_bytes)
    chosen = min(fitting, key=lambda p: ((p.free_bytes - need_bytes) // g, -rendezvous_score(model, p.name)))
    return Decision(chosen.url, "fit")


def cheapest_eviction(
    model: str, need_bytes: int, pods: Iterable[PodRoom], settings: PlacementSettings = PlacementSettings(),
    priority: int = 0,
) -> Decision | None:
    """The pod whose evictions cost least, or None if no pod can make room now."""
    plans = [(plan, pod) for pod in pods if (plan := eviction_plan(pod, need_bytes, priority)) is not None]
    if not plans:
        return None
    plan, pod = min(plans, key=lambda t: (t[0].rank(), -rendezvous_score(model, t[1].name)))
    return Decision(pod.url, "evict", plan.victims, plan.cost)


def shortest_queue(model: str, need_bytes: int, pods: Iterable[PodRoom]) -> Decision | None:
    """Where to wait for room when none can be made now: the shortest admission queue it could ever leave."""
    possible = [p for p in pods if could_ever_fit(p, need_bytes)]
    if not possible:
        return None
    chosen = min(possible, key=lambda p: (p.queued, -rendezvous_score(model, p.name)))
    return Decision(chosen.url, "queue")


def place_cold(
    model: str, need_bytes: int, pods: Sequence[PodRoom], settings: PlacementSettings = PlacementSettings(),
    priority: int = 0,
) -> Decision | None:
    """Where a model with no copy goes: best fit, else cheapest eviction (of copies of at most its
    `priority`), else the shortest queue, else None (it fits on no pod even when empty)."""
    return (best_fit(model, need_bytes, pods, settings)
            or cheapest_eviction(model, need_bytes, pods, settings, priority)
            or shortest_queue(model, need_bytes, pods))


def place_replica(
    model: str,
    need_bytes: int,
    pods: Sequence[PodRoom],
    holders: Iterable[str],
    settings: PlacementSettings = PlacementSettings(),
    priority: int = 0,
) -> Decision | None:
    """Where an extra copy of a hot model goes: another pod, on another node where one is known."""
    holder_urls = set(holders)
    busy_nodes = {p.node for p in pods if p.url in holder_urls and p.node}
    others = [p for p in pods if p.url not in holder_urls]
    other_nodes = [p for p in others if not p.node or p.node not in busy_nodes]
    for candidates in (other_nodes, others):  # never a queue: an extra copy is worth it only with room now
        decision = (best_fit(model, need_bytes, candidates, settings)
                    or cheapest_eviction(model, need_bytes, candidates, settings, priority))
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


def rooms_from_map(model_map: "ModelMapLike", urls: Iterable[str] | None = None, evictable: bool = True) -> list[PodRoom]:
    """Snapshots of the map's ready pods (of `urls` only, when given), with the router's own pending
    loads subtracted. `evictable=False`: without their copies (best fit needs only the room, and
    listing every copy of every pod is the costly part)."""
    now = model_map.now()
    pods = model_map.ready_pods() if urls is None else [p for u in urls if (p := model_map.pod(u)) is not None and p.ready]
    rooms = []
    for pod in pods:
        candidates: tuple[Candidate, ...] = ()
        pinned = 0
        if evictable:
            candidates = tuple(c.candidate(now) for c in pod.copies.values() if c.state == CopyState.READY and not c.pinned)
            pinned = sum(c.bytes for c in pod.copies.values() if c.pinned and c.state != CopyState.FAILED)
        rooms.append(PodRoom(
            pod.url, pod.name, model_map.free_bytes(pod.url), pod.budget_bytes, pod.node, candidates,
            EvictionPolicy(churn_guard_s=pod.churn_guard_s), model_map.free_slots(pod.url), pinned, pod.queued,
        ))
    return rooms


class ModelMapLike:  # pragma: no cover - typing aid only
    def now(self) -> float: ...
    def pod(self, url: str) -> Any: ...
    def ready_pods(self) -> list: ...
    def free_bytes(self, url: str) -> int: ...
    def free_slots(self, url: str) -> int | None: ...
