"""A tainted GPU node on the kind cluster: a worker pod that tolerates it and asks for a GPU lands there.

GPU node pools are tainted (GKE: ``nvidia.com/gpu=present:NoSchedule``) and
advertise ``nvidia.com/gpu`` through NVIDIA's device plugin. kind has no GPU,
so the scenario makes one node (the one with the most CPU free) look like such
a node the documented way for extended resources: a taint, and
``nvidia.com/gpu: 1`` patched into the node's status (its ``/status``
subresource; the kubelet keeps an extended resource no device plugin owns and
admits pods that request it without allocating devices). The chart then runs with ``workers.gpu.mode: devicePlugin``, so every
worker pod requests the GPU, and a dedicated ServedModel's
``spec.scheduling.tolerations`` let its pod onto the node. The real scheduler
and kubelet decide; the worker finds no CUDA device and runs on the CPU
(``hotset_worker.main.device``), so the pod becomes Ready and serves.

Everything is undone in reverse order, each step even when an earlier one
failed: the model deleted, the chart's ``gpu.mode: none`` back (the pool's
Deployment returns to its earlier template, its running pod untouched), the
taint and the fake capacity removed, so later scenarios keep both nodes.
"""
from __future__ import annotations

import contextlib
import json
from typing import Any

from hotset_operator.config import GpuMode
from scenarios.inputs import check_predictions, predict
from scenarios.platform import Kube, Platform, is_true, sample, wait_for
from scenarios.served_models import POOL_SELECTOR, WORKER_CONTAINER

GPU_RESOURCE = "nvidia.com/gpu"  # the chart's workers.gpu.resourceName, NVIDIA's device plugin's
GPU_TAINT = {"key": "hotset.io/e2e-gpu", "value": "true", "effect": "NoSchedule"}
MODEL = "sentiment-gpu"
# The JSON-pointer form of the resource name in the node's status (a "/" is "~1").
_POINTER = GPU_RESOURCE.replace("~", "~0").replace("/", "~1")


def millicores(quantity: str) -> int:
    """A CPU quantity ("2", "400m", "1.5") in millicores."""
    return int(quantity[:-1]) if quantity.endswith("m") else round(float(quantity) * 1000)


