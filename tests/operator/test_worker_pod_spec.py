"""What a worker pod looks like: two containers sharing /models, probes that mean
what they say, GPUs from the settings, nothing running as root."""
from __future__ import annotations

from pathlib import Path

from hotset_common import labels, worker_identity as identity
from hotset_common.spec import ModelSpec
from hotset_operator import workloads
from hotset_operator.config import OperatorConfig


def _config(**overrides) -> OperatorConfig:
    return OperatorConfig(namespace="ml", gpus_per_pod=2, pod_memory_budget="20Gi",
                          model_claims="models,extra", **overrides)


def _spec() -> ModelSpec:
    return ModelSpec(id="sentiment", framework="transformers", source="pvc://models/sentiment",
                     memory="600Mi", replicas={"min": 2, "max": 4}, placement="dedicated")


def _body() -> dict:
    return {"metadata": {"name": "sentiment", "namespace": "ml", "uid": "1234"}}


def _containers(template: dict) -> dict[str, dict]:
    return {c["name"]: c for c in template["spec"]["containers"]}


def test_dedicated_deployment_pins_its_model_and_leaves_replicas_to_the_autoscaler() -> None:
    assert workloads.build_dedicated_deployment(_spec(), _body(), _config(), replicas=2)["spec"]["replicas"] == 2
    deployment = workloads.build_dedicated_deployment(_spec(), _body(), _config())
    assert "replicas" not in deployment["spec"]  # the autoscaler's field manager owns them
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == "1234"
    template = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    env = {e["name"]: e.get("value") for e in _containers(template)["hotset-worker"]["env"]}
    assert env["HOTSET_PINNED_MODELS"] == "sentiment"
    assert env["HOTSET_MEMORY_BUDGET"] == str(20 * 2**30)
    assert env["HOTSET_BUDGET_MODE"] == "auto"  # hard on a GPU, load-first on a CPU: the worker decides
    assert env["HOTSET_SOURCE_ROOTS"] == "models=/mnt/models/models,extra=/mnt/models/extra"
    assert env["HOTSET_HOST"] == "0.0.0.0"


def test_worker_and_sidecar_share_the_model_repository() -> None:
    containers = _containers(workloads.build_worker_pod_template(_config(), None, []))
    worker, triton = containers["hotset-worker"], containers["triton"]
    assert {"name": "model-repository", "mountPath": "/models"} in worker["volumeMounts"]
    assert {"name": "model-repository", "mountPath": "/models", "readOnly": True} in triton["volumeMounts"]
    assert "--model-repository=/models" in triton["args"]
    assert "--model-control-mode=explicit" in triton["args"]
    # Load/unload stay inside the pod: Triton listens on localhost only.
    assert "--http-address=127.0.0.1" in triton["args"]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["HOTSET_TRITON_URL"] == "127.0.0.1:8000" and env["HOTSET_TRITON_REPOSITORY"] == "/models"


