"""Helpers for operator tests: kubectl in a test namespace, polling with a deadline,
ServedModel manifests, and the real operator run through kopf.testing.KopfRunner."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import httpx
from kopf.testing import KopfRunner

from hotset_common import labels
from hotset_common.model_store import CatalogUpdate
from hotset_common.worker_ownership import WorkerTrust
from hotset_operator import workloads
from hotset_operator.config import OperatorConfig
from hotset_operator.handlers import build_registry
from hotset_operator.metrics import OperatorMetrics
from hotset_testing import polling
from hotset_testing.kube_cluster import KubeCluster
from hotset_testing.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "servedmodel.yaml"
T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.2) -> T:
    """polling.wait_for, polling less often: most predicates here run kubectl."""
    return polling.wait_for(predicate, what, timeout, interval)


class Cluster:
    """kubectl helpers bound to one test namespace."""

    def __init__(self, kube: KubeCluster, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace

    def kubectl(self, *args: str, input: str | None = None, check: bool = True):
        return self.kube.kubectl("-n", self.namespace, *args, input=input, check=check)

    def apply(self, manifest: dict[str, Any], check: bool = True):
        return self.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=check)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        result = self.kubectl("get", kind, name, "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def items(self, kind: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", kind, "-o", "json"] + (["-l", selector] if selector else [])
        return json.loads(self.kubectl(*args).stdout)["items"]

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        body = self.get("servedmodel", name) or {}
        return next((c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == kind), None)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.items("events") if e["involvedObject"].get("name") == name]


def served_model(name: str, **spec: Any) -> dict[str, Any]:
    body = {"framework": "transformers", "task": "text-classification",
            "source": {"uri": f"pvc://models/{name}"}, "memory": "600Mi",
            "replicas": {"min": 0, "max": 2}, "placement": "shared", "owner": "team-a", "oncall": "team-a-oncall"}
    body.update(spec)
    return {"apiVersion": "hotset.io/v1alpha1", "kind": "ServedModel", "metadata": {"name": name}, "spec": body}


def operator_config(namespace: str, **overrides: Any) -> OperatorConfig:
    # The device plugin's nvidia.com/gpu: pods that need no ResourceClaimTemplate in the test namespace.
    # The catalog feed on a free loopback port, which worker processes of the test follow.
    port = free_port()
    values: dict[str, Any] = dict(namespace=namespace, pod_memory_budget="4Gi", gpu_mode="devicePlugin", gpus_per_pod=1,
                                  pool_min_pods=1, pool_max_pods=4, pool_sync_interval_s=0.5, scale_down_delay_s=1.0,
                                  worker_image="registry.example/hotset/worker:test",
                                  triton_image="nvcr.io/nvidia/tritonserver:24.10-py3",
                                  catalog_host="127.0.0.1", catalog_port=port, catalog_url=f"http://127.0.0.1:{port}")
    values.update(overrides)
    return OperatorConfig(**values)


@contextlib.contextmanager
def running_operator(config: OperatorConfig, metrics: OperatorMetrics | None = None) -> Iterator[KopfRunner]:
    """The real operator (its real handlers) in a thread, watching the namespaces `config` serves."""
    namespaces = config.served_namespaces()
    scope = [arg for ns in namespaces for arg in ("--namespace", ns)] if namespaces else ["--all-namespaces"]
    args = ["run", "--standalone", *scope]
    with KopfRunner(args, registry=build_registry(config, metrics), timeout=60) as runner:
        yield runner
    assert runner.exception is None, runner.output[-4000:]


def catalog(config: OperatorConfig, namespace: str, dedicated_to: str | None = None,
            token: str = "") -> CatalogUpdate | None:
    """The catalog a pool's pods follow, complete, from the running operator's feed (None: not served
    yet). `token`: a pool pod's catalog token, where the operator checks worker identity."""
    try:
        answer = httpx.get(workloads.catalog_url(config, namespace, dedicated_to), timeout=10,
                           headers={"Authorization": f"Bearer {token}"} if token else {})
    except httpx.HTTPError:
        return None
    return CatalogUpdate.model_validate_json(answer.content) if answer.status_code == 200 else None


def catalog_models(config: OperatorConfig, namespace: str, dedicated_to: str | None = None,
                   token: str = "") -> list[str]:
    """The ids in a pool's catalog ([] when the feed does not answer yet)."""
    found = catalog(config, namespace, dedicated_to, token)
    return sorted(m["id"] for m in found.models) if found is not None else []


def service_account_kubeconfig(kube: KubeCluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as a ServiceAccount (a real bound token), for RBAC tests."""
    token = kube.kubectl("-n", namespace, "create", "token", account, "--duration=1h").stdout.strip()
    ca = kube.workdir / "pki" / "ca.crt"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": kube.server, "certificate-authority": str(ca)}}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": account, "namespace": namespace}}],
    }))
    return path


# stand_in_pod's pods have no owner: tests using them trust every labelled pod (the default trusts only
# pods of the operator's Deployments: tests/operator/test_owned_worker_pods.py).
STAND_IN_TRUST = WorkerTrust.LABELLED


def stand_in_pod(cluster: Cluster, name: str) -> None:
    """A Pod object for a worker process the test runs: no kubelet here, so the test writes its
    status (Running, Ready, podIP 127.0.0.1) the way a kubelet would."""
    pod_labels = {labels.PART_OF: labels.PROJECT, labels.COMPONENT: labels.WORKER, labels.POOL: labels.SHARED_POOL}
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": pod_labels},
                   "spec": {"containers": [{"name": "hotset-worker", "image": "worker:test"}]}})
    status = {"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                         "conditions": [{"type": "Ready", "status": "True"}]}}
    cluster.kubectl("patch", "pod", name, "--subresource=status", "--type=merge", "-p", json.dumps(status))
