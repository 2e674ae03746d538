"""The few Kubernetes API calls the operator makes, with the verbs its RBAC grants.

Children are written with server-side apply: re-applying an unchanged object
is a no-op on the server, so reconciling twice (or after a restart) changes
nothing and creates no duplicates.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from kubernetes import client, config as kube_config
from kubernetes.client.exceptions import ApiException

from modelplane_common import labels, spec as spec_module

FIELD_MANAGER = "modelplane-operator"


FIELD_MANAGER_AUTOSCALER = "modelplane-autoscaler"  # owns the replicas of the pools and dedicated groups


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


@dataclass(frozen=True)
class DeploymentState:
    replicas: int  # spec: asked for
    pods: int  # status.replicas: pods it has
    ready: int


def _draining_since(annotations: dict[str, str]) -> float | None:
    value = annotations.get(labels.DRAINING)
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return 0.0  # set by hand: treated as draining since long ago


def _problem(pod: Any) -> str:
    """The first container that is waiting or restarting, with the kubelet's reason."""
    for status in (pod.status.container_statuses if pod.status else None) or []:
        waiting = status.state.waiting if status.state else None
        last = status.last_state.terminated if status.last_state else None
        if waiting and waiting.reason not in (None, "ContainerCreating", "PodInitializing"):
            detail = f": {last.reason} (exit {last.exit_code})" if last else ""
            return f"container {status.name} {waiting.reason}{detail}, {status.restart_count} restart(s)"
        if not status.ready and status.restart_count and last:
            return f"container {status.name} restarted {status.restart_count} time(s), last: {last.reason} (exit {last.exit_code})"
    return ""


def _to_worker_pod(pod: Any) -> WorkerPod:
    status = pod.status
    conditions = (status.conditions if status else None) or []
    return WorkerPod(
        name=pod.metadata.name, ip=(status.pod_ip or "") if status else "", phase=(status.phase or "") if status else "",
        ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
        pool=labels.pool_of(pod.metadata.labels or {}), problem=_problem(pod), namespace=pod.metadata.namespace or "",
        draining_since=_draining_since(pod.metadata.annotations or {}))


def connect() -> client.ApiClient:
    """In-cluster credentials when running as a pod, else $KUBECONFIG (read now, not at import)."""
    configuration = client.Configuration()
    try:
        kube_config.load_incluster_config(client_configuration=configuration)
    except kube_config.ConfigException:
        return kube_config.new_client_from_config(config_file=os.environ.get("KUBECONFIG") or None)
    return client.ApiClient(configuration)


