"""What the operator keeps in memory about the objects it watches: one small entry per object.

kopf indexes (``handlers/indexes.py``) hold these, updated on each event of
their object, so nothing lists the API server to learn what exists: the
ServedModels (validated once per spec generation), the ModelQuotas, the
WorkerPools, the worker pods and the Deployments the operator made. These
are pure functions from an object's body to its entry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from hotset_common import labels, quantity
from hotset_common.spec import ModelSpec
from hotset_common.worker_ownership import PodClaim
from hotset_operator import approval, kinds, validation, workloads
from hotset_operator.config import Autoscaling, OperatorConfig

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class ModelEntry:
    """One ServedModel as admission, the catalogs, the pools and its status need it."""

    namespace: str
    name: str
    uid: str
    created: str  # creationTimestamp: admission goes in creation order
    spec: ModelSpec | None  # None: the spec does not parse
    problems: tuple[validation.Problem, ...]  # what validation found (empty: valid)
    generation: int = 0  # metadata.generation: moves with every spec change, never with status
    wanted_at: float = 0.0  # unix seconds a request last waited for a pod of it (the router's annotation)
    deleting: bool = False
    incumbent: bool = False  # Accepted=True now: wins a tie on creationTimestamp (whole seconds)
    status: Mapping[str, Any] = field(default_factory=dict)  # .status as last seen
    gated: str = ""  # approval.gated(spec): what approval covers of this generation
    approval_request: approval.Request | None = None  # what its approval annotations ask for
    approved: approval.Approved | None = None  # status.approval: what was approved last

    @property
    def key(self) -> Key:
        return self.namespace, self.name

    @property
    def basis(self) -> tuple[str, int, bool, "approval.Approved | None"]:
        """Which version of this object a decision was made on: it changes with the spec, a
        deletion or an approval recorded, never with another status write or an annotation."""
        return self.uid, self.generation, self.deleting, self.approved

    @property
    def admission_key(self) -> tuple[Any, ...]:
        """What admission reads of this object: an edit of anything else (a description, a warm-up,
        a source) leaves every decision as it was, so it needs no admission pass. Whether the
        owner and on-call are named counts (a policy may require them), the priority (a quota
        may cap it), and the fields approval covers with what was approved last."""
        spec = self.spec
        reads = None if spec is None else (spec.memory_bytes, spec.replicas.min, spec.replicas.max, spec.placement,
                                           bool(spec.owner.strip()), bool(spec.oncall.strip()), spec.priority)
        return self.uid, self.created, self.deleting, self.problems, reads, self.gated, self.approved


@dataclass(frozen=True)
class Quota:
    """A namespace's allowance (ModelQuota.spec); None: no limit on that resource."""

    namespace: str
    name: str
    memory: int | None = None
    copies: int | None = None
    gpus: float | None = None
    require_owner: bool = False  # its namespace's models must name spec.owner and spec.oncall
    require_approval: bool = False  # its namespace's models are served only once approved (approval.py)
    max_priority: int | None = None  # the highest spec.priority its namespace's models may claim
    status: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolEntry:
    """One WorkerPool: its bounds, who scales it, and its status as last seen."""

    namespace: str
    name: str
    uid: str
    min_pods: int
    max_pods: int
    replicas: int | None  # spec.replicas (the autoscaler's or the HPA's); None: never set
    autoscaling: Autoscaling
    deleting: bool = False
    status: Mapping[str, Any] = field(default_factory=dict)
    pods: workloads.PoolPods = field(default_factory=workloads.PoolPods)  # its spec.scheduling and spec.tritonSidecar

    @property
    def owner(self) -> dict[str, Any]:
        """An ownerReference to this WorkerPool (its Deployment and budget go with it)."""
        return {"apiVersion": kinds.API_VERSION, "kind": kinds.WORKER_POOL, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}


@dataclass(frozen=True)
class WorkerPod:
    name: str
    ip: str
    phase: str
    ready: bool
    pool: str = ""  # labels.pool_of: "shared", labels.dedicated_pool(model), or ""
    problem: str = ""  # why a container is not running, as the kubelet reports it
    namespace: str = ""
    draining_since: float | None = None  # unix seconds, from labels.DRAINING
    deleting: bool = False
    claim: PodClaim = PodClaim(None)  # its controller and labels: whether the operator's Deployment owns it
    uid: str = ""  # what its identity token must be bound to (worker_proofs.py)


@dataclass(frozen=True)
class DeploymentEntry:
    """A Deployment this operator manages (labelled managed-by), as the pools and groups need it."""

    namespace: str
    name: str
    replicas: int  # spec: asked for
    pods: int  # status.replicas: pods it has
    ready: int
    owners: tuple[str, ...] = ()  # ownerReferences' uids
    managed_by: str = ""
    spec_hash: str = ""  # a dedicated group's hash of what its pods run (workloads.group_hash)
    uid: str = ""  # its pods' ReplicaSets name it by uid (hotset_common.worker_ownership)


def wanted_at(annotations: Mapping[str, str]) -> float:
    try:
        return float(annotations.get(labels.WANTED_AT, 0) or 0)
    except ValueError:
        return 0.0


def _accepted_now(status: Mapping[str, Any]) -> bool:
    found = status.get("conditions") or []
    return any(c.get("type") == "Accepted" and c.get("status") == "True" for c in found)


