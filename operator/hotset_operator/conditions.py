"""Standard Kubernetes conditions (type, status, reason, message, lastTransitionTime).

A condition's lastTransitionTime moves only when its status flips, so
re-reconciling an unchanged object writes nothing new.
"""
from __future__ import annotations

import datetime
from typing import Any, Iterable

ACCEPTED = "Accepted"
READY = "Ready"
ROLLOUT_FITS = "RolloutFits"  # with a canary: whether both versions fit a pod's memory budget together


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: Iterable[dict[str, Any]] | None, kind: str) -> dict[str, Any] | None:
    for condition in conditions or ():
        if condition.get("type") == kind:
            return dict(condition)
    return None


def upsert(conditions: Iterable[dict[str, Any]] | None, kind: str, status: bool, reason: str,
           message: str, generation: int | None, timestamp: str | None = None) -> list[dict[str, Any]]:
    """Return the list with `kind` set; keep its transition time unless the status changed."""
    text = "True" if status else "False"
    previous = find(conditions, kind)
    transition = previous["lastTransitionTime"] if previous and previous.get("status") == text else (timestamp or now())
    updated = {"type": kind, "status": text, "reason": reason, "message": message, "lastTransitionTime": transition}
    if generation is not None:
        updated["observedGeneration"] = generation
    others = [dict(c) for c in conditions or () if c.get("type") != kind]
    return sorted([*others, updated], key=lambda c: c["type"])
