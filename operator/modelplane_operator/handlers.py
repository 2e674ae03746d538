"""kopf handlers: thin glue from ServedModel events to the pure builders.

Level-based: every create, update and resume runs the same reconcile, which
computes the desired children from the spec alone and server-side-applies
them; a restart therefore changes nothing that is already right. Handlers are
registered on a registry built with the operator's settings, so nothing is
read from the environment here.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

import httpx
import kopf

from modelplane_common import labels
from modelplane_common.spec import GROUP, PLURAL, VERSION, ModelSpec, Placement
from modelplane_operator import conditions, kube, pool, status, validation, workers, workloads
from modelplane_operator.config import OperatorConfig

FINALIZER = "modelplane.io/unload-copies"
RESOURCE = {"group": GROUP, "version": VERSION, "plural": PLURAL}


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


def _live(kube_api: kube.Kube, config: OperatorConfig) -> list[dict[str, Any]]:
    return [item for item in kube_api.served_models(config.namespace) if not item["metadata"].get("deletionTimestamp")]


def _accepted_specs(items: list[dict[str, Any]], config: OperatorConfig,
                    over_caps: dict[str, validation.Problem]) -> list[ModelSpec]:
    specs = []
    for item in items:
        verdict = validation.validate(item, config)
        if verdict.spec is not None and verdict.accepted and verdict.spec.id not in over_caps:
            specs.append(verdict.spec)
    return specs


def ensure_pool(kube_api: kube.Kube, config: OperatorConfig, logger: logging.Logger | logging.LoggerAdapter,
                owners: list[dict[str, Any]] | None = None) -> dict[str, validation.Problem]:
    """Publish the model store every worker reads, then size the shared pool and its disruption
    budget; returns the models refused for the operator's caps (validation.over_the_caps).

    The store comes first so a new dedicated pod finds its pinned model in it. Both are
    owned by `owners` (the operator's Deployment, where the chart names it).
    """
    owners = owners or []
    items = _live(kube_api, config)
    over_caps = validation.over_the_caps(items, config)
    specs = _accepted_specs(items, config, over_caps)
    version = kube_api.apply_configmap(workloads.build_model_store_configmap(specs, config, owners))
    # The kubelet refreshes a ConfigMap volume on its periodic pod sync (up to a minute and
    # more); a changed pod makes it sync that pod now, so a new ServedModel reaches the pods'
    # mounted model store in seconds.
    kube_api.annotate_pods(config.namespace, labels.WORKER_SELECTOR, {workloads.STORE_VERSION: version})
    replicas = pool.desired_pool_size(specs, config)
    before = kube_api.deployment_version(config.namespace, config.pool_name)
    after = kube_api.apply_deployment(workloads.build_pool_deployment(config, replicas, owners))
    budget = workloads.build_disruption_budget(config.pool_name, config.namespace, None)
    if owners:
        budget["metadata"]["ownerReferences"] = list(owners)  # goes with the chart, like the pool
    kube_api.apply_disruption_budget(budget)
    if before != after:
        logger.info("shared pool %s: %d pod(s)", config.pool_name, replicas)
    return over_caps


def _ours(found: tuple[list[str], str], uid: str) -> bool:
    """Owned by this ServedModel, or left without owner by this operator (its label says so)."""
    owners, managed_by = found
    return uid in owners or (not owners and managed_by == workloads.MANAGER)


class NotOurs(Exception):
    """A Deployment by the dedicated group's name exists and this ServedModel does not own it."""


def _ensure_dedicated(kube_api: kube.Kube, spec: ModelSpec, body: kopf.Body, config: OperatorConfig) -> None:
    """Apply (dedicated) or delete (shared) the group's Deployment, but only one this ServedModel
    owns: a Deployment of that name made by someone else is never overwritten or deleted."""
    namespace, name = body["metadata"]["namespace"], workloads.dedicated_name(spec.id)
    found = kube_api.deployment_owners(namespace, name)
    if found is not None and not _ours(found, body["metadata"]["uid"]):
        if spec.placement is not Placement.DEDICATED:
            return  # someone else's Deployment: nothing of ours to remove
        raise NotOurs(f"Deployment {name} exists and is not owned by this ServedModel; modelplane leaves it "
                      "alone: rename the model or remove that Deployment")
    if spec.placement is not Placement.DEDICATED:
        if found is not None and kube_api.delete_deployment(namespace, name):
            kopf.event(body, type="Normal", reason="DedicatedRemoved", message=f"deleted Deployment {name}: placement is now {spec.placement.value}")
        return
    before = kube_api.deployment_version(namespace, name)
    after = kube_api.apply_deployment(workloads.build_dedicated_deployment(spec, dict(body), config))
    kube_api.apply_disruption_budget(workloads.build_disruption_budget(name, namespace, spec.id, dict(body)))
    if before is None:
        kopf.event(body, type="Normal", reason="DedicatedCreated", message=f"created Deployment {name} with {spec.replicas.min} pod(s) pinning {spec.id}")
    elif before != after:
        kopf.event(body, type="Normal", reason="DedicatedUpdated", message=f"updated Deployment {name} ({spec.replicas.min} pod(s))")


def _refresh_status(kube_api: kube.Kube, spec: ModelSpec, body: kopf.Body, patch: kopf.Patch,
                    config: OperatorConfig, cache: workers.ReportCache) -> None:
    """Copies, readyReplicas and Ready from the worker pods' own reports."""
    namespace = body["metadata"]["namespace"]
    pods = kube_api.worker_pods(namespace, labels.WORKER_SELECTOR)
    reports = cache.get(namespace, lambda: workers.fetch_reports(pods, config.worker_port, config.worker_token))
    copies = status.copies_of(spec.id, reports)
    problems = [f"pod {p.name}: {p.problem}" for p in pods if p.pool == labels.dedicated_pool(spec.id) and p.problem]
    ready, reason, message = status.readiness(spec, copies, problems)
    ready_count = sum(1 for c in copies if c["state"] == "READY")
    _write_status(body, patch, {"copies": copies, "readyReplicas": ready_count})
    if _set_condition(body, patch, conditions.READY, ready, reason, message) and reason in ("LoadFailed", "PodsFailing"):
        kopf.warn(body, reason=reason, message=message)


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """All handlers, bound to `config`; main() and the tests run kopf with this registry."""
    registry = kopf.OperatorRegistry()
    # Handlers for different objects run in parallel threads; each reads every
    # ServedModel and then writes the pool, so one at a time, or a stale reader
    # could write last.
    pool_lock = threading.Lock()
    reports = workers.ReportCache(ttl_s=config.status_interval_s / 2)
    owners: list[dict[str, Any]] = []  # the operator's Deployment, read once at start

    def sync_pool(kube_api: kube.Kube, logger: Any) -> dict[str, validation.Problem]:
        with pool_lock:
            return ensure_pool(kube_api, config, logger, owners)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry has none of kopf's default login handlers: in-cluster, else $KUBECONFIG.
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        # Progress and diff-base live in annotations: the CRD's status schema is strict.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="modelplane.io")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="modelplane.io", key="last-handled-configuration")
        settings.persistence.finalizer = FINALIZER
        settings.posting.level = logging.WARNING  # our own events, not kopf's chatter
        # Serve the one namespace and the CRD present at start: no cluster-wide list/watch of
        # namespaces and CRDs, so the operator's RBAC stays a namespaced Role.
        settings.scanning.disabled = True
        settings.watching.server_timeout = 60
        memo.kube = kube.Kube(kube.connect())
        if config.owner_deployment:
            owners[:] = [memo.kube.owner_reference(config.namespace, config.owner_deployment)]
        sync_pool(memo.kube, logger)

    @kopf.on.resume(**RESOURCE, registry=registry)
    @kopf.on.create(**RESOURCE, registry=registry)
    @kopf.on.update(**RESOURCE, field="spec", registry=registry)
    def reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        verdict = validation.validate(body, config)
        generation = body["metadata"].get("generation")
        if verdict.spec is None or not verdict.accepted:
            if _set_condition(body, patch, conditions.ACCEPTED, False, "InvalidSpec", verdict.message()):
                kopf.warn(body, reason="InvalidSpec", message=verdict.message())
            _set_condition(body, patch, conditions.READY, False, "NotAccepted", "the spec was not accepted; see Accepted")
            _write_status(body, patch, {"observedGeneration": generation})
            return
        spec = verdict.spec
        capped = sync_pool(memo.kube, logger).get(spec.id)
        problem = str(capped) if capped is not None else ""
        if not problem:
            try:
                _ensure_dedicated(memo.kube, spec, body, config)
            except NotOurs as exc:
                problem = f"metadata.name: {exc}"
        if problem:
            if _set_condition(body, patch, conditions.ACCEPTED, False, "InvalidSpec", problem):
                kopf.warn(body, reason="InvalidSpec", message=problem)
            _set_condition(body, patch, conditions.READY, False, "NotAccepted", "the spec was not accepted; see Accepted")
            _write_status(body, patch, {"observedGeneration": generation})
            return
        placement = f"{spec.placement.value} placement, min {spec.replicas.min} / max {spec.replicas.max} copies"
        if _set_condition(body, patch, conditions.ACCEPTED, True, "Valid", placement):
            kopf.event(body, type="Normal", reason="Accepted", message=placement)
        if (fit := validation.rollout_fit(spec, config)) is not None:
            if _set_condition(body, patch, conditions.ROLLOUT_FITS, *fit) and not fit[0]:
                kopf.warn(body, reason=fit[1], message=fit[2])
        _refresh_status(memo.kube, spec, body, patch, config, reports)
        _write_status(body, patch, {"observedGeneration": generation})

    @kopf.timer(**RESOURCE, interval=config.status_interval_s, initial_delay=config.status_interval_s,
                registry=registry)
    def refresh(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
        verdict = validation.validate(body, config)
        if verdict.spec is not None and verdict.accepted:
            _refresh_status(memo.kube, verdict.spec, body, patch, config, reports)

    @kopf.on.delete(**RESOURCE, retries=6, backoff=5, registry=registry)
    def unload_copies(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        verdict = validation.validate(body, config)
        if verdict.spec is not None:
            _unload_everywhere(memo.kube, verdict.spec, body, config, logger)
        sync_pool(memo.kube, logger)

    return registry


def _unload_everywhere(kube_api: kube.Kube, spec: ModelSpec, body: kopf.Body, config: OperatorConfig,
                       logger: logging.Logger) -> None:
    """Unload the model from every shared pod that holds it; dedicated pods go with their Deployment."""
    own_group = labels.dedicated_pool(spec.id)
    pods = [p for p in kube_api.worker_pods(body["metadata"]["namespace"], labels.WORKER_SELECTOR) if p.pool != own_group]
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
