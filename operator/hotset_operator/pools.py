"""Pool sizing: every ``pool_sync_interval_s``, each pool and dedicated group sized from its workers.

One pass:

1. **reports**: every worker pod's ``GET /status``, asked at once, each
   for what changed since its last report (``workers.Reports``), indexed by model (``fleet.py``); the models
   whose copies changed have their status re-derived (``reconciler.py``);
2. **each WorkerPool** (from its kopf index): its own fields, demand from its
   workers' reports (``demand``), the target it asks for (``autoscaler``),
   ``spec.replicas`` through the scale subresource when the operator
   autoscales (the HPA or KEDA write it otherwise), then one step of
   ``drain.plan`` towards it on the Deployment, and its status where it
   changed;
3. **each dedicated group**: ``replicas.min..max`` pods from its own
   reports, none once a min-0 group has been idle;

   both held within their namespace's ModelQuota (``quota_bounds``): a
   pool's wanted copies, a namespace pool's pods (their GPUs) and a
   dedicated group's pods grow only into what the quota leaves, and the
   WorkerPool's ``status.reason`` (a dedicated group: an event on its
   ServedModel) says when a quota held them;
4. **each namespace with worker pods**: its source-credentials Secret
   (``credentials.py``), gathered again only when a model that names
   credentials came, changed or went, or the Secrets' reads expired, and
   applied only when it changed; with worker identity on, before any of
   its pods is asked anything, the workers' ServiceAccount (outside the
   release namespace) and the cluster's ServiceAccount keys the pods verify
   their callers with (read from the API server every ``KEYS_REFRESH_S``).

With worker identity on, only pods that proved which pod they are
(``worker_proofs.ProvenPods``) are asked for reports; the others still count
for their pool's size.

What the pods need from their models (the Triton sidecar, oci:// image
volumes, which models name credentials) is kept by the reconciler as models
are published (``pool_contents.py``), so no pass walks the catalog for it.

Pods and Deployments come from kopf indexes, not from listing: a pass where
nothing changes asks the API server nothing (it re-applies what it owns once
a minute, in case someone edited it). No lock is held across the calls it
makes, and a pass costs the pods and the copies they report, not the models
in the catalog.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import defaultdict
from typing import Any, Callable, Mapping

from hotset_common import labels
from hotset_common import worker_ownership as ownership
from hotset_common.spec import ModelSpec
from hotset_common.worker_ownership import WorkerTrust
from hotset_common.wire import WorkerStatus
from hotset_common.worker_identity import BearerToken, WorkerIdentity
from hotset_operator import autoscaler, credentials, demand, drain, index, kinds, kube, quota_bounds, workers, workloads
from hotset_operator.admission import pod_gpus
from hotset_operator.config import Autoscaling, OperatorConfig, PoolMode
from hotset_operator.dedicated import model_ref
from hotset_operator.fleet import Fleet
from hotset_operator.index import DeploymentEntry, ModelEntry, PoolEntry, WorkerPod
from hotset_operator.metrics import OperatorMetrics
from hotset_operator.reconciler import ModelReconciler
from hotset_operator.worker_proofs import ProvenPods
from hotset_operator.writes import Writes

log = logging.getLogger(__name__)
DRAIN_COST = "-1000"  # pod-deletion-cost of a drained pod: lower than every other pod's (default 0)
REAPPLY_S = 60.0  # re-apply an unchanged manifest this often (someone may have edited it)
QUOTA_HELD = "QuotaHeldScaling"  # the event of a dedicated group its namespace's ModelQuota holds below demand
POOL_OWNERS = 8  # a namespace pool is owned by its oldest shared models, at most this many (see pool_owners)
KEYS_REFRESH_S = 300.0  # the cluster's ServiceAccount keys are read again this often (they rotate rarely)
KEYS_RETRY_S = 10.0  # ... and this soon after a read failed


class Pools:
    def __init__(self, config: OperatorConfig, kube_api: kube.Kube, metrics: OperatorMetrics, writes: Writes,
                 models: ModelReconciler, fleet: Fleet, indexes: Mapping[str, Mapping[Any, Any]],
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, proven: ProvenPods | None = None) -> None:
        self.config = config
        self.kube = kube_api
        self.metrics = metrics
        self.writes = writes
        self.models = models
        self.fleet = fleet
        self.indexes = indexes  # kopf indexes: worker_pools, worker_pods, managed_deployments
        self.owners: list[dict[str, Any]] = []  # the operator's Deployment: owner of the pool in its namespace
        self.clock = clock
        self.wall = wall
        self.stabilizer = autoscaler.Stabilizer(config.scale_down_delay_s, clock)
        self.memories: dict[tuple[str, str], demand.DemandMemory] = defaultdict(lambda: demand.DemandMemory(clock))
        self._applied: dict[tuple[str, ...], tuple[str, float]] = {}  # what was last applied, and when
        self._pool_owners: dict[str, tuple[int, list[dict[str, Any]]]] = {}  # namespace -> (version, owners)
        self._http = workers.client(BearerToken(path=config.worker_token_file or None), config.report_timeout_s)
        self.proven = proven  # worker identity on: only pods that proved which pod they are are asked
        self._keys: tuple[str, dict[str, Any]] | None = None  # the cluster's ServiceAccount issuer and keys
        self._keys_due = -math.inf  # when to read them again
        self.reports = workers.Reports(self._http, config.worker_port, on_bytes=metrics.report_bytes.inc)
        self._reasons: dict[str, str] = {}  # what each pool's demand said last (logged when it changes)
        self._refused: dict[tuple[str, str], str] = {}  # labelled pods that are not workers -> why (logged once)
        self.credentials = credentials.CredentialGatherer(kube_api, clock=clock)
        self._gathered: dict[str, tuple[int, float, dict[str, str]]] = {}  # namespace -> (version, when, data)
        self.ledger = quota_bounds.Ledger({})  # what each namespace's workloads take of its quotas (this pass)
        self._quota_held: dict[tuple[str, str], str] = {}  # dedicated group -> why its quota holds it (evented once)

    async def close(self) -> None:
        await self._http.aclose()
        if self.proven is not None:
            await self.proven.aclose()

    async def run(self) -> None:
        """A pass every pool_sync_interval_s, forever (cancel to stop); a failed pass is retried."""
        if self.config.owner_deployment:
            self.owners = [await asyncio.to_thread(self.kube.owner_reference, self.config.namespace,
                                                   self.config.owner_deployment)]
        while True:
            try:
                await self.converge()
                self.metrics.pool_passes.inc()
            except Exception:  # an API error, a pod gone mid-call: the next pass tries again
                log.exception("pool convergence pass failed; retrying in %.0fs", self.config.pool_sync_interval_s)
            await asyncio.sleep(self.config.pool_sync_interval_s)

    def trusted_pods(self) -> list[WorkerPod]:
        """The labelled pods that are workers: with the default trust, those the operator's own
        Deployments own (hotset_common.worker_ownership). Only these are asked for reports (once
        they proved which pod they are) and counted for copies, queues and scaling; the others are
        logged once."""
        pods = [p for p in index.values(self.indexes["worker_pods"]) if not p.deleting]
        if self.config.worker_trust is WorkerTrust.LABELLED:
            return pods
        replica_sets = {key: entry for key in list(self.indexes["worker_replica_sets"])
                        if (entry := index.one(self.indexes["worker_replica_sets"], key)) is not None}
        deployment_uids = {(d.namespace, d.name): d.uid for d in index.values(self.indexes["managed_deployments"])}
        trusted, refused = [], {}
        for pod in pods:
            why = ownership.why_not_owned(pod.namespace, pod.claim, replica_sets, deployment_uids)
            if why:
                refused[(pod.namespace, pod.name)] = why
            else:
                trusted.append(pod)
        for key in refused.keys() - self._refused.keys():
            log.warning("pod %s/%s has the worker labels but is not asked for reports: %s", *key, refused[key])
        self._refused = refused
        return trusted

    async def converge(self) -> None:
        pods = self.trusted_pods()
        asked, unproven = (await self.proven.only_proven(pods)) if self.proven is not None else (pods, {})
        # Labelled pods asked nothing: no Deployment of the operator owns them, or they did not prove who they are.
        self.metrics.unowned_worker_pods.set(len(self._refused) + len(unproven))
        reports = await self.reports.fetch(asked)
        changed = self.fleet.update(pods, reports)
        if changed:
            self.models.copies_changed(changed)
        for pod, preemption in self.fleet.new_preemptions(reports):
            self.models.preempted(pod, preemption)
        by_namespace: dict[str, list[WorkerPod]] = defaultdict(list)
        for pod in pods:
            by_namespace[pod.namespace].append(pod)
        await self.ensure_pools()
        pools = [pool for pool in sorted(index.values(self.indexes["worker_pools"]), key=lambda p: p.namespace)
                 if self.is_managed(pool)]
        dedicated = list(self.models.dedicated_models())
        self.ledger = self.new_ledger(dedicated)
        owners: dict[str, list[dict[str, Any]]] = defaultdict(list)  # namespace -> who its Secrets go with
        for pool in pools:
            owners[pool.namespace].append(pool.owner)
        for entry in dedicated:
            if len(owners[entry.namespace]) < POOL_OWNERS:
                owners[entry.namespace].append(_model_owner(entry))
        if self.config.worker_identity is WorkerIdentity.POD_TOKEN:  # before the pods it concerns
            await self.converge_identity(owners)
        for pool in pools:
            await self.converge_pool(pool, by_namespace.get(pool.namespace, []))
        for entry in dedicated:
            await self.converge_dedicated(entry, by_namespace.get(entry.namespace, []))
        for namespace in sorted(owners):
            await self.converge_credentials(namespace, owners[namespace])

    # --- worker identity ----------------------------------------------------------------------

    async def converge_identity(self, owners: Mapping[str, list[dict[str, Any]]]) -> None:
        """In each namespace with worker pods: the workers' ServiceAccount (outside the release
        namespace: the kubelet projects the pods' identity tokens for it) and the cluster's
        ServiceAccount keys the pods verify their callers with, read again every KEYS_REFRESH_S
        (kept as they were when the API server does not answer)."""
        if self.clock() >= self._keys_due:
            try:
                self._keys = await asyncio.to_thread(self.kube.issuer_keys)
                self._keys_due = self.clock() + KEYS_REFRESH_S
            except Exception as exc:  # noqa: BLE001 - pods keep the keys they have; asked again soon
                self._keys_due = self.clock() + KEYS_RETRY_S
                log.warning("could not read the cluster's ServiceAccount keys (again in %.0f s): %s", KEYS_RETRY_S, exc)
        for namespace in sorted(owners):
            account = workloads.build_worker_service_account(self.config, namespace, owners[namespace])
            if account is not None:
                await self._apply_if_changed(("worker-account", namespace), account, self.kube.apply_service_account)
            keys = workloads.build_issuer_keys(self.config, namespace, self._keys,
                                               owners[namespace] if namespace != self.config.namespace else self.owners)
            if keys is not None:
                await self._apply_if_changed(("issuer-keys", namespace), keys, self.kube.apply_config_map)

    def new_ledger(self, dedicated: list[ModelEntry]) -> quota_bounds.Ledger:
        """This pass's ledger of quota use: every dedicated group as it runs now, with its
        replicas.min as its floor (the pools, decided first, grow only beside those)."""
        ledger = quota_bounds.Ledger(index.quotas(self.models.model_quotas))
        for entry in dedicated:
            if entry.spec is None or not ledger.limited(entry.namespace):
                continue
            name = workloads.dedicated_name(entry.spec.id)
            deployment = index.one(self.indexes["managed_deployments"], (entry.namespace, name))
            unit = quota_bounds.dedicated_unit(entry.spec, pod_gpus(self.config))
            ledger.hold(entry.namespace, ("dedicated", name), quota_bounds.times(unit, deployment.replicas if deployment else 0),
                        quota_bounds.times(unit, entry.spec.replicas.min))
        return ledger

    # --- source credentials -------------------------------------------------------------------

    async def converge_credentials(self, namespace: str, owners: list[dict[str, Any]]) -> None:
        """`namespace`'s credentials Secret: the keys of the Secrets its pods' models name. The pods
        read it from a Secret volume, which the kubelet refreshes at its pod sync (about a minute):
        a new or rotated Secret reaches them then, with no pod changed."""
        version = self.models.contents.version(namespace)
        held = self._gathered.get(namespace)
        if held is None or held[0] != version or self.clock() - held[1] >= self.credentials.ttl_s:
            specs = self.models.contents.credential_specs(namespace)
            data = await asyncio.to_thread(self.credentials.data, specs) if specs else {}
            held = self._gathered[namespace] = (version, self.clock(), data)
        secret = credentials.build_credentials_secret(self.config, namespace, held[2], owners)
        await self._apply_if_changed(("credentials", namespace), secret, self.kube.apply_secret)

    # --- the WorkerPool objects ---------------------------------------------------------------

    def is_managed(self, pool: PoolEntry) -> bool:
        if pool.name != self.config.pool_name or pool.deleting:
            return False
        return self.config.pool_mode is PoolMode.NAMESPACE or pool.namespace == self.config.namespace

    def pool_owners(self, namespace: str) -> list[dict[str, Any]] | None:
        """Who owns `namespace`'s WorkerPool; None: it should not exist.

        The pool in the operator's namespace (shared mode) is owned by the operator's Deployment.
        A namespace's own pool (namespace mode) goes with the last of its shared models: it is
        owned by its oldest ones, at most POOL_OWNERS (the garbage collector removes it once all
        of its owners are gone, and the owners are replaced as models leave); not by every model,
        which would make the object grow, and be rewritten, with each model added."""
        if self.config.pool_mode is PoolMode.SHARED:
            return list(self.owners) if namespace == self.config.namespace else None
        version = self.models.pool_versions.get(namespace, 0)
        cached = self._pool_owners.get(namespace)
        if cached is None or cached[0] != version:
            owners = [_model_owner(e) for e in self.models.oldest_shared(namespace, POOL_OWNERS)]
            cached = self._pool_owners[namespace] = (version, owners)
        return cached[1] or None

    def pool_manifest(self, namespace: str) -> dict[str, Any] | None:
        owners = self.pool_owners(namespace)
        if owners is None:
            return None
        return workloads.build_worker_pool(self.config, namespace, self.config.pool_min_pods, owners)

    async def ensure_pools(self) -> None:
        """The WorkerPool of each namespace that should have one and has none (created with a size,
        so its scale subresource answers before anyone scaled it)."""
        wanted = ([self.config.namespace] if self.config.pool_mode is PoolMode.SHARED
                  else self.models.pool_namespaces())
        for namespace in wanted:
            if index.one(self.indexes["worker_pools"], (namespace, self.config.pool_name)) is not None:
                continue
            await self.ensure_pool(namespace)

    async def ensure_pool(self, namespace: str) -> None:
        manifest = self.pool_manifest(namespace)
        if manifest is not None:
            manifest["spec"]["replicas"] = manifest["spec"]["minReplicas"]
            await asyncio.to_thread(self.kube.create_if_absent, manifest, kinds.WORKER_POOLS)

    async def _apply_if_changed(self, key: tuple[str, ...], manifest: dict[str, Any],
                                apply: Callable[[dict[str, Any]], Any], force: bool = False) -> bool:
        """Apply `manifest` unless it is what was last applied under `key` (and that was recent)."""
        digest = hashlib.sha256(repr(manifest).encode()).hexdigest()
        last = self._applied.get(key)
        if not force and last is not None and last[0] == digest and self.clock() - last[1] < REAPPLY_S:
            return False
        await asyncio.to_thread(apply, manifest)
        self._applied[key] = (digest, self.clock())
        return True

    # --- a shared pool ------------------------------------------------------------------------

    def _wanted_at(self, specs: Mapping[str, ModelSpec]) -> dict[str, float]:
        """When a request last waited for a pod of each of `specs` (the router's annotation)."""
        found: dict[str, float] = {}
        for (_, name), at in self.models.served.wanted.items():
            if name in specs:
                found[name] = max(found.get(name, 0.0), at)
        return found

    async def converge_pool(self, pool: PoolEntry, pods: list[WorkerPod]) -> None:
        """A WorkerPool's own fields, its size, its Deployment, and its status."""
        config = self.config
        if (manifest := self.pool_manifest(pool.namespace)) is not None:
            await self._apply_if_changed(("pool", pool.namespace), manifest,
                                         lambda m: self.kube.apply_custom(m, kinds.WORKER_POOLS))
        specs = self.models.pool_specs(pool.namespace)
        pool_pods = [p for p in pods if p.pool == labels.SHARED_POOL]
        pool_reports = self.fleet.reports_in(pool.namespace, pool_pods)
        wants = demand.pool_wants(specs, pool_reports, self._wanted_at(specs), self.memories[(pool.namespace, pool.name)],
                                  self.wall(), config.target_inflight_per_copy, config.queue_wait_s)
        own_pods = config.pool_mode is PoolMode.NAMESPACE  # its pods (and their GPUs) are its namespace's
        unit = quota_bounds.copy_unit(config.pod_memory_budget, pod_gpus(config), gpus_with_copies=not own_pods)
        wants, held_by_quota = self.ledger.trim_wants(wants, specs, ("copies", pool.name), unit)
        target = autoscaler.pool_target(wants, config.pod_memory_budget, pool.min_pods, pool.max_pods)
        if target.reason != self._reasons.get(pool.namespace):
            self._reasons[pool.namespace] = target.reason
            log.debug("pool %s/%s: %d reports; %s", pool.namespace, pool.name, len(pool_reports), target.reason)
        deployment: DeploymentEntry | None = index.one(self.indexes["managed_deployments"], (pool.namespace, pool.name))
        current = deployment.replicas if deployment is not None else 0
        reason = target.reason
        if pool.autoscaling is Autoscaling.OPERATOR:
            desired, left = self.stabilizer.settle(("pool", pool.namespace, pool.name), target.pods, current)
            if left > 0:
                reason += f"; holding {current} pods {left:.0f}s more before shrinking to {target.pods}"
        else:
            asked = pool.replicas if pool.replicas is not None else target.floor
            desired = min(max(asked, target.floor, pool.min_pods), pool.max_pods)
            reason = f"external autoscaler asks {asked} pods (floor {target.floor}: min copies and held requests); {reason}"
        if own_pods and pod_gpus(config):  # a namespace pool's pods hold its namespace's GPUs
            pod = quota_bounds.pod_unit(pod_gpus(config))
            cap = self.ledger.most(pool.namespace, ("pods", pool.name), pod, desired, "pods")
            if cap.allowed < desired:
                desired = cap.allowed
                held_by_quota.append(cap.reason)
        if held_by_quota:
            reason += "; held by quota: " + "; ".join(held_by_quota)
        if pool.autoscaling is Autoscaling.OPERATOR and pool.replicas != desired:
            await asyncio.to_thread(self.kube.scale_custom, pool.namespace, pool.name, kinds.WORKER_POOLS, desired)
        step = await self.step_pool(pool, pool_pods, pool_reports, specs, current if deployment else desired, desired)
        if own_pods and pod_gpus(config):  # what its pods take until the drained ones are gone
            pod = quota_bounds.pod_unit(pod_gpus(config))
            self.ledger.hold(pool.namespace, ("pods", pool.name), quota_bounds.times(pod, max(step.replicas, desired)),
                             quota_bounds.times(pod, min(target.floor, desired)))
        # The sidecar and image volumes follow the pool's models: its pods roll when its first Triton
        # model (auto) or a new oci:// source arrives, and when the last goes.
        manifest = workloads.build_pool_deployment(
            config, step.replicas, [pool.owner], pool.namespace, pods=pool.pods,
            serves_triton_models=self.models.contents.serves_triton(pool.namespace),
            images=self.models.contents.images(pool.namespace))
        await self._apply_if_changed(("deployment", pool.namespace), manifest, self.kube.apply_deployment,
                                     force=deployment is None or step.replicas != current)
        # At most one of its pods away at a time for voluntary disruptions; goes with the pool.
        budget = workloads.build_disruption_budget(pool.name, pool.namespace, None)
        budget["metadata"]["ownerReferences"] = [pool.owner]
        await self._apply_if_changed(("budget", pool.namespace), budget, self.kube.apply_disruption_budget)
        policy = workloads.build_network_policy(self.config, pool.name, pool.namespace, None, pool.owner)
        if policy is not None:
            await self._apply_if_changed(("network", pool.namespace), policy, self.kube.apply_network_policy)
        if deployment is None or step.replicas != current:
            if deployment is not None:
                log.info("pool %s/%s: %d -> %d pods (%s)", pool.namespace, pool.name, current, step.replicas,
                         step.reason or reason)
            self.metrics.scaled(pool.namespace, pool.name, current, step.replicas)
        self._record(pool, step.replicas, desired, target)
        status = {
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
        changed = {k: v for k, v in status.items() if pool.status.get(k) != v}
        if changed and self.writes.queued_status(kinds.WORKER_POOLS, pool.namespace, pool.name) != changed:
            self.writes.status(kinds.WORKER_POOLS, pool.namespace, pool.name, changed)

    def _record(self, pool: PoolEntry, replicas: int, desired: int, target: autoscaler.PoolTarget) -> None:
        self.metrics.pods.labels(pool.namespace, pool.name).set(replicas)
        for gauge, value in ((self.metrics.desired, desired), (self.metrics.min_pods, pool.min_pods),
                             (self.metrics.max_pods, pool.max_pods), (self.metrics.lower_bound, target.lower_bound),
                             (self.metrics.wanted_bytes, target.wanted_bytes)):
            gauge.labels(pool.namespace, pool.name).set(value)

    async def step_pool(self, pool: PoolEntry, pods: list[WorkerPod], reports: Mapping[str, WorkerStatus],
                        specs: Mapping[str, ModelSpec], current: int, desired: int) -> drain.Step:
        """One step of drain.plan, with its annotations written."""
        views = [drain.PoolPod(p.name, p.ready, p.draining_since, reports.get(p.name)) for p in pods]
        step = drain.plan(views, current, desired, specs, self.wall(), self.config.drain_timeout_s)
        for name in step.undrain:
            await asyncio.to_thread(self.kube.patch_pod_annotations, pool.namespace, name,
                                    {labels.DRAINING: None, labels.POD_DELETION_COST: None})
        if step.drain:
            await asyncio.to_thread(self.kube.patch_pod_annotations, pool.namespace, step.drain,
                                    {labels.DRAINING: f"{self.wall():.3f}", labels.POD_DELETION_COST: DRAIN_COST})
        return step

    # --- a dedicated group ----------------------------------------------------------------

    async def converge_dedicated(self, entry: ModelEntry, pods: list[WorkerPod]) -> None:
        """replicas.min..max pods on the model's load; none once a min-0 group has been idle."""
        spec = entry.spec
        if spec is None:
            return
        name = workloads.dedicated_name(spec.id)
        deployment: DeploymentEntry | None = index.one(self.indexes["managed_deployments"], (entry.namespace, name))
        if deployment is None or not workloads.is_ours((list(deployment.owners), deployment.managed_by), entry.uid):
            return  # made by dedicated.py once accepted; someone else's is never scaled
        memory = self.memories[(entry.namespace, name)]
        own = [p for p in pods if p.pool == labels.dedicated_pool(spec.id)]
        reports = self.fleet.reports_in(entry.namespace, own)
        if deployment.replicas == 0 and not own and spec.replicas.min == 0 and not _recently(
                entry.wanted_at, self.wall(), spec.replicas.idle_seconds) and memory.idle_for(spec.id) == math.inf:
            return  # scaled to zero and nothing asks for it: nothing to decide
        target, why = demand.dedicated_pods(spec, list(reports.values()), entry.wanted_at, memory, self.wall(),
                                            self.config.target_inflight_per_copy)
        current = deployment.replicas
        delay = 0.0 if target == 0 else None  # idle time was the delay of scaling to zero
        desired, _ = self.stabilizer.settle(("dedicated", entry.namespace, name), target, current, delay)
        desired = self._within_quota(entry, name, desired, why)
        if desired == current:
            return
        if desired < current and own:
            quietest = min(own, key=lambda p: (drain.busy(drain.PoolPod(p.name, p.ready, None, reports.get(p.name))), p.name))
            await asyncio.to_thread(self.kube.patch_pod_annotations, entry.namespace, quietest.name,
                                    {labels.POD_DELETION_COST: DRAIN_COST})
        await asyncio.to_thread(self.kube.scale_deployment, entry.namespace, name, desired)
        log.info("dedicated group %s/%s: %d -> %d pods (%s)", entry.namespace, name, current, desired, why)
        self.metrics.scaled(entry.namespace, name, current, desired)
        self.metrics.desired.labels(entry.namespace, name).set(desired)

    def _within_quota(self, entry: ModelEntry, name: str, desired: int, why: str) -> int:
        """`desired` pods of a dedicated group, as many as its namespace's quotas leave beside the
        namespace's other workloads; an event on the ServedModel when a quota holds it (once per reason)."""
        assert entry.spec is not None
        unit = quota_bounds.dedicated_unit(entry.spec, pod_gpus(self.config))
        cap = self.ledger.most(entry.namespace, ("dedicated", name), unit, desired, "pods")
        key = (entry.namespace, name)
        if cap.allowed < desired:
            if self._quota_held.get(key) != cap.reason:
                self._quota_held[key] = cap.reason
                log.info("dedicated group %s/%s: %d pods, not %d (%s): %s", entry.namespace, name, cap.allowed, desired,
                         why, cap.reason)
                self.writes.event(model_ref(entry), "Warning", QUOTA_HELD,
                                  f"dedicated group held at {cap.allowed} pods where demand asks {desired} ({why}): "
                                  f"{cap.reason}")
            desired = cap.allowed
        else:
            self._quota_held.pop(key, None)
        if self.ledger.limited(entry.namespace):
            self.ledger.hold(entry.namespace, ("dedicated", name), quota_bounds.times(unit, desired),
                             quota_bounds.times(unit, min(entry.spec.replicas.min, desired)))
        return desired


def _recently(at: float, now: float, within_s: float) -> bool:
    return at > 0 and 0 <= now - at < within_s


def _model_owner(entry: ModelEntry) -> dict[str, Any]:
    return {"apiVersion": kinds.API_VERSION, "kind": kinds.SERVED_MODEL, "name": entry.name, "uid": entry.uid,
            "controller": False, "blockOwnerDeletion": True}