def test_probes_readiness_needs_models_liveness_does_not() -> None:
    worker = _containers(workloads.build_worker_pod_template(_config(), None, []))["hotset-worker"]
    assert worker["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert worker["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    startup = worker["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # ten minutes for slow first loads


def test_a_dedicated_group_waits_for_its_models_own_load_timeout_before_restarting_a_pod() -> None:
    def startup_window_s(spec: ModelSpec) -> int:
        deployment = workloads.build_dedicated_deployment(spec, _body(), _config())
        probe = _containers(deployment["spec"]["template"])["hotset-worker"]["startupProbe"]
        return probe["periodSeconds"] * probe["failureThreshold"]

    default = startup_window_s(_spec())
    assert default == 5 * _config().startup_probe_failure_threshold  # the chart's value
    large = _spec().model_copy(update={"load_timeout_seconds": 3600.0})  # an hour to fetch and load
    assert startup_window_s(large) >= 3600 + 60  # its load, and the worker's own start
    small = _spec().model_copy(update={"load_timeout_seconds": 30.0})
    assert 90 <= startup_window_s(small) < default  # a stuck small model is restarted sooner
    # the pool's pods pin nothing: the chart's value
    pool = _containers(workloads.build_worker_pod_template(_config(), None, []))["hotset-worker"]["startupProbe"]
    assert pool["periodSeconds"] * pool["failureThreshold"] == default


def test_with_dra_both_containers_share_the_pods_one_gpu_claim() -> None:
    template = workloads.build_worker_pod_template(_config(gpu_mode="dra", gpu_claim_template="gpus"), None, [])
    assert template["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpus"}]
    for container in template["spec"]["containers"]:  # the worker AND the Triton sidecar
        assert container["resources"]["claims"] == [{"name": "gpu"}], container["name"]
        assert "nvidia.com/gpu" not in container["resources"]["limits"]


def test_with_the_device_plugin_each_container_requests_its_own() -> None:
    config = _config(gpu_mode="devicePlugin", triton_gpus=1)
    containers = _containers(workloads.build_worker_pod_template(config, None, []))
    assert containers["hotset-worker"]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert containers["triton"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "resourceClaims" not in workloads.build_worker_pod_template(config, None, [])["spec"]
    cpu_triton = _containers(workloads.build_worker_pod_template(_config(gpu_mode="devicePlugin"), None, []))["triton"]
    assert "nvidia.com/gpu" not in cpu_triton["resources"]["limits"]  # tritonCount 0: Triton on the CPU


def test_gpu_pods_get_a_memory_backed_dev_shm_and_cpu_pods_keep_their_own() -> None:
    def shm(template: dict) -> tuple[list, list]:
        volumes = [v for v in template["spec"]["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        mounts = [m for m in _containers(template)["hotset-worker"]["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        return volumes, mounts

    volumes, mounts = shm(workloads.build_worker_pod_template(_config(gpu_mode="devicePlugin"), None, []))
    assert volumes[0]["emptyDir"]["sizeLimit"] == str(2 * 2**30) and mounts[0]["name"] == volumes[0]["name"]
    volumes, _ = shm(workloads.build_worker_pod_template(_config(gpu_mode="dra", gpu_shared_memory="8Gi"), None, []))
    assert volumes[0]["emptyDir"]["sizeLimit"] == str(8 * 2**30)
    assert shm(workloads.build_worker_pod_template(_config(gpu_mode="none"), None, [])) == ([], [])
    assert shm(workloads.build_worker_pod_template(_config(gpu_shared_memory=0), None, [])) == ([], [])


def test_cpu_only_pods_ask_for_no_gpu() -> None:
    template = workloads.build_worker_pod_template(_config(gpu_mode="none"), None, [])
    assert "resourceClaims" not in template["spec"]
    for container in template["spec"]["containers"]:
        assert "nvidia.com/gpu" not in container["resources"]["limits"] and "claims" not in container["resources"]


def test_nothing_runs_as_root_or_holds_an_api_token() -> None:
    template = workloads.build_worker_pod_template(_config(), None, [])
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    assert template["spec"]["securityContext"]["runAsUser"] != 0
    assert template["spec"]["automountServiceAccountToken"] is False
    for container in template["spec"]["containers"]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_pool_pods_carry_the_selector_the_router_uses() -> None:
    pool = workloads.build_pool_deployment(_config(), replicas=3)
    pod_labels = pool["spec"]["template"]["metadata"]["labels"]
    for pair in labels.WORKER_SELECTOR.split(","):
        key, value = pair.split("=")
        assert pod_labels[key] == value
    assert pod_labels[labels.POOL] == labels.SHARED_POOL and pool["spec"]["replicas"] == 3


def test_a_changed_model_spec_rolls_the_dedicated_group() -> None:
    first = workloads.build_dedicated_deployment(_spec(), _body(), _config())
    bigger = _spec().model_copy(update={"memory_bytes": 2**30})
    second = workloads.build_dedicated_deployment(bigger, _body(), _config())
    annotation = workloads.SPEC_HASH
    assert first["spec"]["template"]["metadata"]["annotations"][annotation] != \
        second["spec"]["template"]["metadata"]["annotations"][annotation]


def test_each_pool_follows_only_its_own_catalog() -> None:
    urls = {}
    for dedicated_to in (None, "sentiment"):
        template = workloads.build_worker_pod_template(_config(catalog_url="http://operator:8090"), dedicated_to, [],
                                                       namespace="team")
        worker = _containers(template)["hotset-worker"]
        urls[dedicated_to] = next(e["value"] for e in worker["env"] if e["name"] == "HOTSET_CATALOG_URL")
        assert not any("configMap" in v for v in template["spec"]["volumes"])  # no catalog mounted
        assert "HOTSET_MODEL_STORE" not in {e["name"] for e in worker["env"]}
    assert urls == {None: "http://operator:8090/v1/catalogs/team/pool",
                    "sentiment": "http://operator:8090/v1/catalogs/team/dedicated/sentiment"}
    default = _containers(workloads.build_worker_pod_template(_config(), None, []))["hotset-worker"]
    assert {"name": "HOTSET_CATALOG_URL", "value": "http://hotset-operator.ml.svc:8090/v1/catalogs/ml/pool"} in default["env"]


def test_the_pool_is_owned_by_the_operator_deployment_when_named() -> None:
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "hotset-operator", "uid": "u-1"}
    pool = workloads.build_pool_deployment(_config(), replicas=1, owners=[owner])
    assert pool["metadata"]["ownerReferences"] == [owner]
    assert "ownerReferences" not in workloads.build_pool_deployment(_config(), replicas=1)["metadata"]


def test_worker_pods_carry_the_trust_policy_and_tokens_of_their_own_not_a_shared_one() -> None:
    """docs/security.md, "Workers that prove who they are": the kubelet projects the pod's identity and
    catalog tokens (each for its audience, bound to the pod), the cluster's keys come from the
    operator's ConfigMap, and the worker answers the router's and the operator's accounts only."""
    config = _config(worker_identity="pod-token", worker_service_account="hotset-worker")
    template = workloads.build_worker_pod_template(config, None, [])
    worker = _containers(template)[workloads.WORKER_CONTAINER]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["HOTSET_FILE_ROOTS"] == ""  # file:// refused unless roots are declared
    assert "python" not in env["HOTSET_TRITON_BACKENDS"].split(",")
    assert "HOTSET_API_TOKEN" not in env and not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"]
                                                    for e in worker["env"])
    assert env["HOTSET_TRUSTED_CALLERS"] == "ml:hotset-router,ml:hotset-operator"
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    tokens = {s["serviceAccountToken"]["audience"]: s["serviceAccountToken"]
              for s in volumes[workloads.IDENTITY_VOLUME]["projected"]["sources"]}
    assert set(tokens) == {identity.IDENTITY_AUDIENCE, identity.CATALOG_AUDIENCE}
    assert all(t["expirationSeconds"] == identity.TOKEN_SECONDS for t in tokens.values())
    assert volumes[workloads.KEYS_VOLUME]["configMap"] == {"name": identity.KEYS_CONFIGMAP, "optional": True,
                                                            "defaultMode": 0o444}
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    assert env["HOTSET_IDENTITY_TOKEN_FILE"] == f"{mounts[workloads.IDENTITY_VOLUME]}/{tokens[identity.IDENTITY_AUDIENCE]['path']}"
    assert env["HOTSET_CATALOG_TOKEN_FILE"] == f"{mounts[workloads.IDENTITY_VOLUME]}/{tokens[identity.CATALOG_AUDIENCE]['path']}"
    assert env["HOTSET_CALLER_KEYS"] == mounts[workloads.KEYS_VOLUME]
    triton = _containers(template)[workloads.TRITON_CONTAINER]  # the sidecar holds none of them
    assert {m["name"] for m in triton["volumeMounts"]}.isdisjoint({workloads.IDENTITY_VOLUME, workloads.KEYS_VOLUME})
    assert template["spec"]["serviceAccountName"] == "hotset-worker" and template["spec"]["automountServiceAccountToken"] is False
    # what the operator sets, the worker reads
    from hotset_worker import main

    settings = main.parse_settings([], {k: v for k, v in env.items() if v is not None})
    assert settings.trusted_callers == ("system:serviceaccount:ml:hotset-router",
                                        "system:serviceaccount:ml:hotset-operator")
    assert (settings.caller_keys, settings.api_token) == (Path(identity.KEYS_DIR), "")
    # identity off (stand-in pods in tests): none of it
    plain = workloads.build_worker_pod_template(_config(), None, [])
    assert workloads.IDENTITY_VOLUME not in {v["name"] for v in plain["spec"]["volumes"]}


def test_the_sidecar_outlives_the_workers_drain() -> None:
    triton = _containers(workloads.build_worker_pod_template(_config(), None, []))[workloads.TRITON_CONTAINER]
    command = " ".join(triton["lifecycle"]["preStop"]["exec"]["command"])
    assert f"/models/{workloads.WORKER_RUNNING_MARKER}" in command
    from hotset_worker.main import RUNNING_MARKER
    assert RUNNING_MARKER == workloads.WORKER_RUNNING_MARKER


def test_worker_pods_serve_oip_v2_over_grpc_on_a_named_port_unless_it_is_off() -> None:
    worker = _containers(workloads.build_worker_pod_template(_config(), None, []))["hotset-worker"]
    assert {"name": "grpc", "containerPort": 8081, "protocol": "TCP"} in worker["ports"]
    assert {"name": "HOTSET_GRPC_PORT", "value": "8081"} in worker["env"]  # the worker names it in /status
    off = _containers(workloads.build_worker_pod_template(_config(worker_grpc_port=0), None, []))["hotset-worker"]
    assert [p["name"] for p in off["ports"]] == ["http"]
    assert "HOTSET_GRPC_PORT" not in {e["name"] for e in off["env"]}
