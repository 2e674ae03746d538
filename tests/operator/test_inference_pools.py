"""InferencePools for dedicated vllm groups (docs/llm.md, "Behind an Inference Extension gateway").

With the chart's ``inferencePool.endpointPicker`` set, the operator publishes the Gateway API
Inference Extension's InferencePool for each dedicated group of a ``framework: vllm`` model, so a
gateway that routes with the extension's endpoint picker reaches that group's pods on their
gateway port. The real operator, the real API server and the extension's own CRD (fetched from
the Go module proxy by scripts/install-inference-crds.sh), whose schema and CEL rules judge what the
operator writes; the API server's garbage collector removes a pool with its model.

The first test runs before the CRD is installed in this session's cluster: a cluster without the
extension gets a Warning on the model and a group that serves anyway.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from hotset_operator import kinds, workloads
from hotset_operator.config import OperatorConfig
from hotset_testing import chart
from hotset_testing.kube_cluster import KubeCluster
from hotset_testing.processes import cache_dir
from hotset_testing.operator_harness import Cluster, operator_config, running_operator, served_model, wait_for

INFERENCE_EXTENSION_VERSION = "v1.6.2"  # as scripts/install-inference-crds.sh
PICKER = "vllm-picker"
CRD_NAME = "inferencepools.inference.networking.k8s.io"


def crd_file() -> Path:
    cache = cache_dir()
    path = cache / "tools" / f"inference-extension-{INFERENCE_EXTENSION_VERSION}" / "inferencepools.yaml"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make install-inference-crds` (the Inference Extension's CRD, "
                    "from the Go module proxy)", pytrace=False)
    return path


@pytest.fixture
def extension(kube_cluster: KubeCluster) -> Iterator[None]:
    """The extension's InferencePool CRD, installed once (it stays for the session: nothing else uses it)."""
    kube_cluster.kubectl("apply", "--server-side", "-f", str(crd_file()))
    kube_cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    yield


def config_for(cluster: Cluster, **overrides: Any) -> OperatorConfig:
    return operator_config(cluster.namespace, inference_pool_picker=PICKER, **overrides)


def vllm_model(name: str, **spec: Any) -> dict[str, Any]:
    return served_model(name, **{"framework": "vllm", "task": "text-generation", "memory": "2Gi",
                                  "placement": "dedicated", "replicas": {"min": 1, "max": 2}, **spec})