def gpu_node_candidate(kube: Kube) -> str:
    """The node to make a GPU node: the one with the most CPU no pod requests (the dedicated pod
    needs a worker's and a sidecar's share; where the pool's pods are depends on the scenarios before)."""
    free = {n["metadata"]["name"]: millicores(n["status"]["allocatable"]["cpu"]) for n in kube.items("nodes")}
    for pod in json.loads(kube.runner.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]:
        if pod["spec"].get("nodeName") in free and pod["status"].get("phase") not in ("Succeeded", "Failed"):
            free[pod["spec"]["nodeName"]] -= sum(millicores(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
                                                 for c in pod["spec"]["containers"])
    return max(sorted(free), key=lambda name: free[name])


def node(kube: Kube, name: str) -> dict[str, Any]:
    return json.loads(kube.runner.kubectl("get", "node", name, "-o", "json").stdout)


def patch_gpus(kube: Kube, name: str, op: str) -> None:
    """Advertise (op "add", one GPU) or withdraw (op "remove") the fake extended resource."""
    patch = [{"op": op, "path": f"/status/{field}/{_POINTER}", **({"value": "1"} if op == "add" else {})}
             for field in ("capacity", "allocatable")]
    kube.runner.kubectl("patch", "node", name, "--subresource=status", "--type=json", "-p", json.dumps(patch))


def advertised_gpus(kube: Kube, name: str) -> str | None:
    return (node(kube, name)["status"].get("allocatable") or {}).get(GPU_RESOURCE)


def rolled_out(kube: Kube, deployment: str, timeout_s: int = 240) -> None:
    kube.runner.kubectl("rollout", "status", f"deployment/{deployment}", "-n", kube.namespace,
                        f"--timeout={timeout_s}s", timeout=timeout_s + 30)


def pool_deployment(kube: Kube) -> dict[str, Any]:
    (deployment,) = kube.items("deployments", "-l", POOL_SELECTOR)
    return deployment


def worker_gpus(template_or_pod: dict[str, Any]) -> str | None:
    spec = template_or_pod["spec"]["template"]["spec"] if "template" in template_or_pod["spec"] else template_or_pod["spec"]
    worker = next(c for c in spec["containers"] if c["name"] == WORKER_CONTAINER)
    return (worker.get("resources", {}).get("limits") or {}).get(GPU_RESOURCE)


def set_gpu_mode(platform: Platform, kube: Kube, mode: GpuMode) -> None:
    """The chart's workers.gpu.mode, and a new operator that has re-rendered the pool with it."""
    platform.set_gpu_mode(mode.value)
    rolled_out(kube, "hotset-operator")
    wants = "1" if mode is GpuMode.DEVICE_PLUGIN else None
    wait_for(f"the pool's pod template with gpu.mode {mode.value}", lambda: worker_gpus(pool_deployment(kube)) == wants,
             120, interval=1.0)


def restore_pool(platform: Platform, kube: Kube) -> None:
    """gpu.mode none again; the pool's Deployment back on its earlier template, every pod Ready."""
    set_gpu_mode(platform, kube, GpuMode.NONE)
    rolled_out(kube, pool_deployment(kube)["metadata"]["name"])


def pending_on_the_taint(kube: Kube) -> str | None:
    """The scheduler's message for a pool pod that asks for the GPU but does not tolerate the taint."""
    for pod in kube.worker_pods(POOL_SELECTOR):
        if pod["spec"].get("nodeName") or worker_gpus(pod) is None:
            continue
        scheduled = next((c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"), {})
        if scheduled.get("status") == "False" and "untolerated taint" in scheduled.get("message", ""):
            return scheduled["message"]
    return None


def dedicated_model() -> dict[str, Any]:
    """sentiment as a one-pod dedicated group that tolerates the GPU node's taints (its tolerations
    replace the chart's, so the chart's nvidia.com/gpu one is repeated)."""
    body = sample("sentiment")
    body["metadata"]["name"] = MODEL
    body["spec"].update(placement="dedicated", replicas={"min": 1, "max": 1}, scheduling={"tolerations": [
        {"key": GPU_TAINT["key"], "operator": "Equal", "value": GPU_TAINT["value"], "effect": GPU_TAINT["effect"]},
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]})
    return body


def tolerating_pod_on_the_gpu_node(platform: Platform, kube: Kube) -> None:
    """A node tainted and advertising one nvidia.com/gpu; the chart with gpu.mode devicePlugin; a
    dedicated ServedModel tolerating the taint: its pod requests the GPU, is bound to that node, becomes
    Ready (the worker runs on the CPU when it finds no CUDA device) and serves through the router.
    The pool's pods, which do not tolerate the taint, get none of it (the pool's rolled pod pends)."""
    name = gpu_node_candidate(kube)
    selector = f"app.kubernetes.io/component=worker,hotset.io/servedmodel={MODEL}"
    with contextlib.ExitStack() as undo:
        taint = f"{GPU_TAINT['key']}={GPU_TAINT['value']}:{GPU_TAINT['effect']}"
        kube.runner.kubectl("taint", "nodes", name, taint)
        undo.callback(kube.runner.kubectl, "taint", "nodes", name, f"{taint}-")
        patch_gpus(kube, name, "add")
        undo.callback(lambda: wait_for(f"{name} without {GPU_RESOURCE}", lambda: advertised_gpus(kube, name) is None, 60))
        undo.callback(patch_gpus, kube, name, "remove")
        wait_for(f"{name} advertising one {GPU_RESOURCE}", lambda: advertised_gpus(kube, name) == "1", 60)

        undo.callback(restore_pool, platform, kube)
        set_gpu_mode(platform, kube, GpuMode.DEVICE_PLUGIN)
        kube.apply([dedicated_model()])
        undo.callback(lambda: wait_for(f"{MODEL}'s pod gone", lambda: not kube.worker_pods(selector), 120))
        undo.callback(kube.delete, "servedmodel", MODEL)

        def bound() -> dict[str, Any] | None:
            pods = [p for p in kube.worker_pods(selector) if p["spec"].get("nodeName")]
            return pods[0] if pods else None

        pod = wait_for(f"{MODEL}'s pod bound to a node", bound, 120, show=lambda: kube.items("pods", "-l", selector))
        assert pod["spec"]["nodeName"] == name, f"bound to {pod['spec']['nodeName']}, not the GPU node {name}"
        assert worker_gpus(pod) == "1", pod["spec"]["containers"]
        pod_name = pod["metadata"]["name"]
        wait_for(f"{pod_name} Ready on {name}", lambda: is_true(kube.get("pod", pod_name), "Ready"), 300, interval=1.0,
                 show=lambda: kube.get("pod", pod_name).get("status"))
        wait_for(f"{MODEL} Ready", lambda: is_true(kube.served_model(MODEL), "Ready"), 120, interval=1.0)
        check_predictions("sentiment", predict(platform, MODEL, like="sentiment"))
        message = wait_for("the pool's rolled pod pending on the taint", lambda: pending_on_the_taint(kube), 60)
        assert f"Insufficient {GPU_RESOURCE}" in message, message  # the scheduler names no taint key, only the count
        print(f"GPU node {name}: {pod_name} bound there with {GPU_RESOURCE}: 1, Ready, served through the router")
    left = node(kube, name)
    assert not [t for t in left["spec"].get("taints") or [] if t["key"] == GPU_TAINT["key"]], left["spec"]
    assert GPU_RESOURCE not in left["status"]["capacity"], left["status"]["capacity"]
