"""Rollouts: a spec change that alters a copy's weights loads the new version beside the old one.

A READY copy whose spec changed in ``ModelSpec.load_key()`` (framework, task,
source, version...) keeps serving while the new version loads and warms up
with the old copy's room promised to it, like a victim's; once loaded, the new
copy takes over in the table and the old one drains and unloads. A version
that just failed is not tried again within the back-off: the old one serves.
These are the decisions; the manager runs the loads they start.
"""
from __future__ import annotations

from hotset_common.eviction import Candidate
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


def room_for(table: CopyTable, copy: Copy, spec: ModelSpec) -> tuple[int, list[Candidate]] | None:
    """The new version's estimated size and the copies to evict for it beside `copy` (whose own
    room is promised to it); None when there is no room beside it now (tried again later)."""
    estimate = table.known_size(spec)
    if estimate > table.memory_budget:
        return None
    copy.promised_to = spec.id  # counted out while the victims are chosen: its room is the new one's
    victims = table.victims(extra_bytes=estimate, extra_slots=1, exclude=None, count_unloading=True)
    copy.promised_to = None
    return None if victims is None else (estimate, victims)


def should_roll(table: CopyTable, copy: Copy, spec: ModelSpec, backoff_s: float, now: float) -> bool:
    return copy.state is CopyState.READY and is_stale(copy, spec) and not just_failed(table, spec, backoff_s, now)
