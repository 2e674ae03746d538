"""What only real kubelets, images and Services show; runs after the shared scenarios.

The scenarios leave a two-pod shared pool serving sentiment and colors. These
tests then look at what the node agent could never show: Service endpoints
following readiness, containers as non-root on read-only root filesystems,
memory limits, NetworkPolicy, an operator killed mid-reconcile, a helm upgrade
rolling the pool under load, and apply-to-Ready on real pods.
"""
from __future__ import annotations

import concurrent.futures
import json
import subprocess
import threading
import time
from typing import Any

import httpx
import pytest
import yaml

from cluster import TAG, KindCluster, local_images
from conftest import timings
from platform_kind import KindPlatform
from scenarios.inputs import check_predictions, payload, predict
from scenarios.platform import Kube, is_true, sample, wait_for
from scenarios.served_models import (POOL_SELECTOR, REGISTRY, TRITON_CONTAINER, WORKER_CONTAINER, predict_ok,
                                     ready_copies, router_models, router_sees_ready, status_copies)

ROUTER_SELECTOR = "app.kubernetes.io/component=router"
OPERATOR_SELECTOR = "app.kubernetes.io/component=operator"


def node_exec(node: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", "exec", node, *argv], capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker exec {node} {' '.join(argv)}: {done.returncode} {done.stderr}")
    return done


