"""Rollouts: a spec change that alters a copy's weights loads the new version beside the old one.

A READY copy whose spec changed in ``ModelSpec.load_key()`` (framework, task,
source, version...) keeps serving while the new version loads and warms up
beside it; once loaded, the new copy takes over in the table and the old one
drains and unloads. Both hold memory meanwhile (seed 002's peak: old + new), so
both count, and the room beside the old copy is made before the new version
loads: other copies are evicted first, or the rollout waits for room, or, when
the two can never fit together, it does not start and says why. A version that
just failed is not tried again within the back-off: the old one serves. These
are the decisions; the manager runs the loads and unloads they ask for.
"""
from __future__ import annotations

from dataclasses import dataclass

from hotset_common.eviction import Candidate
from hotset_common.quantity import format_bytes
from hotset_common.spec import ModelSpec
from hotset_common.wire import CopyState
from hotset_worker.copy_table import Copy, CopyTable


def is_stale(copy: Copy, spec: ModelSpec) -> bool:
    """Whether `copy` holds other weights than `spec` declares (and no rollout to them runs yet)."""
    if copy.spec is spec or copy.replacement is not None:
        return False
    return copy.spec.load_key() != spec.load_key()


def just_failed(table: CopyTable, spec: ModelSpec, backoff_s: float, now: float) -> bool:
    """That very version failed within the back-off: the old copy serves until it ends."""
    failure = table.failures.get(spec.id)
    return failure is not None and failure.load_key == spec.load_key() and now < failure.at + backoff_s


@dataclass(frozen=True)
class Room:
    """What a rollout can do now. The budget is hard: the old copy keeps serving, so it counts
    until the new one takes over, and room beside it is made *before* the new version loads."""

    estimate: int = 0  # the new version's size as counted while it loads
    fits_now: bool = False  # start the load now
    evict_first: tuple[Candidate, ...] = ()  # unload these, then try again (their memory is the room)
    refusal: str = ""  # why it cannot start now, for the copy's status (empty while it simply waits)


def room_for(table: CopyTable, copy: Copy, spec: ModelSpec) -> Room:
    """Whether the new version of `copy`'s model fits beside it within the budget now, what to
    evict first if not, or why it cannot."""
    estimate = table.known_size(spec)
    budget = table.memory_budget
    pinned = sum(other.bytes for other in table.pinned_copies() if other.model_id != copy.model_id)
    if copy.bytes + estimate + pinned > budget:
        return Room(estimate, refusal=(
            f"rollout of {spec.id!r} to version {spec.version} waits: it needs about {format_bytes(estimate)} "
            f"beside version {copy.spec.version}'s {format_bytes(copy.bytes)} while the old one serves, "
            f"more than the memory budget of {format_bytes(budget)} holds"
            + (f" beside the pinned models ({format_bytes(pinned)})" if pinned else "")
            + f"; version {copy.spec.version} keeps serving"))
    if table.held_bytes(unloading=True) + estimate <= budget:
        return Room(estimate, fits_now=True)
    still_needed = table.held_bytes(unloading=False) + estimate - budget  # once the unloads under way are done
    if still_needed <= 0:
        return Room(estimate)
    victims = table.evictable(still_needed, exclude=copy.model_id, priority=spec.priority)
    if victims is None:  # copies in flight for loads, or promised to them: room comes as they finish
        return Room(estimate, refusal=(
            f"rollout of {spec.id!r} to version {spec.version} waits for room: "
            f"{format_bytes(still_needed)} more than the memory budget of {format_bytes(budget)} "
            f"is held by copies that cannot be evicted now"))
    return Room(estimate, evict_first=tuple(victims))


def should_roll(table: CopyTable, copy: Copy, spec: ModelSpec, backoff_s: float, now: float) -> bool:
    return copy.state is CopyState.READY and is_stale(copy, spec) and not just_failed(table, spec, backoff_s, now)