def _server_side_apply(patch: Callable[..., Any], manifest: dict[str, Any]) -> str:
    """Server-side apply `manifest` through a patch_namespaced_* call, as this operator's field manager."""
    meta = manifest["metadata"]
    result = patch(meta["name"], meta["namespace"], manifest, field_manager=FIELD_MANAGER, force=True,
                   _content_type="application/apply-patch+yaml")
    return result.metadata.resource_version


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self._apps = client.AppsV1Api(api)
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._policy = client.PolicyV1Api(api)

    def apply_deployment(self, deployment: dict[str, Any]) -> str:
        """Create or converge a Deployment; returns its resourceVersion after the call.

        A selector cannot change in place (the API server refuses: it is immutable), so a
        Deployment made with another selector (by an older operator, which keyed dedicated
        groups differently) is deleted and made again: its pods roll once."""
        try:
            return _server_side_apply(self._apps.patch_namespaced_deployment, deployment)
        except ApiException as exc:
            if exc.status != 422 or "selector" not in (exc.body or "") or "immutable" not in (exc.body or ""):
                raise
        meta = deployment["metadata"]
        self._apps.delete_namespaced_deployment(meta["name"], meta["namespace"], propagation_policy="Background")
        return _server_side_apply(self._apps.patch_namespaced_deployment, deployment)

    def apply_configmap(self, configmap: dict[str, Any]) -> str:
        """Create or converge a ConfigMap; returns its resourceVersion after the call."""
        return _server_side_apply(self._core.patch_namespaced_config_map, configmap)

    def deployment_owners(self, namespace: str, name: str) -> tuple[list[str], str] | None:
        """The uids owning a Deployment (its ownerReferences) and its managed-by label; None when
        there is no such Deployment."""
        try:
            deployment = self._apps.read_namespaced_deployment(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        owners = [ref.uid for ref in deployment.metadata.owner_references or []]
        return owners, (deployment.metadata.labels or {}).get(labels.MANAGED_BY, "")

    def apply_disruption_budget(self, budget: dict[str, Any]) -> str:
        return _server_side_apply(self._policy.patch_namespaced_pod_disruption_budget, budget)

    def deployment_version(self, namespace: str, name: str) -> str | None:
        try:
            return self._apps.read_namespaced_deployment(name, namespace).metadata.resource_version
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def owner_reference(self, namespace: str, deployment: str) -> dict[str, Any]:
        """An ownerReference to a Deployment: what it owns is garbage-collected when it goes."""
        found = self._apps.read_namespaced_deployment(deployment, namespace)
        return {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment, "uid": found.metadata.uid}

    def delete_deployment(self, namespace: str, name: str) -> bool:
        """Delete if present; False when there was nothing to delete."""
        try:
            self._apps.delete_namespaced_deployment(name, namespace, propagation_policy="Background")
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def served_models(self, namespace: str) -> list[dict[str, Any]]:
        listing = self._custom.list_namespaced_custom_object(
            spec_module.GROUP, spec_module.VERSION, namespace, spec_module.PLURAL)
        return list(listing.get("items", []))

    def annotate_pods(self, namespace: str, selector: str, annotations: dict[str, str]) -> int:
        """Set these annotations on every pod of the selector that lacks them; returns how many changed."""
        changed = 0
        for pod in self._core.list_namespaced_pod(namespace, label_selector=selector).items:
            current = pod.metadata.annotations or {}
            if pod.metadata.deletion_timestamp is None and any(current.get(k) != v for k, v in annotations.items()):
                try:
                    self._core.patch_namespaced_pod(pod.metadata.name, namespace,
                                                    {"metadata": {"annotations": annotations}})
                    changed += 1
                except ApiException as exc:
                    if exc.status != 404:  # a pod gone meanwhile needs nothing
                        raise
        return changed

    def deployment(self, namespace: str, name: str) -> DeploymentState | None:
        try:
            found = self._apps.read_namespaced_deployment(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        status = found.status
        return DeploymentState(found.spec.replicas if found.spec.replicas is not None else 1,
                               (status.replicas or 0) if status else 0, (status.ready_replicas or 0) if status else 0)

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """Set an existing Deployment's replicas as the autoscaler's field manager (server-side apply of
        that one field, so the manager that applies the rest of the Deployment leaves it alone)."""
        manifest = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
                    "spec": {"replicas": replicas}}
        self._apps.patch_namespaced_deployment(name, namespace, manifest, field_manager=FIELD_MANAGER_AUTOSCALER,
                                               force=True, _content_type="application/apply-patch+yaml")

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        """Set (or, for None, remove) annotations on one pod; a pod gone meanwhile needs nothing."""
        try:
            self._core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def create_if_absent(self, manifest: dict[str, Any], resource: dict[str, str]) -> bool:
        """Create a custom object unless one of that name exists; True when it was created."""
        meta = manifest["metadata"]
        try:
            self._custom.create_namespaced_custom_object(resource["group"], resource["version"], meta["namespace"],
                                                         resource["plural"], manifest)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def apply_custom(self, manifest: dict[str, Any], resource: dict[str, str]) -> None:
        """Server-side apply the fields of a custom object this operator owns."""
        meta = manifest["metadata"]
        self._custom.patch_namespaced_custom_object(
            resource["group"], resource["version"], meta["namespace"], resource["plural"], meta["name"], manifest,
            field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml")

    def scale_custom(self, namespace: str, name: str, resource: dict[str, str], replicas: int) -> None:
        """Set a custom object's replicas through its scale subresource, as the HPA does."""
        self._custom.patch_namespaced_custom_object_scale(
            resource["group"], resource["version"], namespace, resource["plural"], name, {"spec": {"replicas": replicas}},
            field_manager=FIELD_MANAGER_AUTOSCALER, _content_type="application/merge-patch+json")

    def patch_custom_status(self, namespace: str, name: str, resource: dict[str, str], status: dict[str, Any]) -> None:
        """Merge `status` into a custom object's status subresource."""
        self._custom.patch_namespaced_custom_object_status(
            resource["group"], resource["version"], namespace, resource["plural"], name, {"status": status},
            _content_type="application/merge-patch+json")

    def worker_pods(self, namespace: str, selector: str) -> list[WorkerPod]:
        pods = self._core.list_namespaced_pod(namespace, label_selector=selector).items
        return [_to_worker_pod(p) for p in pods if p.metadata.deletion_timestamp is None]