def pod_exec(platform: KindPlatform, pod: str, container: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return platform.kubectl.kubectl("exec", "-n", platform.namespace, pod, "-c", container, "--", *argv, check=False,
                                    timeout=60)


def one_pod(kube: Kube, selector: str) -> str:
    pods = [p for p in kube.worker_pods(selector) if is_true(p, "Ready")]
    assert pods, f"no Ready pod for {selector}"
    return pods[0]["metadata"]["name"]


def in_cluster_get(platform: KindPlatform, url: str) -> str:
    """GET from inside the cluster (the operator's container: its Python, cluster DNS, kube-proxy)."""
    operator = one_pod(platform.kube, OPERATOR_SELECTOR)
    code = ("import sys, urllib.request\n"
            "try:\n print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\n"
            "except Exception as e:\n print(type(e).__name__, e)")
    done = pod_exec(platform, operator, "operator", "python3", "-c", code, url)
    return (done.stdout + done.stderr).strip()


def router_endpoints(platform: KindPlatform) -> list[dict[str, Any]]:
    """The router Service's endpoints, from its EndpointSlices."""
    slices = platform.kube.items("endpointslices", "-l", "kubernetes.io/service-name=hotset-router")
    return [e for s in slices for e in s.get("endpoints") or []]


def no_oom_kills(kube: Kube) -> list[str]:
    return [f"{p['metadata']['name']}/{c['name']}" for p in kube.items("pods")
            for c in p["status"].get("containerStatuses", [])
            if (c.get("lastState", {}).get("terminated") or {}).get("reason") == "OOMKilled"
            or (c.get("state", {}).get("terminated") or {}).get("reason") == "OOMKilled"]


@pytest.mark.skipif(not local_images(), reason="the node image's guards exist only on local-image hosts")
def test_nothing_a_cluster_runs_can_leave_the_machine(platform: KindPlatform, kind_cluster: KindCluster) -> None:
    """No forward in CoreDNS, unknown names refused at once, every node's egress guard in place, no image pulled."""
    corefile = yaml.safe_load(kind_cluster.kubectl("get", "configmap", "coredns", "-n", "kube-system", "-o",
                                                   "yaml").stdout)["data"]["Corefile"]
    assert "forward" not in corefile and "loop" not in corefile, corefile
    answer = in_cluster_get(platform, "http://hotset-router.hotset.svc.cluster.local/v2/health/ready")
    assert answer == "200", answer
    started = time.monotonic()
    outside = in_cluster_get(platform, "http://registry.invalid/")
    assert "URLError" in outside and time.monotonic() - started < 10, outside
    for node in kind_cluster.nodes():
        rules = node_exec(node, "iptables", "-t", "mangle", "-S").stdout
        assert "-A POSTROUTING -o eth0 -j HOTSET-EGRESS" in rules and "-A HOTSET-EGRESS -j DROP" in rules, rules
    events = json.loads(kind_cluster.kubectl("get", "events", "-A", "-o", "json").stdout)["items"]
    # The one pull allowed is from the registry the tier runs inside the cluster (models packaged as images).
    pulls = [e["message"] for e in events if e.get("reason") == "Pulling"]
    assert all(f'"{REGISTRY}/' in message for message in pulls), pulls


def test_router_service_endpoints_follow_worker_readiness(platform: KindPlatform, kind_cluster: KindCluster) -> None:
    """The router Service has ready endpoints; when no worker is ready the router is unready and leaves them."""
    kube = platform.kube
    routers = {p["status"]["podIP"] for p in kube.worker_pods(ROUTER_SELECTOR)}
    wait_for("the router's endpoints ready", lambda: router_endpoints(platform) and all(
        e["conditions"].get("ready") for e in router_endpoints(platform)), 60)
    assert {a for e in router_endpoints(platform) for a in e["addresses"]} == routers
    assert in_cluster_get(platform, "http://hotset-router.hotset.svc/v2/health/ready") == "200"
    nodes = kind_cluster.nodes()
    # Freeze every worker process: no worker pod stays ready. (Freezing Triton no longer does: a
    # pod whose Triton is down keeps serving its other models and stays ready, issue 18.)
    for node in nodes:
        node_exec(node, "pkill", "-STOP", "-f", "bin/hotset-worker", check=False)
    try:
        wait_for("every pool pod unready", lambda: not any(is_true(p, "Ready") for p in kube.worker_pods(POOL_SELECTOR)),
                 120, interval=1.0)
        wait_for("the router's endpoint not ready", lambda: router_endpoints(platform) and not any(
            e["conditions"].get("ready") for e in router_endpoints(platform)), 120, interval=1.0)
        answer = in_cluster_get(platform, "http://hotset-router.hotset.svc/v2/health/ready")
        assert answer != "200", answer
    finally:
        for node in nodes:
            node_exec(node, "pkill", "-CONT", "-f", "bin/hotset-worker", check=False)
    wait_for("the router's endpoint ready again", lambda: router_endpoints(platform) and all(
        e["conditions"].get("ready") for e in router_endpoints(platform)), 180, interval=1.0)
    wait_for("pool pods Ready again", lambda: all(is_true(p, "Ready") for p in kube.worker_pods(POOL_SELECTOR)), 120)
    predict_ok(platform, "colors")


def test_worker_containers_are_non_root_on_read_only_root(platform: KindPlatform) -> None:
    """Both containers of a worker pod run as uid 1000, cannot write their root filesystem, and still serve."""
    kube = platform.kube
    pod = one_pod(kube, POOL_SELECTOR)
    for container in (WORKER_CONTAINER, TRITON_CONTAINER):
        assert pod_exec(platform, pod, container, "id", "-u").stdout.strip() == "1000"
        denied = pod_exec(platform, pod, container, "sh", "-c", "touch /opt/probe")
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr, denied
        assert pod_exec(platform, pod, container, "sh", "-c", "touch /tmp/probe && rm /tmp/probe").returncode == 0
    for component in (ROUTER_SELECTOR, OPERATOR_SELECTOR):
        name = one_pod(kube, component)
        container = kube.get("pod", name)["spec"]["containers"][0]["name"]
        assert pod_exec(platform, name, container, "id", "-u").stdout.strip() == "1000"
    check_predictions("sentiment", predict(platform, "sentiment"))


def test_the_chart_router_serves_only_callers_the_cluster_allows(platform: KindPlatform) -> None:
    """The chart's default checks callers: no token is a 401, a ServiceAccount nobody granted the
    model-caller role a 403, the tier's caller is served, bare or by namespace."""
    body = {"model_id": "sentiment", "input_data": payload("sentiment")}
    bare = httpx.post(f"{platform.router_url}/predict", json=body, timeout=60)
    assert bare.status_code == 401 and "Authorization: Bearer" in bare.json()["detail"], bare.text
    kubectl = platform.kubectl.kubectl
    platform.router_headers  # noqa: B018 - makes the callers' namespace
    kubectl("create", "serviceaccount", "stranger", "-n", "e2e-callers", check=False)
    stranger = kubectl("create", "token", "stranger", "-n", "e2e-callers", "--audience", "hotset").stdout.strip()
    refused = httpx.post(f"{platform.router_url}/predict", json=body,
                         headers={"Authorization": f"Bearer {stranger}"}, timeout=60)
    assert refused.status_code == 403 and "servedmodels/predict" in refused.json()["detail"], refused.text
    served = httpx.post(f"{platform.router_url}/namespaces/{platform.namespace}/predict", json=body,
                        headers=platform.router_headers, timeout=60)
    check_predictions("sentiment", served)
    elsewhere = httpx.post(f"{platform.router_url}/namespaces/e2e-callers/predict", json=body,
                           headers=platform.router_headers, timeout=60)
    assert elsewhere.status_code == 404, elsewhere.text


def test_memory_budget_over_the_container_limit_is_refused(platform: KindPlatform) -> None:
    """A budget above the worker container's limit: the operator refuses to start, saying why; the old one
    comes back with the earlier values; no container was OOM-killed at any point of the run."""
    kube = platform.kube
    limit = kube.items("pods", "-l", POOL_SELECTOR)[0]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    budget = platform.overrides.get("workers.memoryBudget")
    platform.install(**{"workers.memoryBudget": "3Gi"})
    try:
        def refused() -> str | None:
            for pod in kube.items("pods", "-l", OPERATOR_SELECTOR):
                for previous in ([], ["--previous"]):
                    log = platform.kubectl.kubectl("logs", "-n", platform.namespace, pod["metadata"]["name"],
                                                   *previous, check=False).stdout
                    if "invalid settings" in log:
                        return log
            return None

        log = wait_for("the operator to refuse the budget", refused, 180, interval=2.0)
        assert f"workers.resources.worker.memory ({limit})" in log, log
    finally:
        if budget is None:
            platform.overrides.pop("workers.memoryBudget", None)
            platform.install()
        else:
            platform.install(**{"workers.memoryBudget": budget})
    platform.wait_installed()
    predict_ok(platform, "colors")
    assert not no_oom_kills(kube), no_oom_kills(kube)


def test_operator_restarted_mid_reconcile_converges(platform: KindPlatform) -> None:
    """Kill the operator right after a dedicated ServedModel is applied: the next one finishes the job."""
    kube = platform.kube
    model = "sentiment-restart"
    body = sample("sentiment")
    body["metadata"]["name"] = model
    body["spec"].update(placement="dedicated", replicas={"min": 2, "max": 2})
    old = {p["metadata"]["name"] for p in kube.items("pods", "-l", OPERATOR_SELECTOR)}
    selector = f"app.kubernetes.io/component=worker,hotset.io/servedmodel={model}"
    kube.apply([body])
    try:
        platform.kubectl.kubectl("delete", "pod", "-n", platform.namespace, "-l", OPERATOR_SELECTOR, "--wait=false",
                                 "--grace-period=0", "--force", check=False)
        wait_for("a new operator pod Ready", lambda: any(is_true(p, "Ready") and p["metadata"]["name"] not in old
                                                         for p in kube.items("pods", "-l", OPERATOR_SELECTOR)), 180)
        wait_for(f"{model} Ready with two copies", lambda: is_true(kube.served_model(model), "Ready")
                 and len(status_copies(kube, model)) == 2, 300, interval=2.0)
        deployments = [d["metadata"]["name"] for d in kube.items("deployments") if model in d["metadata"]["name"]]
        assert deployments == [f"{model}-dedicated"], deployments
        assert len(kube.worker_pods(selector)) == 2
    finally:
        kube.delete("servedmodel", model)
        wait_for("the dedicated group gone", lambda: not kube.worker_pods(selector), 120)


def test_apply_to_ready_of_a_tiny_model(platform: KindPlatform) -> None:
    """kubectl apply of a ServedModel with one pre-loaded copy until its Ready condition: measured, for docs."""
    kube = platform.kube
    samples = []
    for attempt in range(2):
        model = f"sentiment-tiny-{attempt}"  # the sample input goes by the name's prefix
        body = sample("sentiment")
        body["metadata"]["name"] = model
        body["spec"].update(replicas={"min": 1, "max": 1})
        start = time.monotonic()
        kube.apply([body])
        try:
            wait_for(f"{model} Ready", lambda: is_true(kube.served_model(model), "Ready"), 180, interval=0.2,
                     show=lambda: (kube.served_model(model).get("status"), router_models(platform)))
            samples.append(time.monotonic() - start)
            check_predictions(model, predict(platform, model))
        finally:
            kube.delete("servedmodel", model)
            wait_for(f"{model} gone", lambda: not kube.items("servedmodels", "--field-selector",
                                                             f"metadata.name={model}"), 120)
    timings["apply_to_ready_s"] = min(samples)
    timings["apply_to_ready_max_s"] = max(samples)
    assert max(samples) < 120, samples


def test_network_policy_is_enforced(platform: KindPlatform) -> None:
    """kube-router enforces NetworkPolicy: a deny-all ingress policy stops pod-to-pod traffic, removing it restores it."""
    kube = Kube(platform.cluster, "netpol-check")
    platform.kubectl.kubectl("create", "namespace", "netpol-check", check=False)
    image = f"hotset-operator:{TAG}"
    server = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "server", "labels": {"app": "server"}},
              "spec": {"containers": [{"name": "http", "image": image, "imagePullPolicy": "Never",
                                       "command": ["python3", "-m", "http.server", "8080"],
                                       "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}}
    kube.apply([server])
    wait_for("the server pod Ready", lambda: kube.items("pods", "-l", "app=server") and is_true(
        kube.items("pods", "-l", "app=server")[0], "Ready"), 120)
    ip = kube.items("pods", "-l", "app=server")[0]["status"]["podIP"]
    operator = one_pod(platform.kube, OPERATOR_SELECTOR)
    probe = ("import socket, sys\ns = socket.socket(); s.settimeout(3)\n"
             "try:\n s.connect((sys.argv[1], 8080)); print('open')\nexcept OSError as e:\n print('closed', e)")

    def reach() -> str:
        return pod_exec(platform, operator, "operator", "python3", "-c", probe, ip).stdout.strip()

    try:
        wait_for("the server reachable", lambda: reach() == "open", 60)
        deny = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny-ingress"},
                "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
        kube.apply([deny])
        wait_for("the server closed by the policy", lambda: reach().startswith("closed"), 60)
        kube.delete("networkpolicy", "deny-ingress")
        wait_for("the server reachable again", lambda: reach() == "open", 60)
    finally:
        platform.kubectl.kubectl("delete", "namespace", "netpol-check", "--wait=false", check=False)


def test_worker_pods_reach_dns_and_the_catalog_and_nothing_else_in_the_cluster(platform: KindPlatform) -> None:
    """The chart's worker egress rules hold on real pods (kube-router): from a pool pod's worker
    container, the operator's catalog answers by its Service name (cluster DNS and the catalog are
    allowed), while the API server, the router's pod and the operator's metrics port do not."""
    kube = platform.kube
    worker = one_pod(kube, POOL_SELECTOR)
    router = kube.items("pods", "-l", ROUTER_SELECTOR)[0]["status"]["podIP"]
    operator_pod = kube.items("pods", "-l", OPERATOR_SELECTOR)[0]["status"]["podIP"]
    api_server = json.loads(platform.kubectl.kubectl("get", "service", "kubernetes", "-n", "default", "-o", "json")
                            .stdout)["spec"]["clusterIP"]
    operator = f"hotset-operator.{platform.namespace}.svc"
    probe = ("import socket, sys\ns = socket.socket(); s.settimeout(3)\n"
             "try:\n s.connect((sys.argv[1], int(sys.argv[2]))); print('open')\nexcept OSError as e:\n print('closed', e)")

    def reach(host: str, port: int) -> str:
        done = pod_exec(platform, worker, WORKER_CONTAINER, "python", "-c", probe, host, str(port))
        return (done.stdout + done.stderr).strip()

    wait_for("the catalog reachable from a worker pod", lambda: reach(operator, 8090) == "open", 60)
    for what, host, port in (("the API server", api_server, 443), ("the router's pod", router, 8080),
                             ("the operator's metrics port", operator_pod, 9090)):
        wait_for(f"{what} closed to worker pods", lambda host=host, port=port: reach(host, port).startswith("closed"), 60)


def test_helm_upgrade_rolls_the_pool_without_failed_requests(platform: KindPlatform) -> None:
    """helm upgrade to a new worker image rolls every pool pod; requests to a model with two copies all succeed."""
    kube = platform.kube
    model = "colors"
    body = kube.served_model(model)
    body = {"apiVersion": body["apiVersion"], "kind": body["kind"], "metadata": {"name": model}, "spec": body["spec"]}
    body["spec"]["replicas"] = {"min": 2, "max": 2}
    kube.apply([body])
    wait_for(f"two ready copies of {model}", lambda: len(ready_copies(router_models(platform), model)) >= 2, 180)
    new_tag = f"{TAG}-rolled"  # a new tag for the same content, made in every node's containerd
    for node in platform.cluster.nodes():
        node_exec(node, "ctr", "--namespace=k8s.io", "images", "tag", "--force",
                  f"docker.io/library/hotset-worker:{TAG}", f"docker.io/library/hotset-worker:{new_tag}")
    old_pods = {p["metadata"]["name"] for p in kube.worker_pods(POOL_SELECTOR)}
    stop = threading.Event()
    codes: list[int] = []
    failures: list[str] = []

    def load() -> None:
        with httpx.Client(timeout=60, headers=platform.router_headers) as client:
            while not stop.is_set():
                answer = client.post(f"{platform.router_url}/predict", json={"model_id": model, "input_data": payload(model)})
                codes.append(answer.status_code)
                if answer.status_code != 200:
                    failures.append(f"{answer.status_code} {answer.text[:200]}")
                time.sleep(0.05)

    def rolled() -> bool:
        pods = kube.worker_pods(POOL_SELECTOR)
        return (len(pods) == 2 and not {p["metadata"]["name"] for p in pods} & old_pods
                and all(is_true(p, "Ready") for p in pods)
                and all(c["image"].endswith(new_tag) for p in pods for c in p["spec"]["containers"]
                        if c["name"] == WORKER_CONTAINER))

    with concurrent.futures.ThreadPoolExecutor(2) as threads:
        for _ in range(2):
            threads.submit(load)
        try:
            platform.install(**{"images.worker.tag": new_tag})
            wait_for("the pool rolled to the new worker image", rolled, 600, interval=2.0)
            wait_for(f"two ready copies of {model} on the new pods",
                     lambda: len(ready_copies(router_models(platform), model)) >= 2, 180)
        finally:
            stop.set()
    assert codes and not failures, f"{len(failures)} of {len(codes)} requests failed: {failures[:5]}"
    # The old pods drain (unready, still serving) before they go; the router takes the new ones in.
    wait_for("the router seeing every new pool pod ready",
             lambda: all(router_sees_ready(platform, p["metadata"]["name"]) for p in kube.worker_pods(POOL_SELECTOR)), 60)
