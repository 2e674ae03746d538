"""Worker pods on a GPU cluster's node pools: tolerations, node selection, affinity, spread and
priority from the chart, a WorkerPool or a dedicated ServedModel, the device plugin's
``nvidia.com/gpu`` as the GPU request, and the Triton sidecar only where Triton models are.

The pure tests read the operator's pod templates; the last one gives the real API server,
controller-manager and scheduler a tainted GPU node (``nvidia.com/gpu=present:NoSchedule``, two
``nvidia.com/gpu``, what GKE's GPU node pools look like) beside an untainted CPU node, installs the
operator with the chart's default values and checks where the real scheduler binds each pod.
"""
from __future__ import annotations

import json

import pytest

from hotset_common import model_store
from hotset_common.spec import ModelSpec, Scheduling
from hotset_operator import workloads
from hotset_operator.config import OperatorConfig, TritonSidecar
from hotset_testing import chart
from hotset_testing import kube_cluster as kc
from hotset_testing.kube_cluster import KubeCluster
from hotset_testing.operator_harness import Cluster, operator_config, running_operator, served_model, wait_for

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def chart_worker_settings(kube: KubeCluster, *values: str) -> dict[str, str]:
    """The HOTSET_OPERATOR_* settings the chart renders for worker pods (scheduling, sidecar, GPUs),
    `--set-json` each of `values`."""
    documents = chart.render(kube, "--show-only", "templates/operator-deployment.yaml",
                             *[arg for value in values for arg in ("--set-json", value)])
    env = chart.env_values(chart.document(documents, "Deployment", "hotset-operator"))  # and its Service
    wanted = ("HOTSET_OPERATOR_WORKER_SCHEDULING", "HOTSET_OPERATOR_TRITON_SIDECAR", "HOTSET_OPERATOR_GPU_MODE",
              "HOTSET_OPERATOR_GPUS_PER_POD")
    return {name.removeprefix("HOTSET_OPERATOR_").lower(): value for name, value in env.items() if name in wanted}


def _config(**overrides) -> OperatorConfig:
    return OperatorConfig(**{"namespace": "ml", "pod_memory_budget": "20Gi", **overrides})


def _dedicated(framework: str = "transformers", **spec) -> ModelSpec:
    return ModelSpec(id="m", framework=framework, source="pvc://models/m", memory="1Gi", placement="dedicated", **spec)


