"""Label keys and values on the Kubernetes objects hotset creates.

The operator stamps them on worker pods; the router selects worker pods by
them. One definition so the selector and the stamp cannot disagree.

Pools are keyed so that no ServedModel's name can reach another pool: the
shared pool's pods carry ``hotset.io/pool=shared``; a dedicated group's
pods carry ``hotset.io/pool=dedicated`` and
``hotset.io/servedmodel=<its model>``. A Deployment selects exactly its
pool's labels, so the shared pool never selects a dedicated pod and two
dedicated groups never select each other's, whatever the models are called.
"""
from __future__ import annotations

from typing import Mapping

PART_OF = "app.kubernetes.io/part-of"
COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = "app.kubernetes.io/managed-by"
NAME = "app.kubernetes.io/name"
POOL = "hotset.io/pool"              # SHARED_POOL, or DEDICATED_POOL on every dedicated group's pods
SERVED_MODEL = "hotset.io/servedmodel"  # on a dedicated group (Deployment and pods): the one model it pins

# Annotations. On a worker pod, set by the operator: it is being emptied before the pool shrinks
# (the router places nothing new there and moves wanted copies off). On a ServedModel, set by the
# router: a request waits for a pod of this model (unix seconds), so the operator starts one.
DRAINING = "hotset.io/draining"
WANTED_AT = "hotset.io/wanted-at"
# On a ServedModel, set by whoever approves a generation of it where approval is required: which
# generation, and the identity approving it (user name, groups joined by commas). The chart's
# ValidatingAdmissionPolicy lets only that identity write them, and only when it may update
# servedmodels/approval; the operator checks the same with a SubjectAccessReview.
APPROVED_GENERATION = "approval.hotset.io/generation"
APPROVED_BY_USER = "approval.hotset.io/user"
APPROVED_BY_GROUPS = "approval.hotset.io/groups"
APPROVAL_SUBRESOURCE = "approval"  # the RBAC subresource of servedmodels whose update verb approves
# Kubernetes' own: the ReplicaSet controller removes pods of lower cost first when scaling down.
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"

PROJECT = "hotset"
OPERATOR_MANAGER = "hotset-operator"  # the managed-by value of what the operator makes
WORKER = "worker"
OPERATOR = "operator"
SHARED_POOL = "shared"
DEDICATED_POOL = "dedicated"

# Every hotset worker pod, shared or dedicated, matches this selector.
WORKER_SELECTOR = f"{PART_OF}={PROJECT},{COMPONENT}={WORKER}"


def pool_labels(dedicated_to: str | None = None) -> dict[str, str]:
    """The labels that put a worker pod in its pool: the shared one, or the dedicated group of one model."""
    if dedicated_to is None:
        return {POOL: SHARED_POOL}
    return {POOL: DEDICATED_POOL, SERVED_MODEL: dedicated_to}


def dedicated_pool(model: str) -> str:
    """The key of `model`'s dedicated group, as ``pool_of`` returns it ('/' never occurs in a model name)."""
    return f"{DEDICATED_POOL}/{model}"


def pool_of(pod_labels: Mapping[str, str]) -> str:
    """The pool a worker pod serves: SHARED_POOL, ``dedicated_pool(model)``, or "" when its labels name none."""
    pool = pod_labels.get(POOL, "")
    if pool == SHARED_POOL:
        return SHARED_POOL
    if pool == DEDICATED_POOL and pod_labels.get(SERVED_MODEL):
        return dedicated_pool(pod_labels[SERVED_MODEL])
    return ""
