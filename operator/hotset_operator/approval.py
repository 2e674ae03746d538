"""Approval of what a ServedModel serves (seed 002): the rule, the record, and what is served meanwhile.

Where a namespace requires approval (its ModelQuota's ``requireApproval``, or the chart's
``policy.requireApproval`` for all), a ServedModel's generation is served only once an identity
with ``update`` on ``servedmodels/approval`` approved it. Approval covers the fields that decide
what is served, where and with how much (``GATED``); an edit of anything else (a description,
the contacts, a warm-up, timeouts) takes effect at once. A model that serves and is edited keeps
serving what was approved last (``serving_spec``) until the new generation is approved, so a
pending change never takes a model away.

The approver writes three annotations (``hotset_common.labels``): the generation and who they are.
The API server, through the chart's ValidatingAdmissionPolicy, refuses them unless they name the
identity making the request and that identity holds the verb; the operator checks the verb again
with a SubjectAccessReview (``approvals.py``) before it records the approval in
``status.approval`` (the approved fields) and ``status.history`` (the last ``HISTORY`` changes:
generation, what changed, who approved, when it took effect, the outcome).

Pure functions over the ServedModel's body and spec; the checks that call the API are in
``approvals.py``.
"""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Mapping

from hotset_common import labels
from hotset_common.spec import ModelSpec

HISTORY = 10  # changes status.history keeps

# The spec fields (their CRD names) whose change needs approval: what is served (framework,
# task, source, version, rollout), where (placement, scheduling, latency class), how much of the
# pool it may take (memory, replicas, pinned, priority) and how its engine runs.
GATED = ("framework", "task", "source", "sourceOptions", "version", "rollout", "baseModel", "engineArgs",
         "placement", "scheduling", "latencyClass", "memory", "replicas", "pinned", "priority")


class State(str, enum.Enum):
    """Where a model stands with approval, as admission decided it."""

    NOT_REQUIRED = "NotRequired"  # its namespace does not require approval
    APPROVED = "Approved"  # the spec's gated fields are the approved ones
    BASELINE = "Baseline"  # served before approval was required: what it serves is the baseline
    PENDING = "Pending"  # serves what was approved last; a newer generation waits
    WAITING = "Waiting"  # never approved: not served until it is


@dataclass(frozen=True)
class Request:
    """An approval the annotations ask for: a generation and the identity approving it."""

    generation: int
    user: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Approved:
    """``status.approval``: the generation approved last and its gated fields (canonical JSON)."""

    generation: int
    by: str  # "" for a baseline
    at: str
    fields: str


def gated(spec: ModelSpec) -> str:
    """The spec's gated fields as canonical JSON: two specs serve alike exactly when these are equal."""
    found = spec.model_dump(mode="json", by_alias=True)
    return _canonical({name: found.get(name) for name in GATED})


def _without_nulls(value: Any) -> Any:
    """`value` with every null member dropped, at any depth: what a merge patch of it leaves stored."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _canonical(fields: Mapping[str, Any]) -> str:
    return json.dumps(_without_nulls(fields), sort_keys=True, separators=(",", ":"))


def same(before: str, after: str) -> bool:
    """Whether two ``gated`` documents serve alike (parsed: the API server may write 1.0 as 1)."""
    return before == after or json.loads(before) == json.loads(after)


def changed_fields(before: str, after: str) -> list[str]:
    """The gated fields that differ between two ``gated`` documents."""
    old, new = json.loads(before), json.loads(after)
    return [name for name in GATED if old.get(name) != new.get(name)]


def serving_spec(spec: ModelSpec, approved: Approved) -> ModelSpec:
    """What is served while a change waits: `spec` with the gated fields approved last."""
    fields = json.loads(approved.fields)
    return ModelSpec.model_validate({**spec.model_dump(by_alias=True), **{name: fields.get(name) for name in GATED}})


def request_of(annotations: Mapping[str, str]) -> Request | None:
    """The approval the annotations ask for, or None (absent or not a generation number)."""
    user = annotations.get(labels.APPROVED_BY_USER, "").strip()
    try:
        generation = int(annotations.get(labels.APPROVED_GENERATION, ""))
    except ValueError:
        return None
    if not user or generation < 1:
        return None
    groups = tuple(g for g in annotations.get(labels.APPROVED_BY_GROUPS, "").split(",") if g)
    return Request(generation, user, groups)


def approved_of(status: Mapping[str, Any]) -> Approved | None:
    """``status.approval`` as the operator wrote it, or None."""
    found = status.get("approval")
    if not isinstance(found, Mapping) or not isinstance(found.get("spec"), Mapping):
        return None
    fields = _canonical(found["spec"])
    return Approved(int(found.get("generation") or 0), str(found.get("approvedBy") or ""),
                    str(found.get("approvedAt") or ""), fields)


def record(generation: int, by: str, at: str, fields: str) -> dict[str, Any]:
    """``status.approval`` for an approval (or a baseline, `by` empty)."""
    approved = json.loads(fields)
    # Every gated field, null where unset: the status is written as a merge patch, so a field the
    # previous approval had and this one lacks is removed rather than kept.
    return {"generation": generation, "approvedBy": by, "approvedAt": at,
            "spec": {name: approved.get(name) for name in GATED}}


def how_to_approve(namespace: str, name: str, generation: int) -> str:
    return (f"an identity allowed to update servedmodels/approval in {namespace} approves it: "
            f"hotset-approve {name} -n {namespace} (generation {generation})")