def pool(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return cluster.get("inferencepool", name)


def events(cluster: Cluster, model: str) -> list[tuple[str, str]]:
    return [(item["reason"], item["message"])
            for item in cluster.items("events") if item["involvedObject"]["name"] == model]


def test_a_cluster_without_the_extension_gets_a_warning_and_the_group_still_runs(cluster: Cluster) -> None:
    if cluster.kube.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0:
        pytest.skip("the extension's CRD is installed already (this test ran after the others)")
    with running_operator(config_for(cluster)):
        cluster.apply(vllm_model("chat"))
        wait_for(lambda: cluster.get("deployment", "chat-dedicated"), "the group's Deployment")
        messages = wait_for(lambda: [m for r, m in events(cluster, "chat") if r == "InferencePoolUnavailable"],
                            "a Warning that no InferencePool could be published")
        assert all("inference.networking.k8s.io/v1" in message and "CRDs" in message for message in messages)


def test_a_dedicated_vllm_group_is_published_and_its_pods_serve_the_gateway(cluster: Cluster, extension) -> None:
    config = config_for(cluster)
    with running_operator(config):
        cluster.apply(vllm_model("chat"))
        published = wait_for(lambda: pool(cluster, "chat-dedicated"), "the group's InferencePool")
        deployment = wait_for(lambda: cluster.get("deployment", "chat-dedicated"), "the group's Deployment")
        spec = published["spec"]
        # It selects exactly the group's pods (not the shared pool's, nor another group's).
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"] == workloads.worker_labels("chat")
        assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
        assert spec["selector"]["matchLabels"] != workloads.worker_labels(None)
        # On the port the pods serve the gateway on, routed by the chart's picker.
        assert spec["targetPorts"] == [{"number": config.worker_gateway_port}]
        assert spec["endpointPickerRef"] == {"name": PICKER, "kind": "Service", "group": "",
                                             "port": {"number": 9002}, "failureMode": "FailClose"}
        (worker,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                     if c["name"] == workloads.WORKER_CONTAINER]
        assert {"name": "gateway", "containerPort": config.worker_gateway_port, "protocol": "TCP"} in worker["ports"]
        assert {"name": "HOTSET_GATEWAY_PORT", "value": str(config.worker_gateway_port)} in worker["env"]
        assert [(o["kind"], o["name"]) for o in published["metadata"]["ownerReferences"]] == [("ServedModel", "chat")]
        assert any(reason == "InferencePoolPublished" for reason, _ in events(cluster, "chat"))

        cluster.kubectl("delete", "servedmodel", "chat", "--timeout=60s")
        wait_for(lambda: pool(cluster, "chat-dedicated") is None, "the InferencePool gone with its model", timeout=60)


def test_other_groups_and_the_shared_pool_get_no_inference_pool_and_no_gateway_port(
        cluster: Cluster, extension) -> None:
    with running_operator(config_for(cluster)):
        cluster.apply(served_model("classifier", placement="dedicated", replicas={"min": 1, "max": 1}))
        cluster.apply(vllm_model("shared-chat", placement="shared"))
        deployment = wait_for(lambda: cluster.get("deployment", "classifier-dedicated"), "the classifier's group")
        wait_for(lambda: cluster.get("deployment", "hotset-pool"), "the shared pool")
        for name in ("classifier-dedicated", "hotset-pool"):
            containers = cluster.get("deployment", name)["spec"]["template"]["spec"]["containers"]
            assert all(port["name"] != "gateway" for c in containers for port in c.get("ports", [])), name
        assert deployment is not None
        assert cluster.items("inferencepools") == []


def test_a_model_that_leaves_vllm_or_its_group_takes_its_pool_away(cluster: Cluster, extension) -> None:
    with running_operator(config_for(cluster)):
        cluster.apply(vllm_model("chat"))
        wait_for(lambda: pool(cluster, "chat-dedicated"), "the group's InferencePool")
        cluster.apply(vllm_model("chat", placement="shared"))
        wait_for(lambda: pool(cluster, "chat-dedicated") is None and cluster.get("deployment", "chat-dedicated") is None,
                 "the pool and the group gone once the model is shared", timeout=60)
        cluster.apply(vllm_model("chat"))
        wait_for(lambda: pool(cluster, "chat-dedicated"), "the InferencePool back with the group")


def test_turning_it_on_publishes_the_groups_that_exist_and_rolls_only_those(cluster: Cluster, extension) -> None:
    """A restart with inferencePool newly on: the vllm group gets its pool and a pod template with the
    gateway port (a new template hash, so its pods roll); another group's template is untouched."""
    off = operator_config(cluster.namespace)
    with running_operator(off):
        cluster.apply(vllm_model("chat"))
        cluster.apply(served_model("classifier", placement="dedicated", replicas={"min": 1, "max": 1}))
        before = {name: wait_for(lambda name=name: cluster.get("deployment", name), name)
                  for name in ("chat-dedicated", "classifier-dedicated")}
    assert pool(cluster, "chat-dedicated") is None

    def template_hash(name: str) -> str:
        return cluster.get("deployment", name)["spec"]["template"]["metadata"]["annotations"][workloads.SPEC_HASH]

    # the same operator otherwise (its catalog feed's address is in every worker pod: tests pick a free port each)
    with running_operator(config_for(cluster, catalog_port=off.catalog_port, catalog_url=off.catalog_url)):
        wait_for(lambda: pool(cluster, "chat-dedicated"), "the existing group's InferencePool after the restart")
        wait_for(lambda: template_hash("chat-dedicated") != before["chat-dedicated"]["spec"]["template"]["metadata"][
            "annotations"][workloads.SPEC_HASH], "the vllm group's pods rolled onto the gateway port")
        # Its spec is as it was (the generation counts spec changes; status writes do not).
        assert cluster.get("deployment", "classifier-dedicated")["metadata"]["generation"] == (
            before["classifier-dedicated"]["metadata"]["generation"])


def test_an_inference_pool_someone_else_made_is_left_alone(cluster: Cluster, extension) -> None:
    theirs = {"apiVersion": kinds.INFERENCE_POOL_API_VERSION, "kind": kinds.INFERENCE_POOL,
              "metadata": {"name": "chat-dedicated"},
              "spec": {"selector": {"matchLabels": {"app": "theirs"}}, "targetPorts": [{"number": 8000}],
                       "endpointPickerRef": {"name": "their-picker", "port": {"number": 9002}}}}
    cluster.apply(theirs)
    with running_operator(config_for(cluster)):
        cluster.apply(vllm_model("chat"))
        wait_for(lambda: any(reason == "InferencePoolNotOurs" for reason, _ in events(cluster, "chat")),
                 "a Warning that the InferencePool of that name is someone else's")
        assert cluster.get("deployment", "chat-dedicated") is not None
        assert pool(cluster, "chat-dedicated")["spec"]["selector"] == {"matchLabels": {"app": "theirs"}}


@pytest.mark.parametrize("port", [8080, 8081, 8000, 8001, 8002])
def test_a_gateway_port_another_port_of_the_pod_holds_is_refused(port: int) -> None:
    with pytest.raises(ValueError, match=f"inferencePool.gatewayPort {port} is"):
        OperatorConfig(namespace="ml", inference_pool_picker=PICKER, worker_gateway_port=port)


def test_the_chart_turns_it_on_grants_it_and_opens_the_gateway_port_to_the_named_peers_only(
        kube_cluster: KubeCluster) -> None:
    gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}
    documents = chart.render(kube_cluster, "--set", f"inferencePool.endpointPicker={PICKER}",
                             "--set-json", f"inferencePool.gatewayFrom=[{json.dumps(gateway)}]", namespace="ml")
    operator = chart.document(documents, "Deployment", "hotset-operator")
    config = OperatorConfig.from_env(chart.env_values(operator), namespace="ml")
    assert (config.inference_pool_picker, config.inference_pool_picker_port, config.worker_gateway_port) == (
        PICKER, 9002, 8082)
    assert config.inference_pool_failure_mode.value == "FailClose"
    rules = [rule for doc in documents if doc["kind"] == "Role" and doc["metadata"]["name"] == "hotset-operator"
             for rule in doc["rules"]]
    assert {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
            "verbs": ["get", "create", "patch", "delete"]} in rules
    opened = [rule for rule in config.worker_network_rules["ingress"] if rule["ports"] == [{"port": 8082, "protocol": "TCP"}]]
    assert opened == [{"from": [gateway], "ports": [{"port": 8082, "protocol": "TCP"}]}]

    # The default: nothing published, nothing granted, no port opened.
    documents = chart.render(kube_cluster, namespace="ml")
    config = OperatorConfig.from_env(chart.env_values(chart.document(documents, "Deployment", "hotset-operator")),
                                     namespace="ml")
    assert not config.publishes_inference_pools
    assert "inferencepools" not in json.dumps([doc for doc in documents if doc["kind"] in ("Role", "ClusterRole")])
    assert all(port["port"] != 8082 for rule in config.worker_network_rules["ingress"] for port in rule["ports"])
