"""The few Kubernetes API calls the operator makes, with the verbs its RBAC grants.

Children are written with server-side apply: re-applying an unchanged object
is a no-op on the server, so reconciling twice (or after a restart) changes
nothing and creates no duplicates.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable, Iterable

from kubernetes import client, config as kube_config
from kubernetes.client.exceptions import ApiException

from hotset_common import labels, spec as spec_module

FIELD_MANAGER = "hotset-operator"
FIELD_MANAGER_AUTOSCALER = "hotset-autoscaler"  # owns the replicas of the pools and dedicated groups


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


_ABSENT = object()


def _unless_absent(call: Callable[[], Any]) -> Any:
    """`call()`'s result, or _ABSENT when the API server answers 404 (no such object, or no such
    kind); any other error is raised."""
    try:
        return call()
    except ApiException as exc:
        if exc.status == 404:
            return _ABSENT
        raise


METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


class Kube:
    """The API groups are made on first use, on whichever thread calls first: importing the
    kubernetes client's CoreV1Api and AppsV1Api takes seconds, which kopf's startup then does not
    wait for."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._groups: dict[str, Any] = {}

    @property
    def api_client(self) -> client.ApiClient:
        """The client every call goes through (its credentials: in-cluster, or $KUBECONFIG)."""
        return self._api

    def _group(self, name: str) -> Any:
        with self._lock:
            if name not in self._groups:
                self._groups[name] = getattr(client, name)(self._api)
            return self._groups[name]

    @property
    def _apps(self) -> client.AppsV1Api:
        return self._group("AppsV1Api")

    @property
    def _core(self) -> client.CoreV1Api:
        return self._group("CoreV1Api")

    @property
    def _custom(self) -> client.CustomObjectsApi:
        return self._group("CustomObjectsApi")

    @property
    def _policy(self) -> client.PolicyV1Api:
        return self._group("PolicyV1Api")

    @property
    def _networking(self) -> client.NetworkingV1Api:
        return self._group("NetworkingV1Api")

    @property
    def _authorization(self) -> client.AuthorizationV1Api:
        return self._group("AuthorizationV1Api")

    def warm(self) -> None:
        """Make every API group now (on a thread, while kopf lists what it watches)."""
        for name in ("CustomObjectsApi", "AppsV1Api", "PolicyV1Api", "CoreV1Api", "AuthorizationV1Api"):
            self._group(name)

    def served_model_keys(self, namespaces: Iterable[str] | None) -> set[tuple[str, str]]:
        """(namespace, name) of every ServedModel in `namespaces` (None: all), from metadata-only
        LISTs in pages: what exists, without transferring a single spec."""
        paths = ([f"/apis/{spec_module.GROUP}/{spec_module.VERSION}/namespaces/{ns}/{spec_module.PLURAL}"
                  for ns in namespaces] if namespaces is not None
                 else [f"/apis/{spec_module.GROUP}/{spec_module.VERSION}/{spec_module.PLURAL}"])
        found: set[tuple[str, str]] = set()
        for path in paths:
            token = ""
            while True:
                query = [("limit", 5000)] + ([("continue", token)] if token else [])
                request = self._api.param_serialize("GET", path, query_params=query,
                                                    header_params={"Accept": METADATA_LIST},
                                                    auth_settings=["BearerToken"])
                response = self._api.call_api(*request)
                response.read()
                if not 200 <= response.status <= 299:
                    raise ApiException(status=response.status, reason=response.reason)
                page = json.loads(response.data)
                found |= {(i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in page.get("items") or []}
                token = (page.get("metadata") or {}).get("continue") or ""
                if not token:
                    break
        return found

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

    def apply_secret(self, secret: dict[str, Any]) -> str:
        """Create or converge a Secret (the pool's source credentials); returns its resourceVersion."""
        return _server_side_apply(self._core.patch_namespaced_secret, secret)

    def apply_service_account(self, account: dict[str, Any]) -> str:
        """Create or converge a ServiceAccount (the workers', outside the release namespace)."""
        return _server_side_apply(self._core.patch_namespaced_service_account, account)

    def apply_config_map(self, config_map: dict[str, Any]) -> str:
        """Create or converge a ConfigMap (the cluster's ServiceAccount keys, for worker pods)."""
        return _server_side_apply(self._core.patch_namespaced_config_map, config_map)

    def issuer_keys(self) -> tuple[str, dict[str, Any]]:
        """The cluster's ServiceAccount issuer and its public keys (JWKS), from the API server's
        discovery endpoints (``/.well-known/openid-configuration``, ``/openid/v1/jwks``), which the
        chart grants the operator and Kubernetes grants every ServiceAccount by default."""
        configuration = self._get_json("/.well-known/openid-configuration")
        issuer = str(configuration.get("issuer") or "")
        keys = self._get_json("/openid/v1/jwks")
        if not issuer or not isinstance(keys.get("keys"), list):
            raise ValueError("the API server published no ServiceAccount issuer or keys")
        return issuer, keys

    def _get_json(self, path: str) -> dict[str, Any]:
        request = self._api.param_serialize("GET", path, header_params={"Accept": "application/json, application/jwk-set+json"},
                                            auth_settings=["BearerToken"])
        response = self._api.call_api(*request, _request_timeout=10)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=response.reason)
        found = json.loads(response.data)
        if not isinstance(found, dict):
            raise ValueError(f"{path} is not a JSON object")
        return found

    def secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's data (base64 values, as stored); None when it does not exist or may not be read."""
        try:
            return dict(self._core.read_namespaced_secret(name, namespace).data or {})
        except ApiException as exc:
            if exc.status in (403, 404):
                return None
            raise

    def namespace_annotations(self, namespace: str) -> dict[str, str]:
        """A Namespace's annotations; {} when it cannot be read (an install without the ClusterRole)."""
        try:
            return dict(self._core.read_namespace(namespace).metadata.annotations or {})
        except ApiException as exc:
            if exc.status in (403, 404):
                return {}
            raise

    def deployment_owners(self, namespace: str, name: str) -> tuple[list[str], str] | None:
        """The uids owning a Deployment (its ownerReferences) and its managed-by label; None when
        there is no such Deployment."""
        deployment = _unless_absent(lambda: self._apps.read_namespaced_deployment(name, namespace))
        if deployment is _ABSENT:
            return None
        owners = [ref.uid for ref in deployment.metadata.owner_references or []]
        return owners, (deployment.metadata.labels or {}).get(labels.MANAGED_BY, "")

    def apply_disruption_budget(self, budget: dict[str, Any]) -> str:
        return _server_side_apply(self._policy.patch_namespaced_pod_disruption_budget, budget)

    def apply_network_policy(self, policy: dict[str, Any]) -> str:
        return _server_side_apply(self._networking.patch_namespaced_network_policy, policy)

    def deployment_version(self, namespace: str, name: str) -> str | None:
        found = _unless_absent(lambda: self._apps.read_namespaced_deployment(name, namespace))
        return None if found is _ABSENT else found.metadata.resource_version

    def owner_reference(self, namespace: str, deployment: str) -> dict[str, Any]:
        """An ownerReference to a Deployment: what it owns is garbage-collected when it goes."""
        found = self._apps.read_namespaced_deployment(deployment, namespace)
        return {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment, "uid": found.metadata.uid}

    def delete_deployment(self, namespace: str, name: str) -> bool:
        """Delete if present; False when there was nothing to delete."""
        return _unless_absent(lambda: self._apps.delete_namespaced_deployment(
            name, namespace, propagation_policy="Background")) is not _ABSENT

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """Set an existing Deployment's replicas as the autoscaler's field manager (server-side apply of
        that one field, so the manager that applies the rest of the Deployment leaves it alone)."""
        manifest = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
                    "spec": {"replicas": replicas}}
        self._apps.patch_namespaced_deployment(name, namespace, manifest, field_manager=FIELD_MANAGER_AUTOSCALER,
                                               force=True, _content_type="application/apply-patch+yaml")

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        """Set (or, for None, remove) annotations on one pod; a pod gone meanwhile needs nothing."""
        _unless_absent(lambda: self._core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}}))

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

    def custom_owners(self, namespace: str, name: str, resource: dict[str, str]) -> list[str] | None:
        """The owner uids of a custom object; None when there is none of that name (or no such kind)."""
        found = _unless_absent(lambda: self._custom.get_namespaced_custom_object(
            resource["group"], resource["version"], namespace, resource["plural"], name))
        if found is _ABSENT:
            return None
        return [owner.get("uid", "") for owner in found.get("metadata", {}).get("ownerReferences") or []]

    def delete_custom(self, namespace: str, name: str, resource: dict[str, str]) -> bool:
        """Delete a custom object if present; False when there was nothing to delete (or no such kind)."""
        return _unless_absent(lambda: self._custom.delete_namespaced_custom_object(
            resource["group"], resource["version"], namespace, resource["plural"], name)) is not _ABSENT

    def scale_custom(self, namespace: str, name: str, resource: dict[str, str], replicas: int) -> None:
        """Set a custom object's replicas through its scale subresource, as the HPA does."""
        self._custom.patch_namespaced_custom_object_scale(
            resource["group"], resource["version"], namespace, resource["plural"], name, {"spec": {"replicas": replicas}},
            field_manager=FIELD_MANAGER_AUTOSCALER, _content_type="application/merge-patch+json")

    def patch_custom_status(self, namespace: str, name: str, resource: dict[str, str], status: dict[str, Any]) -> None:
        """Merge `status` into a custom object's status subresource (the object sent back is not
        parsed: nothing reads it, and a model with large warm-ups would cost a parse per write)."""
        _discard(self._custom.patch_namespaced_custom_object_status(
            resource["group"], resource["version"], namespace, resource["plural"], name, {"status": status},
            _content_type="application/merge-patch+json", _preload_content=False))

    def may_approve(self, namespace: str, name: str, user: str, groups: Iterable[str]) -> tuple[bool, str]:
        """Whether `user` (in `groups`) may update servedmodels/approval of this ServedModel, and the
        authorizer's reason: a SubjectAccessReview, the API server's own RBAC decision."""
        review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
            user=user, groups=list(groups) or None,
            resource_attributes=client.V1ResourceAttributes(
                group=spec_module.GROUP, resource=spec_module.PLURAL, subresource=labels.APPROVAL_SUBRESOURCE,
                verb="update", namespace=namespace, name=name)))
        found = self._authorization.create_subject_access_review(review).status
        return bool(found.allowed), str(found.reason or found.evaluation_error or "")

    def post_event(self, namespace: str, event: dict[str, Any]) -> None:
        _discard(self._core.create_namespaced_event(namespace, event, _preload_content=False))


def _discard(response: Any) -> None:
    """Read and drop an unparsed answer, so its connection goes back to the pool."""
    response.drain_conn()
    response.release_conn()
