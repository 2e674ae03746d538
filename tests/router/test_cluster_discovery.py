"""Cluster mode discovery against a real kube-apiserver: worker pods and ServedModels via watches.

There is no kubelet, so the test plays it: it writes each pod's status (pod
IP, Ready condition) through the status subresource, as a kubelet would.
"""
from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from hotset_common.worker_ownership import WorkerTrust

from gateway_helpers import BALLAST_LAUNCHER, copies, local_stack, wait_for, write_ballast_store

pytestmark = [pytest.mark.kube, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SELECTOR = "app.kubernetes.io/component=worker"
# make_pod's pods are hand-made stand-ins with no owner: these tests trust every labelled pod.
# Ownership (only pods of the operator's Deployments) is tested in test_owned_worker_pods.py.
STAND_INS = WorkerTrust.LABELLED
STAND_IN_ARGS = ("--worker-trust", STAND_INS.value)


@pytest.fixture(scope="module")
def cluster(kube_cluster):
    """The session's real control plane (tests/conftest.py)."""
    return kube_cluster


@pytest.fixture(scope="module")
def served_model_crd(cluster):
    cluster.kubectl("apply", "-f", str(ROOT / "crds/servedmodel.yaml"))
    wait_for(lambda: cluster.kubectl("get", "servedmodels", check=False).returncode == 0, "the CRD", 30)


@pytest.fixture
def kube(cluster):
    from kubernetes import client, config

    api_client = config.new_client_from_config(str(cluster.kubeconfig))
    yield api_client
    api_client.close()


def make_pod(core, name: str, node: str | None, component: str = "worker", dedicated_to: str | None = None) -> None:
    """A worker-shaped pod no kubelet runs. Bound to `node` (a name only: no Node object, so the
    controller manager's pod GC deletes it once orphaned 40 s, enough for a short test), or, with
    `node` None, never scheduled (a scheduler name nobody serves), which nothing deletes: for the
    tests that take longer on a slow machine."""
    pool = {"hotset.io/pool": "dedicated", "hotset.io/servedmodel": dedicated_to} if dedicated_to else \
        {"hotset.io/pool": "shared"}
    core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": component, **pool}},
        "spec": {**({"nodeName": node} if node else {"schedulerName": "hotset-test-unscheduled"}),
                 "containers": [{"name": "worker", "image": "hotset-worker:test"}]},
    })


def set_ready(core, name: str, ip: str, ready: bool) -> None:
    status = "True" if ready else "False"
    core.patch_namespaced_pod_status(name, "default", {"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": status}, {"type": "ContainersReady", "status": status}],
    }})


def test_ready_worker_pods_come_and_go_with_their_ip_and_node(kube):
    from kubernetes import client
    from hotset_router.discovery import KubeDiscovery

    core = client.CoreV1Api(kube)
    make_pod(core, "worker-a", "node-1")
    make_pod(core, "worker-b", "node-2", dedicated_to="big-model")
    make_pod(core, "not-a-worker", "node-1", component="router")
    discovery = KubeDiscovery("default", SELECTOR, 8080, api_client=kube, trust=STAND_INS)
    discovery.start()
    try:
        set_ready(core, "worker-a", "127.0.0.11", True)
        set_ready(core, "not-a-worker", "127.0.0.13", True)
        wait_for(lambda: discovery.urls() == ["http://127.0.0.11:8080"], "worker-a in discovery")
        assert discovery.node_of("http://127.0.0.11:8080") == "node-1"
        set_ready(core, "worker-b", "127.0.0.12", True)
        wait_for(lambda: discovery.urls() == ["http://127.0.0.11:8080", "http://127.0.0.12:8080"], "worker-b in discovery")
        assert discovery.pool_of("http://127.0.0.11:8080") == "shared"
        assert discovery.pool_of("http://127.0.0.12:8080") == "dedicated/big-model"
        set_ready(core, "worker-a", "127.0.0.11", False)
        wait_for(lambda: discovery.urls() == ["http://127.0.0.12:8080"], "unready worker-a out of discovery")
        core.delete_namespaced_pod("worker-b", "default", grace_period_seconds=0)
        wait_for(lambda: discovery.urls() == [], "deleted worker-b out of discovery")
    finally:
        discovery.stop()
        for name in ("worker-a", "worker-b", "not-a-worker"):
            try:
                core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            except client.ApiException:
                pass


