"""Converging the pools from the indexes: the WorkerPool timer's work, one pass at a time.

A WorkerPool covers namespaces: every watched one in shared mode (there is
one pool, in the operator's namespace), its own in namespace mode. One pass:

1. **admission** of every model (``admission.decide``, from the index);
2. the **model store** of each covered namespace (the ConfigMap its worker
   pods mount), written only when it changed;
3. the **shared pool**: demand from its workers' reports (``demand``), the
   target it asks for (``autoscaler``), ``spec.replicas`` through the scale
   subresource when the operator autoscales (the HPA or KEDA write it
   otherwise), then one step of ``drain.plan`` towards it on the Deployment;
4. each **dedicated group** in the covered namespaces: ``replicas.min..max``
   pods from its own reports, none once a min-0 group has been idle.

The pass returns the WorkerPool's status. A lock makes a pass and the
per-object handlers' store writes take turns, so a stale reader never
writes last.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from modelplane_common import labels, quantity
from modelplane_common.spec import ModelSpec, Placement
from modelplane_common.wire import WorkerStatus
from modelplane_operator import admission as admission_module
from modelplane_operator import autoscaler, demand, drain, kinds, kube, workers, workloads
from modelplane_operator.config import Autoscaling, OperatorConfig, PoolMode
from modelplane_operator.index import ModelEntry, Quota
from modelplane_operator.metrics import OperatorMetrics

DRAIN_COST = "-1000"  # pod-deletion-cost of a drained pod: lower than every other pod's (default 0)
STORE_REFRESH_S = 60.0  # re-apply an unchanged model store this often (someone may have edited it)

Logger = logging.Logger | logging.LoggerAdapter


def owner_reference(body: Mapping[str, Any], controller: bool = True) -> dict[str, Any]:
    meta = body["metadata"]
    return {"apiVersion": body.get("apiVersion", kinds.API_VERSION), "kind": body["kind"], "name": meta["name"],
            "uid": meta["uid"], "controller": controller, "blockOwnerDeletion": True}


def entry_owner(entry: ModelEntry) -> dict[str, Any]:
    return {"apiVersion": kinds.API_VERSION, "kind": "ServedModel", "name": entry.name, "uid": entry.uid,
            "controller": False, "blockOwnerDeletion": True}


@dataclass
class PoolView:
    """One WorkerPool as a pass reads it."""

    namespace: str
    name: str
    min_pods: int
    max_pods: int
    replicas: int | None  # spec.replicas (the autoscaler's or the HPA's); None: never set
    autoscaling: Autoscaling
    owner: dict[str, Any]

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> "PoolView":
        spec = body.get("spec") or {}
        replicas = spec.get("replicas")
        return cls(namespace=body["metadata"]["namespace"], name=body["metadata"]["name"],
                   min_pods=int(spec.get("minReplicas", 0)), max_pods=int(spec.get("maxReplicas", 1)),
                   replicas=None if replicas is None else int(replicas),
                   autoscaling=Autoscaling(spec.get("autoscaling", Autoscaling.OPERATOR.value)),
                   owner=owner_reference(body))


class Converger:
    def __init__(self, kube_api: kube.Kube, config: OperatorConfig, metrics: OperatorMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.kube = kube_api
        self.config = config
        self.metrics = metrics or OperatorMetrics()
        self.clock = clock
        self.wall = wall
        self.lock = threading.RLock()
        self.stabilizer = autoscaler.Stabilizer(config.scale_down_delay_s, clock)
        self.memories: dict[tuple[str, str], demand.DemandMemory] = defaultdict(lambda: demand.DemandMemory(clock))
        ttl = min(config.status_interval_s, config.pool_sync_interval_s) / 2
        self.reports = workers.ReportCache(ttl_s=ttl, clock=clock)
        self.owners: list[dict[str, Any]] = []  # the operator's Deployment: owner of the pool in its namespace
        self._applied: dict[tuple[str, str], tuple[str, float]] = {}  # (kind, namespace) -> (manifest hash, when)

    def _apply_if_changed(self, key: tuple[str, str], manifest: dict[str, Any], apply: Callable[[dict[str, Any]], Any],
                          force: bool = False) -> bool:
        """Apply `manifest` unless it is what was last applied under `key` (and that was recent)."""
        digest = hashlib.sha256(repr(manifest).encode()).hexdigest()
        last = self._applied.get(key)
        if not force and last is not None and last[0] == digest and self.clock() - last[1] < STORE_REFRESH_S:
            return False
        apply(manifest)
        self._applied[key] = (digest, self.clock())
        return True

    # --- the WorkerPool objects -----------------------------------------------------------

    def pool_manifest(self, namespace: str, entries: Iterable[ModelEntry]) -> dict[str, Any] | None:
        """The fields of `namespace`'s WorkerPool the operator owns; None: it should not exist.

        The pool in the operator's namespace (shared mode) is owned by the operator's Deployment;
        a namespace's own pool (namespace mode) by that namespace's ServedModels, so it goes with
        the last of them."""
        if self.config.pool_mode is PoolMode.SHARED:
            if namespace != self.config.namespace:
                return None
            owners = list(self.owners)
        else:
            owners = [entry_owner(e) for e in entries if e.namespace == namespace
                      and e.spec is not None and e.spec.placement is Placement.SHARED]
            if not owners:
                return None
        return workloads.build_worker_pool(self.config, namespace, self.config.pool_min_pods, owners)

    def ensure_pool(self, namespace: str, entries: Iterable[ModelEntry]) -> None:
        """Create `namespace`'s WorkerPool if it should exist and does not (startup, a first model)."""
        manifest = self.pool_manifest(namespace, entries)
        if manifest is not None:
            # Created with a size, so its scale subresource answers before anyone scaled it; the
            # operator's later applies leave spec.replicas to the autoscaler.
            manifest["spec"]["replicas"] = manifest["spec"]["minReplicas"]
            self.kube.create_if_absent(manifest, kinds.WORKER_POOLS)

    def is_managed(self, namespace: str, name: str) -> bool:
        if name != self.config.pool_name:
            return False
        return self.config.pool_mode is PoolMode.NAMESPACE or namespace == self.config.namespace

    def hosts_pool(self, namespace: str, pools: Mapping[str, Mapping[str, Any]]) -> bool:
        """Whether a shared pool runs in `namespace` (`pools`: the managed WorkerPools known, by namespace)."""
        if self.config.pool_mode is PoolMode.SHARED:
            return namespace == self.config.namespace
        return namespace in pools

    def managed_pools(self, bodies: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
        """The WorkerPools this operator converges, by namespace (one pool per namespace)."""
        found = {}
        for body in bodies:
            meta = body["metadata"]
            if self.is_managed(meta["namespace"], meta["name"]) and not meta.get("deletionTimestamp"):
                found[meta["namespace"]] = body
        return found

    def publish_stores(self, namespaces: Iterable[str], accepted: Sequence[ModelEntry],
                       pools: Mapping[str, Mapping[str, Any]]) -> None:
        """Each namespace's model store; a pool's namespace only once its WorkerPool is known (it owns the store)."""
        for namespace in namespaces:
            hosts = self.hosts_pool(namespace, pools)
            if hosts and namespace not in pools:
                continue  # its WorkerPool is being created: a later pass publishes with it as owner
            owner = owner_reference(pools[namespace]) if hosts else None
            self.publish_store(namespace, accepted, owner, hosts_pool=hosts)

    def run_pass(self, pool_bodies: Sequence[Mapping[str, Any]], entries: Sequence[ModelEntry],
                 quotas: Mapping[str, Sequence[Quota]], quota_bodies: Sequence[Mapping[str, Any]], logger: Logger) -> None:
        """One pass over everything: admission, model stores, every managed pool, every dedicated
        group, then the pools' and quotas' status where it changed."""
        with self.lock:
            decided = admission_module.decide(entries, quotas, self.config)
            accepted = decided.accepted(entries)
            pools = self.managed_pools(pool_bodies)
            namespaces = sorted({e.namespace for e in accepted} | set(pools)
                                | ({self.config.namespace} if self.config.pool_mode is PoolMode.SHARED else set()))
            self.publish_stores(namespaces, accepted, pools)
            self.record_quotas(namespaces, decided, quotas)
            for _, body in sorted(pools.items()):
                self.converge_pool_object(body, entries, accepted, logger)
            for entry in accepted:
                if entry.spec is not None and entry.spec.placement is Placement.DEDICATED:
                    self.converge_dedicated(entry, entry.spec, logger)
            self.write_quota_status(decided, quota_bodies)

    def converge_pool_object(self, body: Mapping[str, Any], entries: Sequence[ModelEntry],
                             accepted: Sequence[ModelEntry], logger: Logger) -> None:
        """A WorkerPool's own fields, its pool, and its status."""
        meta = body["metadata"]
        manifest = self.pool_manifest(meta["namespace"], entries)
        if manifest is not None:
            self._apply_if_changed(("pool", meta["namespace"]), manifest,
                                   lambda m: self.kube.apply_custom(m, kinds.WORKER_POOLS))
        status = self.converge_pool(PoolView.of(body), accepted, logger)
        current = body.get("status") or {}
        if any(current.get(k) != v for k, v in status.items()):
            self.kube.patch_custom_status(meta["namespace"], meta["name"], kinds.WORKER_POOLS, status)

    def write_quota_status(self, decided: admission_module.Admission, bodies: Sequence[Mapping[str, Any]]) -> None:
        for body in bodies:
            meta = body["metadata"]
            used = decided.usage.get(meta["namespace"], admission_module.Usage())
            status = {"used": {"memory": quantity.format_bytes(used.memory), "copies": used.copies,
                               "gpus": round(used.gpus, 2)},
                      "refused": decided.refused_in(meta["namespace"])}
            current = body.get("status") or {}
            if any(current.get(k) != v for k, v in status.items()):
                self.kube.patch_custom_status(meta["namespace"], meta["name"], kinds.MODEL_QUOTAS, status)

    # --- worker reports ------------------------------------------------------------------

    def pool_reports(self, namespace: str) -> tuple[list[kube.WorkerPod], dict[str, WorkerStatus]]:
        pods = self.kube.worker_pods(namespace, labels.WORKER_SELECTOR)
        reports = self.reports.get(namespace, lambda: workers.fetch_reports(pods, self.config.worker_port,
                                                                            self.config.worker_token))
        return pods, reports

    # --- model stores ------------------------------------------------------------------

    def publish_store(self, namespace: str, accepted: Sequence[ModelEntry], pool_owner: dict[str, Any] | None,
                      hosts_pool: bool) -> None:
        """Write `namespace`'s model store ConfigMap if it changed: its pool's shared models (when it
        hosts a pool) and one key per dedicated model of the namespace."""
        shared = [e.spec for e in accepted if e.spec is not None and e.spec.placement is Placement.SHARED
                  and self.config.pool_namespace(e.namespace) == namespace] if hosts_pool else []
        dedicated_entries = [e for e in accepted if e.namespace == namespace and e.spec is not None
                             and e.spec.placement is Placement.DEDICATED]
        owners = ([pool_owner] if pool_owner else []) + [entry_owner(e) for e in dedicated_entries]
        if not owners:
            return  # no pool and no dedicated model here: nobody mounts it
        configmap = workloads.build_model_store_configmap(
            shared, self.config, owners=owners, namespace=namespace,
            dedicated=[e.spec for e in dedicated_entries if e.spec is not None])
        self._apply_if_changed(("store", namespace), configmap, self._write_store)

    def _write_store(self, configmap: dict[str, Any]) -> None:
        namespace = configmap["metadata"]["namespace"]
        version = self.kube.apply_configmap(configmap)
        # The kubelet refreshes a ConfigMap volume on its periodic pod sync (up to a minute and
        # more); a changed pod makes it sync that pod now, so a new model reaches the pods in seconds.
        self.kube.annotate_pods(namespace, labels.WORKER_SELECTOR, {workloads.STORE_VERSION: version})

    def record_quotas(self, namespaces: Iterable[str], decided: admission_module.Admission,
                      quotas: Mapping[str, Sequence[Quota]]) -> None:
        for namespace in namespaces:
            used = decided.usage.get(namespace, admission_module.Usage())
            for resource, value in (("memory", used.memory), ("copies", used.copies), ("gpus", used.gpus)):
                self.metrics.quota_used.labels(namespace, resource).set(value)
            for quota in quotas.get(namespace, ()):
                for resource in ("memory", "copies", "gpus"):
                    if (limit := getattr(quota, resource)) is not None:
                        self.metrics.quota_limit.labels(namespace, resource).set(limit)
            self.metrics.quota_refused.labels(namespace).set(len(decided.refused_in(namespace)))

    def converge_pool(self, pool: PoolView, accepted: Sequence[ModelEntry], logger: Logger) -> dict[str, Any]:
        config = self.config
        specs = {e.name: e.spec for e in accepted if e.spec is not None and e.spec.placement is Placement.SHARED
                 and config.pool_namespace(e.namespace) == pool.namespace}
        wanted_at = {e.name: e.wanted_at for e in accepted if e.name in specs}
        pods, reports = self.pool_reports(pool.namespace)
        pool_pods = [p for p in pods if p.pool == labels.SHARED_POOL]
        pool_reports = {p.name: reports[p.name] for p in pool_pods if p.name in reports}
        wants = demand.pool_wants(specs, pool_reports, wanted_at, self.memories[(pool.namespace, pool.name)],
                                  self.wall(), config.target_inflight_per_copy, config.queue_wait_s)
        target = autoscaler.pool_target(wants, config.pod_memory_budget, pool.min_pods, pool.max_pods)
        deployment = self.kube.deployment(pool.namespace, pool.name)
        current = deployment.replicas if deployment is not None else 0
        key = ("pool", pool.namespace, pool.name)
        reason = target.reason
        if pool.autoscaling is Autoscaling.OPERATOR:
            desired, left = self.stabilizer.settle(key, target.pods, current)
            if left > 0:
                reason += f"; holding {current} pods {left:.0f}s more before shrinking to {target.pods}"
            if pool.replicas != desired:
                self.kube.scale_custom(pool.namespace, pool.name, kinds.WORKER_POOLS, desired)
        else:
            asked = pool.replicas if pool.replicas is not None else target.floor
            desired = min(max(asked, target.floor, pool.min_pods), pool.max_pods)
            reason = f"external autoscaler asks {asked} pods (floor {target.floor}: min copies and held requests); {reason}"
        step = self.step_pool(pool, pool_pods, pool_reports, specs, current if deployment else desired, desired)
        manifest = workloads.build_pool_deployment(config, step.replicas, [pool.owner], pool.namespace)
        self._apply_if_changed(("deployment", pool.namespace), manifest, self.kube.apply_deployment,
                               force=deployment is None or step.replicas != current)
        # At most one of its pods away at a time for voluntary disruptions; goes with the pool.
        budget = workloads.build_disruption_budget(pool.name, pool.namespace, None)
        budget["metadata"]["ownerReferences"] = [pool.owner]
        self._apply_if_changed(("budget", pool.namespace), budget, self.kube.apply_disruption_budget)
        if deployment is None or step.replicas != current:
            if deployment is not None:
                logger.info("pool %s/%s: %d -> %d pods (%s)", pool.namespace, pool.name, current, step.replicas,
                            step.reason or reason)
            self.metrics.scaled(pool.namespace, pool.name, current, step.replicas)
        self.metrics.pods.labels(pool.namespace, pool.name).set(step.replicas)
        for gauge, value in ((self.metrics.desired, desired), (self.metrics.min_pods, pool.min_pods),
                             (self.metrics.max_pods, pool.max_pods), (self.metrics.lower_bound, target.lower_bound),
                             (self.metrics.wanted_bytes, target.wanted_bytes)):
            gauge.labels(pool.namespace, pool.name).set(value)
        return {
            "replicas": deployment.pods if deployment else 0,
            "readyReplicas": deployment.ready if deployment else 0,
            "selector": workloads.pool_selector(),
            "desiredReplicas": desired,
            "lowerBound": target.lower_bound,
            "packedPods": target.packed,
            "wantedBytes": target.wanted_bytes,
            "reason": (step.reason + "; " if step.reason else "") + reason,
            "draining": step.drain or next((p.name for p in pool_pods if p.draining_since is not None
                                            and p.name not in step.undrain and p.name != step.removes), ""),
        }

    def step_pool(self, pool: PoolView, pods: Sequence[kube.WorkerPod], reports: Mapping[str, WorkerStatus],
                  specs: Mapping[str, ModelSpec], current: int, desired: int) -> drain.Step:
        """One step of drain.plan, with its annotations written."""
        views = [drain.PoolPod(p.name, p.ready, p.draining_since, reports.get(p.name)) for p in pods]
        step = drain.plan(views, current, desired, specs, self.wall(), self.config.drain_timeout_s)
        for name in step.undrain:
            self.kube.patch_pod_annotations(pool.namespace, name, {labels.DRAINING: None, labels.POD_DELETION_COST: None})
        if step.drain:
            self.kube.patch_pod_annotations(pool.namespace, step.drain, {labels.DRAINING: f"{self.wall():.3f}",
                                                                         labels.POD_DELETION_COST: DRAIN_COST})
        return step

    # --- dedicated groups ----------------------------------------------------------------

    def converge_dedicated(self, entry: ModelEntry, spec: ModelSpec, logger: Logger) -> None:
        """replicas.min..max pods on the model's load; none once a min-0 group has been idle."""
        name = workloads.dedicated_name(spec.id)
        deployment = self.kube.deployment(entry.namespace, name)
        if deployment is None:
            return  # its ServedModel's handler creates it
        found = self.kube.deployment_owners(entry.namespace, name)
        if found is not None and not workloads.is_ours(found, entry.uid):
            return  # someone else's Deployment by that name: never scaled (the model is refused for it)
        pods, reports = self.pool_reports(entry.namespace)
        own = [p for p in pods if p.pool == labels.dedicated_pool(spec.id)]
        target, why = demand.dedicated_pods(spec, [reports[p.name] for p in own if p.name in reports], entry.wanted_at,
                                            self.memories[(entry.namespace, name)], self.wall(),
                                            self.config.target_inflight_per_copy)
        current = deployment.replicas
        delay = 0.0 if target == 0 else None  # idle time was the delay of scaling to zero
        desired, _ = self.stabilizer.settle(("dedicated", entry.namespace, name), target, current, delay)
        if desired == current:
            return
        if desired < current and own:
            quietest = min(own, key=lambda p: (drain.busy(drain.PoolPod(p.name, p.ready, None, reports.get(p.name))), p.name))
            self.kube.patch_pod_annotations(entry.namespace, quietest.name, {labels.POD_DELETION_COST: DRAIN_COST})
        with self.lock:
            self.kube.scale_deployment(entry.namespace, name, desired)
        logger.info("dedicated group %s/%s: %d -> %d pods (%s)", entry.namespace, name, current, desired, why)
        self.metrics.scaled(entry.namespace, name, current, desired)
        self.metrics.desired.labels(entry.namespace, name).set(desired)