def _pod(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def _body() -> dict:
    return {"metadata": {"name": "m", "namespace": "ml", "uid": "1"}}


# ----- pure: what the pod templates carry ------------------------------------------------------

def test_the_device_plugin_is_the_default_gpu_request() -> None:
    (worker,) = _pod(workloads.build_dedicated_deployment(_dedicated(), _body(), _config()))["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1" == worker["resources"]["requests"]["nvidia.com/gpu"]
    assert "resourceClaims" not in _pod(workloads.build_dedicated_deployment(_dedicated(), _body(), _config()))


def test_worker_pods_carry_the_charts_scheduling_and_a_dedicated_model_replaces_it_field_by_field() -> None:
    chart_scheduling = Scheduling.model_validate({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                                                  "nodeSelector": {"pool": "gpu"}})
    config = _config(worker_scheduling=chart_scheduling)
    pool = _pod(workloads.build_pool_deployment(config, replicas=1))
    assert pool["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pool["nodeSelector"] == {"pool": "gpu"} and "priorityClassName" not in pool
    own = {"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, "priorityClassName": "latency",
           "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                          "whenUnsatisfiable": "ScheduleAnyway"}]}
    dedicated = _pod(workloads.build_dedicated_deployment(_dedicated(scheduling=own), _body(), config))
    assert dedicated["nodeSelector"] == own["nodeSelector"] and dedicated["priorityClassName"] == "latency"
    assert dedicated["topologySpreadConstraints"] == own["topologySpreadConstraints"]
    assert dedicated["tolerations"] == pool["tolerations"]  # not given: the chart's


def test_a_worker_pools_spec_places_its_pods_and_picks_its_sidecar() -> None:
    config = _config(worker_scheduling=Scheduling.model_validate({"tolerations": [{"key": "a", "operator": "Exists"}]}))
    pods = workloads.PoolPods.of({"scheduling": {"tolerations": [], "affinity": {"nodeAffinity": {}}},
                                  "tritonSidecar": "never"})
    pod = _pod(workloads.build_pool_deployment(config, 1, pods=pods, serves_triton_models=True))
    assert pod["tolerations"] == [] and pod["affinity"] == {"nodeAffinity": {}}
    assert [c["name"] for c in pod["containers"]] == ["hotset-worker"]
    assert workloads.PoolPods.of({"tritonSidecar": "sometimes"}) == workloads.PoolPods()  # unknown: the chart's


def test_a_shared_model_cannot_place_pods_it_does_not_have() -> None:
    with pytest.raises(ValueError, match="placement: dedicated"):
        ModelSpec(id="m", framework="transformers", source="pvc://m/m", memory="1Gi",
                  scheduling={"nodeSelector": {"a": "b"}})


@pytest.mark.parametrize(("mode", "serves_triton", "sidecar"), [
    (TritonSidecar.AUTO, False, False), (TritonSidecar.AUTO, True, True),
    (TritonSidecar.ALWAYS, False, True), (TritonSidecar.NEVER, True, False),
])
def test_a_pool_runs_the_triton_sidecar_only_where_triton_models_are(mode, serves_triton, sidecar) -> None:
    pod = _pod(workloads.build_pool_deployment(_config(triton_sidecar=mode), 1, serves_triton_models=serves_triton))
    assert ("triton" in [c["name"] for c in pod["containers"]]) is sidecar
    assert ("triton-tmp" in [v["name"] for v in pod["volumes"]]) is sidecar
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert (env.get("HOTSET_TRITON_URL") == "127.0.0.1:8000") is sidecar


def test_a_dedicated_group_runs_the_sidecar_for_a_triton_model_only() -> None:
    for framework, sidecar in (("triton", True), ("transformers", False), ("vllm", False)):
        pod = _pod(workloads.build_dedicated_deployment(_dedicated(framework), _body(), _config()))
        assert ("triton" in [c["name"] for c in pod["containers"]]) is sidecar, framework


def test_the_sidecar_runs_triton_under_a_loop_that_starts_it_again() -> None:
    pod = _pod(workloads.build_pool_deployment(_config(triton_sidecar=TritonSidecar.ALWAYS), 1))
    triton = next(c for c in pod["containers"] if c["name"] == "triton")
    assert triton["command"][:2] == ["/bin/sh", "-c"] and "wait" in triton["command"][2]
    assert triton["args"][0] == "tritonserver" and "--model-control-mode=explicit" in triton["args"]


def test_a_scheduling_change_leaves_the_catalog_entry_alone_and_rolls_the_dedicated_group() -> None:
    """Workers never read scheduling (no catalog write for it); a dedicated group's pods are where it
    applies, so it changes what the group runs (its hash) and the group rolls onto the new nodes."""
    plain = _dedicated()
    placed = _dedicated(scheduling={"nodeSelector": {"a": "b"}})
    assert model_store.store_entry(plain) == model_store.store_entry(placed)
    assert workloads.group_hash(_config(), plain, "ml") != workloads.group_hash(_config(), placed, "ml")
    deployment = workloads.build_dedicated_deployment(placed, _body(), _config())
    assert deployment["spec"]["template"]["metadata"]["annotations"][workloads.SPEC_HASH] == (
        workloads.group_hash(_config(), placed, deployment["metadata"]["namespace"]))


def test_the_charts_values_reach_the_operator(kube_cluster) -> None:
    defaults = chart_worker_settings(kube_cluster)
    assert (defaults["gpu_mode"], defaults["triton_sidecar"]) == ("devicePlugin", "auto")
    config = OperatorConfig.from_env({f"HOTSET_OPERATOR_{k.upper()}": v for k, v in defaults.items()})
    assert config.worker_scheduling.pod_fields() == {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    placed = chart_worker_settings(kube_cluster, 'workers.scheduling={"nodeSelector": {"pool": "gpu"}, "priorityClassName": "p"}',
                                   'workers.triton={"sidecar": "always"}')
    config = OperatorConfig.from_env({f"HOTSET_OPERATOR_{k.upper()}": v for k, v in placed.items()})
    assert config.worker_scheduling.pod_fields() == {  # helm merges the values: the default toleration stays
        "nodeSelector": {"pool": "gpu"}, "priorityClassName": "p",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    assert config.triton_sidecar is TritonSidecar.ALWAYS


# ----- the real scheduler ----------------------------------------------------------------------

def test_on_a_tainted_gpu_node_pool_every_worker_pod_is_scheduled(cluster: Cluster) -> None:
    """The chart's defaults (device plugin, the nvidia.com/gpu toleration) put the pool's pod and a
    dedicated group's pod on the tainted GPU node; the CPU node next to it gets none (no GPUs there).
    A WorkerPool whose spec.scheduling drops the toleration makes its next pod pend on the taint."""
    suffix = cluster.namespace
    gpu_node, cpu_node, priority = f"gpu-{suffix}", f"cpu-{suffix}", f"hotset-latency-{suffix}"
    kc.register_node(cluster.kube, gpu_node, cpu="64", memory="512Gi", gpus=2, labels={"pool": suffix, "gpu": "true"},
                     taints=[GPU_TAINT])
    kc.register_node(cluster.kube, cpu_node, cpu="64", memory="512Gi", labels={"pool": suffix})
    cluster.kube.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": priority}, "value": 1000}))
    rendered = chart_worker_settings(cluster.kube, f'workers.scheduling={{"tolerations": [{{"key": "nvidia.com/gpu", '
                                     f'"operator": "Exists", "effect": "NoSchedule"}}], "nodeSelector": {{"pool": "{suffix}"}}}}')
    config = operator_config(cluster.namespace, worker_scheduling=rendered["worker_scheduling"],
                             triton_sidecar=rendered["triton_sidecar"], pool_min_pods=1)
    try:
        with running_operator(config):
            cluster.apply(served_model("llm", placement="dedicated", memory="1Gi", replicas={"min": 1, "max": 1},
                                       scheduling={"nodeSelector": {"gpu": "true"}, "priorityClassName": priority}))

            def bound(selector: str) -> dict | None:
                pods = [p for p in cluster.items("pods", selector) if p["spec"].get("nodeName")]
                return pods[0] if pods else None

            dedicated = wait_for(lambda: bound("hotset.io/servedmodel=llm"), "llm's pod bound", timeout=90)
            pool = wait_for(lambda: bound("hotset.io/pool=shared"), "the pool's pod bound", timeout=90)
            for pod in (dedicated, pool):
                assert pod["spec"]["nodeName"] == gpu_node, pod["metadata"]["name"]
                assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
                assert [c["name"] for c in pod["spec"]["containers"]] == ["hotset-worker"]  # no Triton model here
                (worker,) = pod["spec"]["containers"]
                assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
            assert dedicated["spec"]["priorityClassName"] == priority and dedicated["spec"]["priority"] == 1000
            assert dedicated["spec"]["nodeSelector"] == {"gpu": "true"} and pool["spec"]["nodeSelector"] == {"pool": suffix}

            # The pool's owner drops the toleration: the rolled pod cannot go anywhere (the GPU node is
            # tainted, the CPU node has no GPUs), and the scheduler says why.
            cluster.kubectl("patch", "workerpool", config.pool_name, "--type=merge",
                            "-p", json.dumps({"spec": {"scheduling": {"tolerations": []}}}))

            def pending_on_the_taint() -> str | None:
                for pod in cluster.items("pods", "hotset.io/pool=shared"):
                    if pod["spec"].get("nodeName") or any(t.get("key") == "nvidia.com/gpu"
                                                          for t in pod["spec"].get("tolerations", [])):
                        continue  # the first pod, still bound where it was
                    scheduled = next((c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"), {})
                    if scheduled.get("status") == "False" and "untolerated taint" in scheduled.get("message", ""):
                        return scheduled["message"]
                return None

            message = wait_for(pending_on_the_taint, "the pool's new pod pending on the GPU taint", timeout=90)
            assert "nvidia.com/gpu" in message and "Insufficient nvidia.com/gpu" in message, message
            cluster.kubectl("delete", "servedmodel", "llm", "--wait=true", "--timeout=60s")
    finally:
        for node in (gpu_node, cpu_node):
            cluster.kube.kubectl("delete", "node", node, "--ignore-not-found")
        cluster.kube.kubectl("delete", "priorityclass", priority, "--ignore-not-found")
