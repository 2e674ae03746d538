"""Node objects for the fake GPU nodes: registration, heartbeat, pod addresses.

Node ``i`` (1-based) lives on the loopback block 127.(10+i).0.0/16: its host IP
is 127.(10+i).0.1 and its pods get 127.(10+i).y.z from an increasing counter,
so no two pods on this machine ever share an address (ports never collide).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodeagent import kubeapi

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40


@dataclass
class NodeConfig:
    name: str
    index: int
    gpus: int = 1
    cpu: str = "16"
    memory: str = "64Gi"
    pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def host_ip(self) -> str:
        return f"127.{10 + self.index}.0.1"


class PodAddresses:
    """Hands out a fresh loopback address per pod on one node."""

    def __init__(self, node: NodeConfig) -> None:
        self._node = node
        self._next = 0
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            k = self._next
            self._next += 1
        return f"127.{10 + self._node.index}.{1 + k // 250}.{2 + k % 250}"


def node_body(node: NodeConfig) -> dict[str, Any]:
    """The Node as a kubelet would register it, GPUs included."""
    capacity = {
        "cpu": node.cpu,
        "memory": node.memory,
        "pods": str(node.pods),
        "nvidia.com/gpu": str(node.gpus),
        "ephemeral-storage": "100Gi",
    }
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true",
        "modelplane.io/e2e-node": "true",
        **node.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": {"podCIDR": f"127.{10 + node.index}.0.0/16"},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [
                {"type": "InternalIP", "address": node.host_ip},
                {"type": "Hostname", "address": node.name},
            ],
            "conditions": node_conditions(),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": node.name,
                "systemUUID": node.name,
                "bootID": node.name,
                "kernelVersion": "local",
                "osImage": "modelplane e2e node agent",
                "containerRuntimeVersion": "local-process://1",
                "kubeletVersion": "v1.36.3",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def node_conditions() -> list[dict[str, Any]]:
    stamp = kubeapi.now()
    healthy = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ]
    return [
        {"type": t, "status": s, "reason": r, "message": "modelplane e2e node agent",
         "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
        for t, s, r in healthy
    ]


class NodeKeeper:
    """Registers one node and keeps it Ready (status heartbeat + node Lease)."""

    def __init__(self, api: client.ApiClient, node: NodeConfig) -> None:
        self.node = node
        self._core = client.CoreV1Api(api)
        self._leases = client.CoordinationV1Api(api)
        self._uid = ""

    def register(self) -> None:
        try:
            created = self._core.create_node(node_body(self.node))
            self._uid = created.metadata.uid
        except ApiException as err:
            if err.status != 409:
                raise
            self._uid = self._core.read_node(self.node.name).metadata.uid
            self.heartbeat()

    def heartbeat(self) -> None:
        body = node_body(self.node)
        self._core.patch_node_status(self.node.name, {"status": body["status"]}, _content_type=kubeapi.STRATEGIC_MERGE)
        self._renew_lease()

    def _renew_lease(self) -> None:
        spec = client.V1LeaseSpec(
            holder_identity=self.node.name,
            lease_duration_seconds=LEASE_SECONDS,
            renew_time=kubeapi.now_micro(),
        )
        try:
            self._leases.patch_namespaced_lease(
                self.node.name, LEASE_NAMESPACE,
                {"spec": {"holderIdentity": self.node.name, "leaseDurationSeconds": LEASE_SECONDS,
                          "renewTime": kubeapi.now_micro().strftime("%Y-%m-%dT%H:%M:%S.%fZ")}},
                _content_type="application/merge-patch+json",
            )
        except ApiException as err:
            if err.status != 404:
                raise
            owner = client.V1OwnerReference(api_version="v1", kind="Node", name=self.node.name, uid=self._uid)
            lease = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.node.name, namespace=LEASE_NAMESPACE, owner_references=[owner]),
                spec=spec,
            )
            self._leases.create_namespaced_lease(LEASE_NAMESPACE, lease)
