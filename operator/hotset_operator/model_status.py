"""A ServedModel's status as it should be now, and the events its changes deserve (pure).

From what the operator decided (admission, or a dedicated group blocked by a
Deployment it does not own), the spec, and what the workers report (the
model's copies, the kubelet's reasons for its dedicated pods): the
``Accepted``, ``Ready`` and ``RolloutFits`` conditions, ``copies``,
``readyReplicas`` and ``observedGeneration``; where approval is required, ``approval`` and
``history`` (``approval.py``): an approval granted, then when that change took effect and how
it went. Only the fields that differ
from what the object says are returned, so an unchanged model is never
written; a condition's ``lastTransitionTime`` moves only when its status
flips (``conditions.upsert``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hotset_operator import approval, conditions, status, validation
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
            pod_problems: Sequence[str], config: OperatorConfig, granted: approval.Request | None = None) -> Change:
    """What `entry`'s status should say given its decision and its copies (`entry.spec`: what is
    served) and, where approval is required, the approval of this generation the API server
    allowed (`granted`)."""
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
        if decision.approval is approval.State.APPROVED:
            _outcome(observed, ready, reason, message, new, events)
        new["copies"] = [dict(c) for c in copies]
        new["readyReplicas"] = sum(1 for c in copies if c["state"] == "READY")
    _approval(entry, decision, granted, new, events)
    new["conditions"] = found.items
    if entry.generation:
        new["observedGeneration"] = entry.generation
    return Change({key: value for key, value in new.items() if observed.get(key) != value}, events)


def _approval(entry: ModelEntry, decision: Decision, granted: approval.Request | None,
              new: dict[str, Any], events: list[Event]) -> None:
    """``status.approval`` and a ``status.history`` entry for an approval granted, or the baseline
    of a model that served before approval was required; nothing when the status says it already."""
    observed = entry.status
    current = approval.approved_of(observed)
    if decision.approval is approval.State.BASELINE and current is None:
        new["approval"] = approval.record(entry.generation, "", conditions.now(), entry.gated)
        return
    if granted is None or decision.approval not in (approval.State.PENDING, approval.State.WAITING):
        return
    if current is not None and current.generation == granted.generation and approval.same(current.fields, entry.gated):
        return
    at = conditions.now()
    changed = [] if current is None else approval.changed_fields(current.fields, entry.gated)  # []: a new model
    new["approval"] = approval.record(granted.generation, granted.user, at, entry.gated)
    new["history"] = [*(observed.get("history") or []), {
        "generation": granted.generation, "changed": changed, "approvedBy": granted.user, "approvedAt": at,
    }][-approval.HISTORY:]
    what = "the new model" if current is None else ", ".join(changed) or "no served field"
    events.append(Event("Normal", "Approved", f"generation {granted.generation} ({what}) approved by {granted.user}"))


def _outcome(observed: Mapping[str, Any], ready: bool, reason: str, message: str,
             new: dict[str, Any], events: list[Event]) -> None:
    """The latest approved change's outcome, once known: served (its copies ready, or none required)
    or failed (its load or warm-up), with when; and an event saying so."""
    history = [dict(h) for h in observed.get("history") or []]
    if not history or history[-1].get("outcome"):
        return
    if ready:
        outcome = "Served"
    elif reason in ("LoadFailed", "WarmupFailed"):
        outcome = f"Failed: {message}"
    else:
        return
    latest = history[-1]
    latest.update(effectiveAt=conditions.now(), outcome=outcome[:1024])
    new["history"] = history
    events.append(Event("Normal" if ready else "Warning", "ChangeServed" if ready else "ChangeFailed",
                        f"generation {latest.get('generation')} approved by {latest.get('approvedBy')}: {outcome}"))