def test_served_models_give_their_copy_limits(kube, served_model_crd):
    from kubernetes import client
    from hotset_router.discovery import KubeDiscovery

    custom = client.CustomObjectsApi(kube)
    body = {
        "apiVersion": "hotset.io/v1alpha1", "kind": "ServedModel", "metadata": {"name": "sentiment"},
        "spec": {"framework": "transformers", "task": "text-classification", "source": {"uri": "pvc://models/sentiment"},
                 "memory": "600Mi", "replicas": {"min": 1, "max": 3}},
    }
    discovery = KubeDiscovery("default", SELECTOR, 8080, api_client=kube, trust=STAND_INS)
    discovery.start()
    try:
        custom.create_namespaced_custom_object("hotset.io", "v1alpha1", "default", "servedmodels", body)
        wait_for(lambda: discovery.spec_of("sentiment") is not None, "the ServedModel in discovery")
        spec = discovery.spec_of("sentiment")
        assert (spec.replicas.min, spec.replicas.max, spec.memory_bytes) == (1, 3, 600 * 2**20)
        custom.patch_namespaced_custom_object("hotset.io", "v1alpha1", "default", "servedmodels", "sentiment",
                                              {"spec": {"replicas": {"min": 2, "max": 4}}})
        wait_for(lambda: discovery.spec_of("sentiment").replicas.min == 2, "the changed replicas")
        custom.delete_namespaced_custom_object("hotset.io", "v1alpha1", "default", "servedmodels", "sentiment")
        wait_for(lambda: discovery.spec_of("sentiment") is None, "the deleted ServedModel out of discovery")
    finally:
        discovery.stop()


