"""GPUs for both containers of a worker pod: one pod-level DRA claim that the worker and its Triton
sidecar share, end to end on the real control plane.

The chart's ResourceClaimTemplate and the operator's Deployments go to the real
API server; the test then plays the DRA driver's part (a DeviceClass and a
ResourceSlice of two GPUs on a node, what NVIDIA's k8s-dra-driver-gpu
publishes). The real controller-manager makes one ResourceClaim per pod from
the template and the real scheduler allocates it and binds the pod: each pod
gets a device of its own, and both of its containers name that one claim.
"""
from __future__ import annotations

import json

from hotset_testing import chart
from hotset_testing import kube_cluster as kc
from hotset_testing.operator_harness import Cluster, operator_config, running_operator, served_model, wait_for


def rendered_claim_template(cluster: Cluster, device_class: str) -> dict:
    """The chart's ResourceClaimTemplate, rendered as `helm install` would with these values."""
    (claim,) = chart.render(cluster.kube, "--show-only", "templates/worker-gpu-claim.yaml", "--set", "workers.gpu.mode=dra",
                            "--set", f"workers.gpu.deviceClassName={device_class}", "--set", "workers.gpu.count=1",
                            namespace=cluster.namespace)
    return claim


def publish_gpus(cluster: Cluster, node: str, driver: str, device_class: str, count: int) -> None:
    """What a DRA driver does on a GPU node: its DeviceClass, and a ResourceSlice listing the devices."""
    kc.register_node(cluster.kube, node, cpu="64", memory="512Gi")
    device_class_body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": device_class},
                         "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}}
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H200"}},
                "capacity": {"memory": {"value": "141Gi"}}} for i in range(count)]
    slice_body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpus"},
                  "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                           "devices": devices}}
    for body in (device_class_body, slice_body):
        cluster.kube.kubectl("apply", "-f", "-", input=json.dumps(body))


def test_one_claim_per_pod_allocated_by_the_scheduler_and_named_by_both_containers(cluster: Cluster) -> None:
    suffix = cluster.namespace
    driver, device_class, node = f"gpu.{suffix}.example.com", f"gpu-{suffix}", f"gpu-node-{suffix}"
    publish_gpus(cluster, node, driver, device_class, count=2)
    template = rendered_claim_template(cluster, device_class)
    assert template["kind"] == "ResourceClaimTemplate"
    cluster.apply(template)
    config = operator_config(cluster.namespace, gpu_mode="dra", gpu_claim_template=template["metadata"]["name"],
                             pool_min_pods=1)
    try:
        with running_operator(config):
            cluster.apply(served_model("llm", placement="dedicated", memory="1Gi", replicas={"min": 1, "max": 1}))

            def two_bound_pods() -> list[dict] | None:
                pods = [p for p in cluster.items("pods", "app.kubernetes.io/component=worker")
                        if p["spec"].get("nodeName") == node]
                return pods if len(pods) == 2 else None

            pods = wait_for(two_bound_pods, f"the pool's pod and llm's pod bound to {node}", timeout=90)
            claims = {c["metadata"]["name"]: c for c in cluster.items("resourceclaims")}
            devices = []
            for pod in pods:
                for container in pod["spec"]["containers"]:  # the worker and the Triton sidecar
                    assert container["resources"]["claims"] == [{"name": "gpu"}], container["name"]
                (status,) = wait_for(lambda: (cluster.get("pod", pod["metadata"]["name"])["status"]
                                              .get("resourceClaimStatuses")), "the pod's claim status")
                claim = claims[status["resourceClaimName"]]
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                assert (result["driver"], result["pool"], result["request"]) == (driver, node, "gpu")
                reserved = {r["name"] for r in claim["status"]["reservedFor"]}
                assert reserved == {pod["metadata"]["name"]}  # one pod's claim, both its containers' devices
                devices.append(result["device"])
            assert sorted(devices) == ["gpu-0", "gpu-1"]  # each pod a device of its own
            cluster.kubectl("delete", "servedmodel", "llm", "--wait=true", "--timeout=60s")
    finally:
        cluster.kube.kubectl("delete", "resourceslice", f"{node}-gpus", "--ignore-not-found")
        cluster.kube.kubectl("delete", "deviceclass", device_class, "--ignore-not-found")
        cluster.kube.kubectl("delete", "node", node, "--ignore-not-found")
