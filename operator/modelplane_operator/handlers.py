"""kopf handlers: thin glue from events to the pure builders, and the one loop that converges pools.

- **Indexes** (``@kopf.index``) keep every ServedModel and ModelQuota in
  memory (``index.py``): nothing lists or re-validates every model on each
  event any more.
- **Per ServedModel** (create, update of spec, resume; and a status timer):
  its admission (``admission.py``, over the index, so quotas and names are
  judged as the pool loop judges them), its own child (the dedicated
  Deployment; replicas belong to the autoscaler) and its status.
- **The pool loop** (one asyncio task started at startup): every
  ``pool_sync_interval_s`` it converges each WorkerPool from the indexes
  (``converge.py``). A kopf timer on WorkerPools would do the same, but kopf
  puts a finalizer on objects with timers, and a WorkerPool garbage-collected
  with an uninstalled operator would then never go.

Handlers are registered on a registry built with the operator's settings, so
nothing is read from the environment here.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping

import httpx
import kopf

from modelplane_common import labels
from modelplane_common.spec import ModelSpec, Placement
from modelplane_operator import admission, conditions, converge, index, kinds, kube, status, validation, workers, workloads
from modelplane_operator.config import OperatorConfig, PoolMode
from modelplane_operator.metrics import OperatorMetrics

FINALIZER = "modelplane.io/unload-copies"
RESOURCE = kinds.SERVED_MODELS  # kept for callers that name the ServedModel resource this way


def _write_status(body: kopf.Body, patch: kopf.Patch, new: dict[str, Any]) -> None:
    """Patch only the status fields that differ, so an unchanged object is never rewritten."""
    current = body.get("status") or {}
    for key, value in new.items():
        if current.get(key) != value:
            patch.status[key] = value


def _conditions_after(body: kopf.Body, patch: kopf.Patch) -> list[dict[str, Any]]:
    """Conditions as this handler has left them so far (patch wins over body)."""
    pending = patch.get("status", {}).get("conditions")
    return list(pending if pending is not None else (body.get("status") or {}).get("conditions") or [])


def _set_condition(body: kopf.Body, patch: kopf.Patch, kind: str, ok: bool, reason: str, message: str) -> bool:
    """Set one condition; True when its status or reason changed (worth an event)."""
    before = conditions.find(_conditions_after(body, patch), kind)
    updated = conditions.upsert(_conditions_after(body, patch), kind, ok, reason, message,
                                body["metadata"].get("generation"))
    _write_status(body, patch, {"conditions": updated})
    text = "True" if ok else "False"
    return before is None or before.get("status") != text or before.get("reason") != reason


class NotOurs(Exception):
    """A Deployment by the dedicated group's name exists and this ServedModel does not own it."""


def _not_ours(kube_api: kube.Kube, spec: ModelSpec, body: kopf.Body) -> str | None:
    """Why a dedicated model cannot have its group: a Deployment of that name that someone else owns."""
    if spec.placement is not Placement.DEDICATED:
        return None
    namespace, name = body["metadata"]["namespace"], workloads.dedicated_name(spec.id)
    found = kube_api.deployment_owners(namespace, name)
    if found is None or workloads.is_ours(found, body["metadata"]["uid"]):
        return None
    return (f"metadata.name: Deployment {name} exists and is not owned by this ServedModel; modelplane leaves it "
            "alone: rename the model or remove that Deployment")


