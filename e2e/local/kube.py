"""kubectl-shaped helpers for the e2e tests: JSON reads, applies, waits.

Tests talk to the cluster the way a user does (kubectl), so what they prove is
what a user would see.
"""
from __future__ import annotations

import json
from typing import Any

import yaml

from agent_process import wait_for
from modelplane_testing.kube_cluster import KubeCluster


class Kube:
    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.cluster.kubectl("get", *args, "-o", "json").stdout)

    def items(self, *args: str) -> list[dict[str, Any]]:
        return self.get(*args).get("items", [])

    def apply(self, documents: list[dict[str, Any]] | str, namespace: str | None = None) -> str:
        text = documents if isinstance(documents, str) else yaml.safe_dump_all(documents)
        extra = ["-n", namespace] if namespace else []
        return self.cluster.kubectl("apply", "--server-side", "--force-conflicts", *extra, "-f", "-", input=text,
                                    timeout=120).stdout

    def delete(self, *args: str, wait: bool = False) -> None:
        self.cluster.kubectl("delete", *args, "--ignore-not-found", f"--wait={'true' if wait else 'false'}", timeout=120)

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["pods", "-n", namespace] + (["-l", selector] if selector else [])
        return self.items(*args)

    def wait_pods_ready(self, namespace: str, selector: str, count: int, timeout: float) -> list[dict[str, Any]]:
        def ready() -> list[dict[str, Any]] | None:
            pods = [p for p in self.pods(namespace, selector) if not p["metadata"].get("deletionTimestamp")]
            good = [p for p in pods if pod_ready(p)]
            return good if len(good) >= count else None

        return wait_for(f"{count} ready pod(s) {selector!r} in {namespace}", ready, timeout)  # type: ignore[return-value]


def pod_ready(pod: dict[str, Any]) -> bool:
    return condition(pod, "Ready") == "True"


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return entry.get("status")
    return None


def condition_entry(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return entry
    return {}