def free_port_on(*hosts: str) -> int:
    """A port free on every one of `hosts` (loopback addresses standing in for pod IPs)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no common free port on {hosts}")


@pytest.fixture
def pod_workers(kube, procs, tmp_path):
    """Two real worker processes on loopback 'pod IPs' (same port), with Pod objects a 'kubelet' marked Ready."""
    from kubernetes import client

    core = client.CoreV1Api(kube)
    store = write_ballast_store(tmp_path, {"m": {"mib": 4, "max": 2}, "pre": {"mib": 4}})
    ips = ["127.0.0.21", "127.0.0.22"]
    port = free_port_on(*ips)
    workers = []
    for i, ip in enumerate(ips):
        worker = local_stack.start_worker(f"worker-{i + 1}", store, procs.log_dir, "100Mi", port=port, host=ip,
                                          extra_args=["--min-residency-s", "0"], launcher=BALLAST_LAUNCHER)
        procs.started.append(worker)
        workers.append(worker)
    for worker in workers:
        local_stack.wait_http(worker, "/v2/health/ready", 90)
    names = ["pod-worker-1", "pod-worker-2"]
    try:
        for name, ip, node in zip(names, ips, ("node-1", "node-2")):
            make_pod(core, name, node)
            set_ready(core, name, ip, True)
        yield core, port, names
    finally:
        for name in names:
            try:
                core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            except client.ApiException:
                pass


def cluster_router(procs, cluster, port: int):
    return procs.router([], args=["--cluster", "--kubeconfig", str(cluster.kubeconfig), "--namespace", "default",
                                  "--worker-selector", SELECTOR, "--worker-port", str(port),
                                  *STAND_IN_ARGS], urls=["unused"])


def router_pods(router_url: str) -> dict[str, dict]:
    return {p["pod"]: p for p in httpx.get(f"{router_url}/router/pods", timeout=10).json()}


def test_router_in_cluster_mode_serves_through_discovered_pods(cluster, pod_workers, procs):
    """Real apiserver + real worker processes + `hotset-router --cluster`."""
    core, port, names = pod_workers
    router = cluster_router(procs, cluster, port)
    response = httpx.post(f"{router.url}/predict", json={"model_id": "m", "input_data": [3]}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["predictions"]["scaled"] == [6.0]
    (holder,) = copies(router.url, "m")
    pods = router_pods(router.url)
    assert set(pods) == {"worker-1", "worker-2"}
    assert {p["node"] for p in pods.values()} == {"node-1", "node-2"}
    # the holder's pod object goes away: the router stops using it and places the model on the other pod
    core.delete_namespaced_pod(names[int(holder[-1]) - 1], "default", grace_period_seconds=0)
    wait_for(lambda: holder not in router_pods(router.url), "the deleted pod to leave the map")
    assert httpx.post(f"{router.url}/predict", json={"model_id": "m", "input_data": [1]}, timeout=60).status_code == 200
    assert copies(router.url, "m") == [next(n for n in ("worker-1", "worker-2") if n != holder)]


def test_served_model_min_replicas_are_loaded_before_any_request(cluster, kube, served_model_crd, pod_workers, procs):
    from kubernetes import client

    _, port, _ = pod_workers
    custom = client.CustomObjectsApi(kube)
    body = {
        "apiVersion": "hotset.io/v1alpha1", "kind": "ServedModel", "metadata": {"name": "pre"},
        "spec": {"framework": "torchvision", "task": "tensor", "source": {"uri": "pvc://models/pre"},
                 "memory": "4Mi", "replicas": {"min": 2, "max": 2}},
    }
    custom.create_namespaced_custom_object("hotset.io", "v1alpha1", "default", "servedmodels", body)
    try:
        router = cluster_router(procs, cluster, port)
        wait_for(lambda: copies(router.url, "pre") == ["worker-1", "worker-2"], "two pre-loaded copies of 'pre'", 30)
        assert copies(router.url, "m") == []  # min 0: loaded on demand only
    finally:
        custom.delete_namespaced_custom_object("hotset.io", "v1alpha1", "default", "servedmodels", "pre")


def test_discovery_across_namespaces_reads_drains_and_keeps_the_accepted_name(kube, served_model_crd):
    """Watched namespaces (or all); the operator's drain mark; a name two namespaces declare goes to the
    ServedModel the operator accepted; the router's one write, the wanted-at annotation, lands on it."""
    from kubernetes import client
    from hotset_router.discovery import KubeDiscovery

    core, custom = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    namespaces = ["disc-a", "disc-b"]
    for name in namespaces:
        core.create_namespace({"metadata": {"name": name}})
    discovery = KubeDiscovery("default", SELECTOR, 8080, api_client=kube, namespaces=["*"], trust=STAND_INS)
    try:
        for namespace, ip in zip(namespaces, ("127.0.0.31", "127.0.0.32")):
            core.create_namespaced_pod(namespace, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "w", "labels": {"app.kubernetes.io/component": "worker", "hotset.io/pool": "shared"},
                             "annotations": {"hotset.io/draining": "1.0"} if namespace == "disc-b" else {}},
                "spec": {"schedulerName": "hotset-test-unscheduled", "containers": [{"name": "worker", "image": "hotset-worker:test"}]}})
            core.patch_namespaced_pod_status("w", namespace, {"status": {
                "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "conditions": [{"type": "Ready", "status": "True"}]}})
            body = {"apiVersion": "hotset.io/v1alpha1", "kind": "ServedModel", "metadata": {"name": "twin"},
                    "spec": {"framework": "torchvision", "source": {"uri": f"pvc://models/{namespace}"}, "memory": "1Mi"}}
            custom.create_namespaced_custom_object("hotset.io", "v1alpha1", namespace, "servedmodels", body)
        # the operator accepted disc-b's (made first elsewhere, say) and refused disc-a's
        for namespace, status in (("disc-a", "False"), ("disc-b", "True")):
            custom.patch_namespaced_custom_object_status("hotset.io", "v1alpha1", namespace, "servedmodels", "twin", {
                "status": {"conditions": [{"type": "Accepted", "status": status, "reason": "r", "message": "m",
                                           "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
        discovery.start()
        wait_for(lambda: discovery.urls() == ["http://127.0.0.31:8080", "http://127.0.0.32:8080"], "pods of both namespaces")
        assert (discovery.draining("http://127.0.0.31:8080"), discovery.draining("http://127.0.0.32:8080")) == (False, True)
        wait_for(lambda: discovery.namespace_of("twin") == "disc-b", "the accepted twin")
        assert discovery.spec_of("twin").source == "pvc://models/disc-b"
        discovery.mark_wanted("twin", "1234.5")
        annotations = custom.get_namespaced_custom_object("hotset.io", "v1alpha1", "disc-b", "servedmodels",
                                                          "twin")["metadata"]["annotations"]
        assert annotations["hotset.io/wanted-at"] == "1234.5"
    finally:
        discovery.stop()
        for name in namespaces:
            try:
                core.delete_namespaced_pod("w", name, grace_period_seconds=0)  # no kubelet would confirm it
            except client.ApiException:
                pass
            core.delete_namespace(name)
