"""Thin helpers over the kubernetes client, so the agent works on plain dicts.

The generated client (v37) returns pydantic models with snake_case attributes;
the agent reads pod specs as Kubernetes writes them (camelCase), so every
object is turned back into its JSON shape once, here.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from kubernetes import client

STRATEGIC_MERGE = "application/strategic-merge-patch+json"


def to_dict(api: client.ApiClient, obj: Any) -> dict[str, Any]:
    """A client model as the JSON object the API server sent."""
    return api.sanitize_for_serialization(obj)


def now() -> str:
    """RFC 3339 time as Kubernetes writes it (seconds precision)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> dt.datetime:
    """MicroTime for Lease renewals."""
    return dt.datetime.now(dt.timezone.utc)


def patch_pod_status(core: client.CoreV1Api, namespace: str, name: str, status: dict[str, Any]) -> None:
    """Strategic merge keeps conditions others own (readiness gates, PodScheduled)."""
    core.patch_namespaced_pod_status(name, namespace, {"status": status}, _content_type=STRATEGIC_MERGE)


def request_token(core: client.CoreV1Api, namespace: str, service_account: str, pod: dict[str, Any]) -> str:
    """A bound service-account token for the pod, as a kubelet would project it."""
    meta = pod["metadata"]
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[],
            expiration_seconds=24 * 3600,
            bound_object_ref=client.V1BoundObjectReference(
                kind="Pod", api_version="v1", name=meta["name"], uid=meta["uid"]
            ),
        )
    )
    answer = core.create_namespaced_service_account_token(service_account, namespace, request)
    return answer.status.token