def model_entry(body: Mapping[str, Any], config: OperatorConfig, previous: ModelEntry | None = None) -> ModelEntry:
    """The entry of one ServedModel body. Validation (a pydantic parse and the operator's checks) runs
    once per spec generation: `previous`, the entry of the same object and generation, lends its verdict."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    uid, generation = str(meta.get("uid", "")), int(meta.get("generation") or 0)
    if previous is not None and (previous.uid, previous.generation) == (uid, generation) and generation:
        spec, problems, gated = previous.spec, previous.problems, previous.gated
    else:
        verdict = validation.validate(dict(body), config)
        spec, problems = verdict.spec, verdict.problems
        gated = "" if spec is None else approval.gated(spec)
    annotations = meta.get("annotations") or {}
    return ModelEntry(
        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), uid=uid,
        created=str(meta.get("creationTimestamp", "")), spec=spec, problems=problems, generation=generation,
        wanted_at=wanted_at(annotations), deleting=bool(meta.get("deletionTimestamp")),
        incumbent=_accepted_now(status), status=dict(status), gated=gated,
        approval_request=approval.request_of(annotations), approved=approval.approved_of(status))


def quota_entry(body: Mapping[str, Any]) -> Quota:
    """A ModelQuota body's limits (the CRD's schema has checked their shapes)."""
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    memory = spec.get("memory")
    return Quota(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
                 memory=None if memory is None else quantity.parse_bytes(memory),
                 copies=None if spec.get("copies") is None else int(spec["copies"]),
                 gpus=None if spec.get("gpus") is None else float(spec["gpus"]),
                 require_owner=bool(spec.get("requireOwner", False)),
                 require_approval=bool(spec.get("requireApproval", False)),
                 max_priority=None if spec.get("maxPriority") is None else int(spec["maxPriority"]),
                 status=dict(body.get("status") or {}))


def pool_entry(body: Mapping[str, Any]) -> PoolEntry:
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    replicas = spec.get("replicas")
    return PoolEntry(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
                     uid=str(meta.get("uid", "")), min_pods=int(spec.get("minReplicas", 0)),
                     max_pods=int(spec.get("maxReplicas", 1)), replicas=None if replicas is None else int(replicas),
                     autoscaling=Autoscaling(spec.get("autoscaling", Autoscaling.OPERATOR.value)),
                     deleting=bool(meta.get("deletionTimestamp")), status=dict(body.get("status") or {}),
                     pods=workloads.PoolPods.of(spec))


def _draining_since(annotations: Mapping[str, str]) -> float | None:
    value = annotations.get(labels.DRAINING)
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return 0.0  # set by hand: treated as draining since long ago


def _problem(container_statuses: Iterable[Mapping[str, Any]]) -> str:
    """The first container that is waiting or restarting, with the kubelet's reason."""
    for status in container_statuses:
        waiting = (status.get("state") or {}).get("waiting") or {}
        last = (status.get("lastState") or {}).get("terminated") or {}
        restarts = status.get("restartCount", 0)
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            detail = f": {last.get('reason')} (exit {last.get('exitCode')})" if last else ""
            return f"container {status.get('name')} {waiting.get('reason')}{detail}, {restarts} restart(s)"
        if not status.get("ready") and restarts and last:
            return (f"container {status.get('name')} restarted {restarts} time(s), "
                    f"last: {last.get('reason')} (exit {last.get('exitCode')})")
    return ""


def pod_entry(body: Mapping[str, Any]) -> WorkerPod:
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    conditions = status.get("conditions") or []
    return WorkerPod(
        name=str(meta.get("name", "")), ip=str(status.get("podIP") or ""), phase=str(status.get("phase") or ""),
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        pool=labels.pool_of(meta.get("labels") or {}), problem=_problem(status.get("containerStatuses") or []),
        namespace=str(meta.get("namespace", "")), draining_since=_draining_since(meta.get("annotations") or {}),
        deleting=bool(meta.get("deletionTimestamp")), claim=PodClaim.of(meta), uid=str(meta.get("uid", "")))


def deployment_entry(body: Mapping[str, Any]) -> DeploymentEntry:
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    template = ((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
    replicas = spec.get("replicas")
    return DeploymentEntry(
        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), uid=str(meta.get("uid", "")),
        replicas=1 if replicas is None else int(replicas), pods=int(status.get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        owners=tuple(str(ref.get("uid", "")) for ref in meta.get("ownerReferences") or []),
        managed_by=str((meta.get("labels") or {}).get(labels.MANAGED_BY, "")),
        spec_hash=str(template.get(workloads.SPEC_HASH, "")))


def values(index: Mapping[Any, Iterable[Any]]) -> list[Any]:
    """Every value of a kopf index, read on the event loop (the only writer of indexes)."""
    return [value for key in list(index) for value in index.get(key, ())]


def one(index: Mapping[Any, Iterable[Any]], key: Any) -> Any | None:
    """The value under `key` of an index holding one per key (the newest object's, should a name be
    reused while the old object is still known)."""
    found = list(index.get(key, ()))
    return found[-1] if found else None


def entries(index: Mapping[Any, Iterable[ModelEntry]]) -> list[ModelEntry]:
    """Every ServedModel entry, in a stable order."""
    return sorted(values(index), key=lambda e: (e.namespace, e.name))


def quotas(index: Mapping[Any, Iterable[Quota]]) -> dict[str, list[Quota]]:
    """The quotas by namespace (the index is keyed by namespace)."""
    return {namespace: sorted(index.get(namespace, ()), key=lambda q: q.name) for namespace in list(index)}