def _ensure_dedicated(kube_api: kube.Kube, spec: ModelSpec, body: kopf.Body, config: OperatorConfig,
                      converger: converge.Converger) -> None:
    """The model's own child: its dedicated Deployment (or none), but only one this ServedModel
    owns: a Deployment of that name made by someone else is never overwritten, scaled or deleted.
    The pool loop sets its replicas (replicas.min..max on demand) as the autoscaler's field manager;
    this manifest leaves them out, except on creation, when the group starts at replicas.min."""
    namespace, name = body["metadata"]["namespace"], workloads.dedicated_name(spec.id)
    found = kube_api.deployment_owners(namespace, name)
    if found is not None and not workloads.is_ours(found, body["metadata"]["uid"]):
        if spec.placement is not Placement.DEDICATED:
            return  # someone else's Deployment: nothing of ours to remove
        raise NotOurs(_not_ours(kube_api, spec, body))
    if spec.placement is not Placement.DEDICATED:
        if found is not None and kube_api.delete_deployment(namespace, name):
            kopf.event(body, type="Normal", reason="DedicatedRemoved", message=f"deleted Deployment {name}: placement is now {spec.placement.value}")
        return
    with converger.lock:  # the pool loop's replicas writes take turns with this handover
        existing = kube_api.deployment(namespace, name)
        if existing is None:
            kube_api.apply_deployment(workloads.build_dedicated_deployment(spec, dict(body), config, spec.replicas.min))
            # Hand the replicas over: the autoscaler's manager takes them, this one lets go of them.
            kube_api.scale_deployment(namespace, name, spec.replicas.min)
            kube_api.apply_deployment(workloads.build_dedicated_deployment(spec, dict(body), config))
            kube_api.apply_disruption_budget(workloads.build_disruption_budget(name, namespace, spec.id, dict(body)))
            kopf.event(body, type="Normal", reason="DedicatedCreated", message=f"created Deployment {name} with {spec.replicas.min} pod(s) pinning {spec.id}")
            return
        replicas = min(max(existing.replicas, spec.replicas.min), spec.replicas.max)
        kube_api.scale_deployment(namespace, name, replicas)
        before = kube_api.deployment_version(namespace, name)
        after = kube_api.apply_deployment(workloads.build_dedicated_deployment(spec, dict(body), config))
        kube_api.apply_disruption_budget(workloads.build_disruption_budget(name, namespace, spec.id, dict(body)))
    if before != after:
        kopf.event(body, type="Normal", reason="DedicatedUpdated", message=f"updated Deployment {name} ({replicas} pod(s))")


def _set_rollout_fit(body: kopf.Body, patch: kopf.Patch, spec: ModelSpec, config: OperatorConfig) -> None:
    """RolloutFits, for a model with a canary: whether both versions fit one pod's budget."""
    if (fit := validation.rollout_fit(spec, config)) is None:
        return
    if _set_condition(body, patch, conditions.ROLLOUT_FITS, *fit) and not fit[0]:
        kopf.warn(body, reason=fit[1], message=fit[2])


def _report_namespaces(entry_namespace: str, spec: ModelSpec, config: OperatorConfig) -> list[str]:
    """Where a model's copies live: its pool's namespace (shared) or its own (dedicated)."""
    if spec.placement is Placement.DEDICATED:
        return [entry_namespace]
    return sorted({config.pool_namespace(entry_namespace)})


def _refresh_status(kube_api: kube.Kube, spec: ModelSpec, body: kopf.Body, patch: kopf.Patch,
                    config: OperatorConfig, cache: workers.ReportCache) -> None:
    """Copies, readyReplicas and Ready from the worker pods' own reports."""
    pods: list[kube.WorkerPod] = []
    reports = {}
    for namespace in _report_namespaces(body["metadata"]["namespace"], spec, config):
        found = kube_api.worker_pods(namespace, labels.WORKER_SELECTOR)
        pods += found
        reports.update(cache.get(namespace, lambda found=found: workers.fetch_reports(found, config.worker_port, config.worker_token)))
    copies = status.copies_of(spec.id, reports)
    problems = [f"pod {p.name}: {p.problem}" for p in pods if p.pool == labels.dedicated_pool(spec.id) and p.problem]
    ready, reason, message = status.readiness(spec, copies, problems)
    ready_count = sum(1 for c in copies if c["state"] == "READY")
    _write_status(body, patch, {"copies": copies, "readyReplicas": ready_count})
    if _set_condition(body, patch, conditions.READY, ready, reason, message) and reason in ("LoadFailed", "PodsFailing"):
        kopf.warn(body, reason=reason, message=message)


def _decision(body: kopf.Body, served_models: kopf.Index, model_quotas: kopf.Index,
              config: OperatorConfig) -> admission.Decision:
    """This model's admission, judged with every other model the index holds."""
    entries = index.entries(served_models)
    decided = admission.decide(entries, index.quotas(model_quotas), config)
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    found = decided.decisions.get(key)
    if found is not None:
        return found
    entry = index.model_entry(body, config)  # not indexed yet, or being deleted: judge it alone
    return admission.decide([entry], index.quotas(model_quotas), config).decisions.get(
        key, admission.Decision(False, admission.INVALID_SPEC, "the spec does not parse"))


def _set_accepted(body: kopf.Body, patch: kopf.Patch, decision: admission.Decision) -> None:
    changed = _set_condition(body, patch, conditions.ACCEPTED, decision.accepted, decision.reason, decision.message)
    if not changed:
        return
    if decision.accepted:
        kopf.event(body, type="Normal", reason="Accepted", message=decision.message)
    else:
        kopf.warn(body, reason=decision.reason, message=decision.message)


