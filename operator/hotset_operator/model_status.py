"""A ServedModel's status as it should be now, and the events its changes deserve (pure).

From what the operator decided (admission, or a dedicated group blocked by a
Deployment it does not own), the spec, and what the workers report (the
model's copies, the kubelet's reasons for its dedicated pods): the
``Accepted``, ``Ready`` and ``RolloutFits`` conditions, ``copies``,
``readyReplicas`` and ``observedGeneration``. Only the fields that differ
from what the object says are returned, so an unchanged model is never
written; a condition's ``lastTransitionTime`` moves only when its status
flips (``conditions.upsert``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hotset_operator import conditions, status, validation
from hotset_operator.admission import Decision
from hotset_operator.config import OperatorConfig
from hotset_operator.index import ModelEntry

NOT_ACCEPTED = ("NotAccepted", "the spec was not accepted; see Accepted")
WARN_READY = ("LoadFailed", "PodsFailing")


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass
class Change:
    """The status fields to write (none: the object already says all of it) and the events."""

    fields: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


class _Conditions:
    """The object's conditions with this change's upserts applied, noting transitions."""

    def __init__(self, observed: Sequence[Mapping[str, Any]], generation: int) -> None:
        self.items = [dict(c) for c in observed]
        self.generation = generation
        self.events: list[Event] = []

    def set(self, kind: str, ok: bool, reason: str, message: str) -> bool:
        """Upsert one condition; True when its status or reason changed."""
        before = conditions.find(self.items, kind)
        self.items = conditions.upsert(self.items, kind, ok, reason, message, self.generation or None)
        return before is None or before.get("status") != ("True" if ok else "False") or before.get("reason") != reason


def desired(entry: ModelEntry, decision: Decision, copies: Sequence[Mapping[str, Any]],
            pod_problems: Sequence[str], config: OperatorConfig) -> Change:
    """What `entry`'s status should say given its decision and its copies."""
    observed = entry.status
    found = _Conditions(observed.get("conditions") or [], entry.generation)
    events: list[Event] = []
    if found.set(conditions.ACCEPTED, decision.accepted, decision.reason, decision.message):
        events.append(Event("Normal", "Accepted", decision.message) if decision.accepted
                      else Event("Warning", decision.reason, decision.message))
    new: dict[str, Any] = {}
    if not decision.accepted or entry.spec is None:
        found.set(conditions.READY, False, *NOT_ACCEPTED)
    else:
        spec = entry.spec
        if (fit := validation.rollout_fit(spec, config)) is not None:
            if found.set(conditions.ROLLOUT_FITS, *fit) and not fit[0]:
                events.append(Event("Warning", fit[1], fit[2]))
        ready, reason, message = status.readiness(spec, list(copies), pod_problems)
        if found.set(conditions.READY, ready, reason, message) and reason in WARN_READY:
            events.append(Event("Warning", reason, message))
        new["copies"] = [dict(c) for c in copies]
        new["readyReplicas"] = sum(1 for c in copies if c["state"] == "READY")
    new["conditions"] = found.items
    if entry.generation:
        new["observedGeneration"] = entry.generation
    return Change({key: value for key, value in new.items() if observed.get(key) != value}, events)
