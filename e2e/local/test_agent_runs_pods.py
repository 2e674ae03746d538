"""The node agent behaves like a kubelet where the e2e suite relies on it.

Pods here run plain Python (http.server), so these checks take seconds and
prove the agent before the platform's pods depend on it.
"""
from __future__ import annotations

import os
import signal

import httpx
import pytest

from agent_process import AgentProcess, process_alive, wait_for
from kube import Kube, condition, condition_entry, pod_ready

NS = "agent-test"
GATE = "modelplane.io/test-gate"


def server_pod(name: str, node: str | None = None, gate: bool = False) -> dict:
    """Two containers sharing an emptyDir: a writer puts a file there, a server serves it."""
    writer = ("import pathlib, time; pathlib.Path('/data/hello.txt').write_text('hello from ' + "
              "__import__('os').environ['POD_NAME']); time.sleep(3600)")
    spec = {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 2,
        "containers": [
            {"name": "server", "image": "python:3.11", "command": ["python", "-m", "http.server", "8080"],
             "args": ["--bind", "0.0.0.0", "--directory", "/data"],
             "ports": [{"name": "http", "containerPort": 8080}],
             "volumeMounts": [{"name": "data", "mountPath": "/data"}],
             "readinessProbe": {"httpGet": {"path": "/hello.txt", "port": "http"}, "periodSeconds": 1,
                                "failureThreshold": 1},
             "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2, "failureThreshold": 3}},
            {"name": "writer", "image": "python:3.11", "command": ["python", "-c", writer],
             "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
             "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        ],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if gate:
        spec["readinessGates"] = [{"conditionType": GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
            "spec": spec}


@pytest.fixture(scope="module")
def namespace(kube: Kube, agent: AgentProcess):
    kube.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}])
    wait_for("the default ServiceAccount in the test namespace",
             lambda: kube.cluster.kubectl("get", "sa", "default", "-n", NS, check=False).returncode == 0, 60)
    yield NS
    kube.delete("namespace", NS)


def read_pod(kube: Kube, name: str) -> dict:
    return kube.get("pod", name, "-n", NS)


def test_nodes_advertise_gpus(kube: Kube, agent: AgentProcess) -> None:
    nodes = {n["metadata"]["name"]: n for n in kube.items("nodes")}
    assert sorted(nodes) == sorted(agent.nodes)
    for node in nodes.values():
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
        assert condition(node, "Ready") == "True"
        assert not node["spec"].get("taints"), node["spec"].get("taints")


def test_pod_gets_its_own_ip_shared_volume_and_becomes_ready(kube: Kube, agent: AgentProcess, namespace: str) -> None:
    kube.apply([server_pod("web-a", node="gpu-node-1"), server_pod("web-b", node="gpu-node-2")])
    pods = kube.wait_pods_ready(NS, "app in (web-a,web-b)", 2, timeout=60)
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    assert ips["web-a"] != ips["web-b"] and all(ip.startswith("127.") for ip in ips.values())
    # Both serve on port 8080, each on its own address, each its own file from its writer container.
    for name, ip in ips.items():
        assert httpx.get(f"http://{ip}:8080/hello.txt", timeout=5).text == f"hello from {name}"
    statuses = {c["name"]: c for c in read_pod(kube, "web-a")["status"]["containerStatuses"]}
    assert statuses["server"]["ready"] and statuses["writer"]["ready"]
    assert condition(read_pod(kube, "web-a"), "ContainersReady") == "True"


def test_killed_container_makes_pod_unready_then_restarts(kube: Kube, agent: AgentProcess, namespace: str) -> None:
    kube.apply([server_pod("web-c", node="gpu-node-3")])
    kube.wait_pods_ready(NS, "app=web-c", 1, timeout=60)
    pid = agent.container_pid(NS, "web-c", "server")
    os.kill(pid, signal.SIGKILL)
    wait_for("web-c to go unready", lambda: not pod_ready(read_pod(kube, "web-c")), timeout=20, interval=0.1)
    kube.wait_pods_ready(NS, "app=web-c", 1, timeout=60)
    server = next(c for c in read_pod(kube, "web-c")["status"]["containerStatuses"] if c["name"] == "server")
    assert server["restartCount"] == 1
    assert server["lastState"]["terminated"]["exitCode"] != 0
    assert agent.container_pid(NS, "web-c", "server") != pid


def test_readiness_gate_holds_ready_until_its_condition_is_true(kube: Kube, agent: AgentProcess, namespace: str) -> None:
    kube.apply([server_pod("web-gated", node="gpu-node-4", gate=True)])
    wait_for("web-gated containers ready", lambda: condition(read_pod(kube, "web-gated"), "ContainersReady") == "True", 60)
    pod = read_pod(kube, "web-gated")
    assert condition(pod, "Ready") == "False"
    assert condition_entry(pod, "Ready")["reason"] == "ReadinessGatesNotReady"
    kube.cluster.kubectl("patch", "pod", "web-gated", "-n", NS, "--subresource=status", "--type=strategic", "-p",
                         '{"status":{"conditions":[{"type":"%s","status":"True"}]}}' % GATE)
    wait_for("web-gated Ready once its gate is True", lambda: pod_ready(read_pod(kube, "web-gated")), 20)


def test_deleted_pod_stops_its_processes(kube: Kube, agent: AgentProcess, namespace: str) -> None:
    kube.apply([server_pod("web-d", node="gpu-node-1")])
    kube.wait_pods_ready(NS, "app=web-d", 1, timeout=60)
    pids = [agent.container_pid(NS, "web-d", c) for c in ("server", "writer")]
    kube.delete("pod", "web-d", "-n", NS)
    wait_for("web-d to disappear", lambda: not kube.items("pods", "-n", NS, "--field-selector=metadata.name=web-d"), 30)
    assert not any(process_alive(pid) for pid in pids)


def test_scheduler_places_gpu_pods_by_gpu_capacity(kube: Kube, agent: AgentProcess, namespace: str) -> None:
    """One GPU per node: N+1 one-GPU replicas give one pod per node and one Pending."""
    for name in ("web-a", "web-b", "web-c", "web-gated"):
        kube.delete("pod", name, "-n", NS)
    wait_for("earlier pods gone", lambda: not kube.pods(NS), 60)
    template = server_pod("gpu")
    template["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gpu", "namespace": NS},
                  "spec": {"replicas": len(agent.nodes) + 1, "selector": {"matchLabels": {"app": "gpu"}},
                           "template": {"metadata": {"labels": {"app": "gpu"}}, "spec": template["spec"]}}}
    kube.apply([deployment])
    ready = kube.wait_pods_ready(NS, "app=gpu", len(agent.nodes), timeout=90)
    assert sorted(p["spec"]["nodeName"] for p in ready) == sorted(agent.nodes)

    def one_pending_for_gpus() -> bool:
        pending = [p for p in kube.pods(NS, "app=gpu") if not p["spec"].get("nodeName")]
        return len(pending) == 1 and "nvidia.com/gpu" in condition_entry(pending[0], "PodScheduled").get("message", "")

    wait_for("the extra replica Pending for lack of GPUs", one_pending_for_gpus, 30)
    kube.delete("deployment", "gpu", "-n", NS)
    wait_for("gpu pods gone", lambda: not kube.pods(NS, "app=gpu"), 60)


def test_configmap_volume_waits_for_and_follows_its_configmap(kube: Kube, agent: AgentProcess, namespace: str) -> None:
    """The pod starts once its ConfigMap exists, and sees later edits (the operator's model catalog relies on it)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-cm", "namespace": NS, "labels": {"app": "web-cm"}},
           "spec": {"terminationGracePeriodSeconds": 1, "nodeSelector": {"kubernetes.io/hostname": "gpu-node-2"},
                    "containers": [{"name": "server", "image": "python:3.11",
                                    "command": ["python", "-m", "http.server", "8080", "--bind", "0.0.0.0",
                                                "--directory", "/etc/catalog"],
                                    "volumeMounts": [{"name": "catalog", "mountPath": "/etc/catalog"}],
                                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}],
                    "volumes": [{"name": "catalog", "configMap": {"name": "catalog"}}]}}
    kube.apply([pod])
    wait_for("web-cm waiting for its ConfigMap",
             lambda: "catalog" in (read_pod(kube, "web-cm")["status"].get("message") or ""), 30)

    def catalog(text: str) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "catalog", "namespace": NS},
                "data": {"models.json": text}}

    kube.apply([catalog('{"models": []}')])
    ip = kube.wait_pods_ready(NS, "app=web-cm", 1, timeout=60)[0]["status"]["podIP"]
    assert httpx.get(f"http://{ip}:8080/models.json", timeout=5).text == '{"models": []}'
    kube.apply([catalog('{"models": ["sentiment"]}')])
    wait_for("the edited ConfigMap in the pod's volume",
             lambda: httpx.get(f"http://{ip}:8080/models.json", timeout=5).text == '{"models": ["sentiment"]}', 20)
    kube.delete("pod", "web-cm", "-n", NS)