def build_registry(config: OperatorConfig, metrics: OperatorMetrics | None = None) -> kopf.OperatorRegistry:
    """All handlers, bound to `config`; main() and the tests run kopf with this registry."""
    registry = kopf.OperatorRegistry()
    metrics = metrics or OperatorMetrics()
    pools: dict[tuple[str, str], dict[str, Any]] = {}  # WorkerPool bodies the loop converges
    quota_bodies: dict[tuple[str, str], dict[str, Any]] = {}
    state: dict[str, Any] = {}  # the converger and the loop task, made at startup

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry has none of kopf's default login handlers: in-cluster, else $KUBECONFIG.
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.index(**kinds.SERVED_MODELS, id="served_models", registry=registry)
    def served_models(body: kopf.Body, **_: Any) -> dict[str, index.ModelEntry]:
        return {body["metadata"]["namespace"]: index.model_entry(body, config)}

    @kopf.index(**kinds.MODEL_QUOTAS, id="model_quotas", registry=registry)
    def model_quotas(body: kopf.Body, **_: Any) -> dict[str, index.Quota]:
        return {body["metadata"]["namespace"]: index.quota_entry(body)}

    @kopf.on.event(**kinds.WORKER_POOLS, registry=registry)
    def track_pool(event: Mapping[str, Any], body: kopf.Body, **_: Any) -> None:
        # Runs only once every index is filled (kopf holds handlers until then): the loop then
        # never converges a pool from a half-read index.
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if event.get("type") == "DELETED":
            pools.pop(key, None)
        else:
            pools[key] = dict(body)

    @kopf.on.event(**kinds.MODEL_QUOTAS, registry=registry)
    def track_quota(event: Mapping[str, Any], body: kopf.Body, **_: Any) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if event.get("type") == "DELETED":
            quota_bodies.pop(key, None)
        else:
            quota_bodies[key] = dict(body)

    async def pool_loop(converger: converge.Converger, served: kopf.Index, quotas: kopf.Index,
                        logger: logging.Logger) -> None:
        """Converge every pool from the indexes, forever; a failed pass is retried at the next tick."""
        while True:
            # Read the indexes here, on kopf's event loop, which is the only writer of them.
            entries, limits = index.entries(served), index.quotas(quotas)
            try:
                await asyncio.to_thread(converger.run_pass, list(pools.values()), entries, limits,
                                        list(quota_bodies.values()), logger)
            except Exception:  # the loop must outlive one bad pass (an API error, a pod gone mid-call)
                logger.exception("pool convergence pass failed; retrying in %.0fs", config.pool_sync_interval_s)
            await asyncio.sleep(config.pool_sync_interval_s)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger,
                        served_models: kopf.Index, model_quotas: kopf.Index, **_: Any) -> None:
        # Progress and diff-base live in annotations: the CRD's status schema is strict.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="modelplane.io")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="modelplane.io", key="last-handled-configuration")
        settings.persistence.finalizer = FINALIZER
        settings.posting.level = logging.WARNING  # our own events, not kopf's chatter
        # Serve the namespaces named at start and the CRDs present then: no cluster-wide list/watch
        # of namespaces and CRDs.
        settings.scanning.disabled = True
        settings.watching.server_timeout = 60
        memo.kube = kube.Kube(kube.connect())
        converger = converge.Converger(memo.kube, config, metrics)
        if config.owner_deployment:
            converger.owners[:] = [await asyncio.to_thread(memo.kube.owner_reference, config.namespace,
                                                           config.owner_deployment)]
        memo.converger = converger
        if config.pool_mode is PoolMode.SHARED:
            await asyncio.to_thread(converger.ensure_pool, config.namespace, [])
        state["loop"] = asyncio.ensure_future(pool_loop(converger, served_models, model_quotas,
                                                        logging.getLogger("modelplane_operator.pools")))

    @kopf.on.cleanup(registry=registry)
    async def stop_loop(**_: Any) -> None:
        task = state.pop("loop", None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @kopf.on.resume(**kinds.SERVED_MODELS, registry=registry)
    @kopf.on.create(**kinds.SERVED_MODELS, registry=registry)
    @kopf.on.update(**kinds.SERVED_MODELS, field="spec", registry=registry)
    def reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, served_models: kopf.Index,
                  model_quotas: kopf.Index, **_: Any) -> None:
        decision = _decision(body, served_models, model_quotas, config)
        generation = body["metadata"].get("generation")
        entries = index.entries(served_models)
        _set_accepted(body, patch, decision)
        if not decision.accepted:
            _set_condition(body, patch, conditions.READY, False, "NotAccepted", "the spec was not accepted; see Accepted")
            _write_status(body, patch, {"observedGeneration": generation})
            return
        spec = index.model_entry(body, config).spec
        assert spec is not None  # accepted
        converger: converge.Converger = memo.converger
        namespace = body["metadata"]["namespace"]
        converger.ensure_pool(config.pool_namespace(namespace), entries)
        _publish_now(converger, namespace, spec, served_models, model_quotas)
        try:
            _ensure_dedicated(memo.kube, spec, body, config, converger)
        except NotOurs as exc:
            _set_accepted(body, patch, admission.Decision(False, admission.INVALID_SPEC, str(exc)))
            _set_condition(body, patch, conditions.READY, False, "NotAccepted", "the spec was not accepted; see Accepted")
            _write_status(body, patch, {"observedGeneration": generation})
            return
        _set_rollout_fit(body, patch, spec, config)
        _refresh_status(memo.kube, spec, body, patch, config, converger.reports)
        _write_status(body, patch, {"observedGeneration": generation})

    def _publish_now(converger: converge.Converger, namespace: str, spec: ModelSpec,
                     served: kopf.Index, quotas: kopf.Index) -> None:
        """The model store a changed model appears in, at once rather than at the loop's next pass
        (a new dedicated pod mounts its key from it)."""
        entries = index.entries(served)
        accepted = admission.decide(entries, index.quotas(quotas), config).accepted(entries)
        with converger.lock:
            converger.publish_stores(sorted({namespace, config.pool_namespace(namespace)}), accepted,
                                     converger.managed_pools(list(pools.values())))

    @kopf.timer(**kinds.SERVED_MODELS, interval=config.status_interval_s, initial_delay=config.status_interval_s,
                registry=registry)
    def refresh(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, served_models: kopf.Index,
                model_quotas: kopf.Index, **_: Any) -> None:
        # Admission again: a changed quota, or an earlier model's deletion, can change the verdict.
        decision = _decision(body, served_models, model_quotas, config)
        spec = index.model_entry(body, config).spec
        if decision.accepted and spec is not None and (foreign := _not_ours(memo.kube, spec, body)) is not None:
            decision = admission.Decision(False, admission.INVALID_SPEC, foreign)
        _set_accepted(body, patch, decision)
        if decision.accepted and spec is not None:
            _set_rollout_fit(body, patch, spec, config)
            _refresh_status(memo.kube, spec, body, patch, config, memo.converger.reports)
        else:
            _set_condition(body, patch, conditions.READY, False, "NotAccepted", "the spec was not accepted; see Accepted")

    @kopf.on.delete(**kinds.SERVED_MODELS, retries=6, backoff=5, registry=registry)
    def unload_copies(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        spec = index.model_entry(body, config).spec
        if spec is not None:
            _unload_everywhere(memo.kube, spec, body, config, logger)

    return registry


def _unload_everywhere(kube_api: kube.Kube, spec: ModelSpec, body: kopf.Body, config: OperatorConfig,
                       logger: logging.Logger) -> None:
    """Unload the model from every shared pod that holds it; dedicated pods go with their Deployment."""
    own_group = labels.dedicated_pool(spec.id)
    namespace = config.pool_namespace(body["metadata"]["namespace"])
    pods = [p for p in kube_api.worker_pods(namespace, labels.WORKER_SELECTOR) if p.pool != own_group]
    reports = workers.fetch_reports(pods, config.worker_port, config.worker_token)
    holders = [p for p in pods if p.name in reports and any(c.id == spec.id for c in reports[p.name].models)]
    for pod in holders:
        try:
            workers.unload(pod, config.worker_port, spec.id, config.worker_token)
        except httpx.HTTPError as exc:
            raise kopf.TemporaryError(f"could not reach pod {pod.name} to unload {spec.id}: {exc}", delay=5)
        except workers.UnloadRefused as exc:
            kopf.warn(body, reason="UnloadRefused", message=str(exc))
            continue
        logger.info("unloaded %s from pod %s", spec.id, pod.name)
    if holders:
        kopf.event(body, type="Normal", reason="Unloaded", message=f"unloaded {spec.id} from {len(holders)} pod(s)")
