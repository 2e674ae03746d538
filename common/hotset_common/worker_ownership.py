"""Which labelled pods are the operator's workers: decided by who owns them, not by their labels.

Anyone who may create a pod in a pool namespace can give it the worker
labels. Before this check, such a pod got the router's traffic (prompts to
read, answers to forge) and the operator's report requests with the
then shared workers' token, and its report could scale the pool. A pod is a worker here
only when the cluster's own controllers vouch for it:

- its controller (the ownerReference marked ``controller``) is a ReplicaSet
  that exists with that uid and whose selector matches the pod's labels, so
  the ReplicaSet controller counts it among its pods (a pod that merely
  names a ReplicaSet it does not match is not one of its pods; one that
  matches is counted, and deleted when there are too many);
- that ReplicaSet's controller is a Deployment, by uid, that the operator
  manages (labelled ``app.kubernetes.io/managed-by=hotset-operator``).

Who may still pass: whoever may create or edit such a Deployment (that is
who may run the operator's workers anyway). Ownership says which pods are
workers; each of them must still prove it is the pod at its address before
it gets anything (worker_identity.py: per-pod ServiceAccount tokens, no
shared one; docs/security.md).

The router and the operator both use this, each with its own view of the
ReplicaSets and Deployments (watches, kopf indexes): a pure function of
three small tables, so it costs no API call per pod and is re-decided when
a ReplicaSet or Deployment arrives after its pods.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

from hotset_common import labels

REPLICA_SET = "ReplicaSet"
DEPLOYMENT = "Deployment"
OPERATOR_DEPLOYMENTS = f"{labels.MANAGED_BY}={labels.OPERATOR_MANAGER}"  # label selector of the operator's


class WorkerTrust(str, enum.Enum):
    """Which labelled pods count as workers."""

    OWNED = "owned"  # only pods of the operator's Deployments (the default; see the module docstring)
    LABELLED = "labelled"  # every pod with the worker labels: workers the operator did not make, test stand-ins


@dataclass(frozen=True)
class Controller:
    """An object's controller, from its ownerReferences."""

    kind: str
    name: str
    uid: str


def controller_of(metadata: Mapping[str, Any]) -> Controller | None:
    """The ownerReference marked ``controller: true`` (camelCase, as the API sends it), if any."""
    for ref in metadata.get("ownerReferences") or ():
        if ref.get("controller"):
            return Controller(str(ref.get("kind", "")), str(ref.get("name", "")), str(ref.get("uid", "")))
    return None


@dataclass(frozen=True)
class PodClaim:
    """What a pod says about who made it: its controller and its labels."""

    controller: Controller | None
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, metadata: Mapping[str, Any]) -> "PodClaim":
        return cls(controller_of(metadata), tuple(sorted((metadata.get("labels") or {}).items())))


@dataclass(frozen=True)
class ReplicaSetEntry:
    uid: str
    controller: Controller | None
    selector: Mapping[str, Any] = field(default_factory=dict)  # spec.selector: matchLabels, matchExpressions


def replica_set_entry(body: Mapping[str, Any]) -> ReplicaSetEntry:
    meta = body.get("metadata") or {}
    return ReplicaSetEntry(str(meta.get("uid", "")), controller_of(meta),
                           dict((body.get("spec") or {}).get("selector") or {}))


def _matches(requirement: Mapping[str, Any], pod_labels: Mapping[str, str]) -> bool:
    key, operator, values = requirement.get("key", ""), requirement.get("operator", ""), requirement.get("values") or []
    if operator == "In":
        return pod_labels.get(key) in values
    if operator == "NotIn":
        return key not in pod_labels or pod_labels[key] not in values
    if operator == "Exists":
        return key in pod_labels
    if operator == "DoesNotExist":
        return key not in pod_labels
    return False  # an operator this does not know selects nothing: never trust more than the API server


def selects(selector: Mapping[str, Any], pod_labels: Mapping[str, str]) -> bool:
    """A LabelSelector matches `pod_labels`; an empty selector matches nothing (as ReplicaSets treat it)."""
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    return (all(pod_labels.get(k) == v for k, v in match_labels.items())
            and all(_matches(r, pod_labels) for r in expressions))


Key = tuple[str, str]  # (namespace, name)


def why_not_owned(namespace: str, claim: PodClaim, replica_sets: Mapping[Key, ReplicaSetEntry],
                  deployment_uids: Mapping[Key, str]) -> str:
    """"" for a pod of one of the operator's Deployments; otherwise why not, for a log line.

    `replica_sets`: the worker-labelled ReplicaSets known; `deployment_uids`: the uids of the
    Deployments the operator manages."""
    owner = claim.controller
    if owner is None or owner.kind != REPLICA_SET:
        return "it has no ReplicaSet as its controller"
    replica_set = replica_sets.get((namespace, owner.name))
    if replica_set is None or replica_set.uid != owner.uid:
        return f"its ReplicaSet {owner.name} (uid {owner.uid[:8]}) is not one known with that uid"
    if not selects(replica_set.selector, dict(claim.labels)):
        return f"its ReplicaSet {owner.name} does not select its labels"
    deployment = replica_set.controller
    if deployment is None or deployment.kind != DEPLOYMENT:
        return f"its ReplicaSet {owner.name} has no Deployment as its controller"
    if deployment_uids.get((namespace, deployment.name)) != deployment.uid:
        return f"its Deployment {deployment.name} is not one the operator manages"
    return ""
