"""Pure builders for the objects the operator owns: worker pod templates and Deployments.

Each takes the settings and a spec and returns a plain dict, so tests can read
exactly what the API server will receive, and the handlers stay thin.

A worker pod is two containers sharing an emptyDir at /models:
- ``modelplane-worker``: the pod's HTTP API, in-process frameworks, the model
  manager; it writes Triton model folders into /models;
- ``triton``: ``tritonserver --model-control-mode=explicit --model-repository=/models``,
  listening on localhost only, so load/unload never leave the pod.

GPUs (``OperatorConfig.gpu_mode``): with Dynamic Resource Allocation the pod
claims its devices once (``resourceClaims``, from the chart's
ResourceClaimTemplate) and both containers name that one claim, so the
worker and Triton see the same GPU(s). With the device plugin each container
requests its own count, and gets devices of its own.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Sequence

from modelplane_common import labels
from modelplane_common.spec import API_VERSION, KIND, ModelSpec, Placement
from modelplane_operator import kinds
from modelplane_operator.config import GpuMode, OperatorConfig

WORKER_CONTAINER = "modelplane-worker"
TRITON_CONTAINER = "triton"
MODEL_REPOSITORY = "/models"
SOURCE_ROOT = "/mnt/models"
MODEL_STORE_DIR = "/etc/modelplane"
MODEL_STORE_KEY = "models.json"
TRITON_HTTP_PORT = 8000
TRITON_GRPC_PORT = 8001
TRITON_METRICS_PORT = 8002
RUN_AS_USER = 1000
MANAGER = "modelplane-operator"
SPEC_HASH = "modelplane.io/spec-hash"
GPU_CLAIM = "gpu"  # dra: the pod's one ResourceClaim, named by both containers
# On worker pods: the model-store ConfigMap's resourceVersion they were last told of.
STORE_VERSION = "modelplane.io/model-store-version"
TOKEN_KEY = "token"  # the key of the workers' API token in its Secret
# The worker keeps this file in /models while it runs (modelplane_worker.main.RUNNING_MARKER):
# Triton's preStop waits for it to go, so the sidecar outlives the worker's drain.
WORKER_RUNNING_MARKER = ".modelplane-worker-running"


def dedicated_name(model: str) -> str:
    """Name of the Deployment that pins `model` (a ServedModel name is at most 63 characters)."""
    return f"{model}-dedicated"


def worker_labels(dedicated_to: str | None = None) -> dict[str, str]:
    """Labels on every worker pod: the worker's own, and its pool's (the shared pool, or the
    dedicated group of `dedicated_to`); a pool's Deployment selects exactly these."""
    return {labels.PART_OF: labels.PROJECT, labels.COMPONENT: labels.WORKER, **labels.pool_labels(dedicated_to)}


def _http_probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
            "timeoutSeconds": 3, "failureThreshold": failures}


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def _resources(config: OperatorConfig, cpu: str, memory: str, device_plugin_gpus: int) -> dict[str, Any]:
    """CPU and memory, and the container's GPUs: the pod's shared claim (dra) or its own count (devicePlugin)."""
    limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if config.gpu_mode is GpuMode.DEVICE_PLUGIN and device_plugin_gpus:
        limits[config.gpu_resource] = str(device_plugin_gpus)
    resources: dict[str, Any] = {"requests": dict(limits), "limits": limits}
    if config.gpu_mode is GpuMode.DRA:
        resources["claims"] = [{"name": GPU_CLAIM}]
    return resources


def pod_resource_claims(config: OperatorConfig) -> list[dict[str, Any]]:
    """dra: the one claim per pod, made by Kubernetes from the chart's ResourceClaimTemplate."""
    if config.gpu_mode is not GpuMode.DRA:
        return []
    return [{"name": GPU_CLAIM, "resourceClaimTemplateName": config.gpu_claim_template}]


def source_roots(config: OperatorConfig) -> str:
    """``claim=/mnt/models/claim,...``: where each pvc:// claim is mounted in the worker."""
    return ",".join(f"{claim}={SOURCE_ROOT}/{claim}" for claim in config.model_claims)


def build_worker_container(config: OperatorConfig, pinned: Sequence[str]) -> dict[str, Any]:
    """The worker: readiness = Triton ready AND pinned models loaded; liveness never depends on a model."""
    env = [
        {"name": "MODELPLANE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MODELPLANE_HOST", "value": "0.0.0.0"},
        {"name": "MODELPLANE_PORT", "value": str(config.worker_port)},
        {"name": "MODELPLANE_PINNED_MODELS", "value": ",".join(pinned)},
        {"name": "MODELPLANE_MEMORY_BUDGET", "value": str(config.pod_memory_budget)},
        {"name": "MODELPLANE_TRITON_URL", "value": f"127.0.0.1:{TRITON_HTTP_PORT}"},
        {"name": "MODELPLANE_TRITON_REPOSITORY", "value": MODEL_REPOSITORY},
        {"name": "MODELPLANE_MODEL_STORE", "value": f"{MODEL_STORE_DIR}/{MODEL_STORE_KEY}"},
        {"name": "MODELPLANE_SOURCE_ROOTS", "value": source_roots(config)},
        # What a ServedModel may make the pod run (docs/security.md): file:// only under these
        # folders, Triton models only on these backends.
        {"name": "MODELPLANE_FILE_ROOTS", "value": ",".join(config.file_roots)},
        {"name": "MODELPLANE_TRITON_BACKENDS", "value": ",".join(config.triton_backends)},
        {"name": "MODELPLANE_DRAIN_SECONDS", "value": str(config.drain_seconds)},
        {"name": "HOME", "value": "/tmp"},
    ]
    if config.worker_token_secret:  # only the router and the operator hold it
        env.append({"name": "MODELPLANE_API_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": config.worker_token_secret, "key": TOKEN_KEY}}})
    mounts = [{"name": "model-repository", "mountPath": MODEL_REPOSITORY},
              {"name": "model-store", "mountPath": MODEL_STORE_DIR, "readOnly": True},
              {"name": "worker-tmp", "mountPath": "/tmp"}]
    mounts += [{"name": f"claim-{claim}", "mountPath": f"{SOURCE_ROOT}/{claim}", "readOnly": True}
               for claim in config.model_claims]
    return {
        "name": WORKER_CONTAINER,
        "image": config.worker_image,
        "imagePullPolicy": config.image_pull_policy,
        "command": ["modelplane-worker"],
        "env": env,
        "ports": [{"name": "http", "containerPort": config.worker_port, "protocol": "TCP"}],
        "readinessProbe": _http_probe("/v2/health/ready", period=5, failures=3),
        "livenessProbe": _http_probe("/v2/health/live", period=10, failures=6),
        # Pinned loads can take minutes: liveness and readiness wait until this passes once.
        "startupProbe": _http_probe("/v2/health/ready", period=5, failures=config.startup_probe_failure_threshold),
        "resources": _resources(config, config.worker_cpu, config.worker_memory, config.gpus_per_pod),
        "securityContext": _container_security(),
        "volumeMounts": mounts,
    }


def build_triton_container(config: OperatorConfig) -> dict[str, Any]:
    """The Triton sidecar: explicit model control, HTTP/gRPC on localhost, metrics for scraping."""
    return {
        "name": TRITON_CONTAINER,
        "image": config.triton_image,
        "imagePullPolicy": config.image_pull_policy,
        "command": [
            "tritonserver",
            "--model-control-mode=explicit",
            f"--model-repository={MODEL_REPOSITORY}",
            "--http-address=127.0.0.1", f"--http-port={TRITON_HTTP_PORT}",
            "--grpc-address=127.0.0.1", f"--grpc-port={TRITON_GRPC_PORT}",
            f"--metrics-port={TRITON_METRICS_PORT}",
            # Strict readiness flaps during explicit loads; the worker judges readiness.
            "--strict-readiness=false",
            "--exit-on-error=false",
        ],
        "ports": [{"name": "triton-metrics", "containerPort": TRITON_METRICS_PORT, "protocol": "TCP"}],
        # Pod deletion signals both containers at once; Triton must keep serving the requests the
        # worker drains, so it stops only once the worker is gone (bounded by the grace period).
        "lifecycle": {"preStop": {"exec": {"command": [
            "/bin/sh", "-c",
            f"i=0; while [ -e {MODEL_REPOSITORY}/{WORKER_RUNNING_MARKER} ] && [ $i -lt 50 ]; do sleep 1; i=$((i+1)); done",
        ]}}},
        "resources": _resources(config, config.triton_cpu, config.triton_memory, config.triton_gpus),
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "model-repository", "mountPath": MODEL_REPOSITORY, "readOnly": True},
                         {"name": "triton-tmp", "mountPath": "/tmp"}],
    }


def store_key(dedicated_to: str | None = None) -> str:
    """The model-store ConfigMap key a pool's pods read: the shared models, or one dedicated model's.
    Keyed by placement, not by name alone: no model name gives the shared pool's key."""
    return MODEL_STORE_KEY if dedicated_to is None else f"dedicated.{dedicated_to}.json"


def build_worker_pod_template(config: OperatorConfig, dedicated_to: str | None, pinned: Sequence[str],
                              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A worker pod: worker + Triton sidecar sharing /models, non-root, GPUs from the settings."""
    volumes: list[dict[str, Any]] = [
        {"name": "model-repository", "emptyDir": {}},
        # Each pool sees only its own models, so the router (which places a model only on pods
        # whose catalog lists it) never puts other models on a dedicated group, nor its model on the pool.
        {"name": "model-store", "configMap": {"name": config.model_store_configmap,
                                              "items": [{"key": store_key(dedicated_to), "path": MODEL_STORE_KEY}]}},
        {"name": "worker-tmp", "emptyDir": {}},
        {"name": "triton-tmp", "emptyDir": {}},
    ]
    volumes += [{"name": f"claim-{claim}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
                for claim in config.model_claims]
    template = {
        "metadata": {"labels": worker_labels(dedicated_to), **({"annotations": annotations} if annotations else {})},
        "spec": {
            # Workers never call the API server: no token in the pod.
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 60,
            "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                                "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [build_worker_container(config, pinned), build_triton_container(config)],
            "volumes": volumes,
        },
    }
    if config.worker_service_account:
        template["spec"]["serviceAccountName"] = config.worker_service_account
    if claims := pod_resource_claims(config):
        template["spec"]["resourceClaims"] = claims
    return template


def _deployment(name: str, namespace: str, dedicated_to: str | None, replicas: int,
                template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**worker_labels(dedicated_to), labels.MANAGED_BY: MANAGER}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": worker_labels(dedicated_to)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": template,
        },
    }


def owner_reference(body: dict[str, Any]) -> dict[str, Any]:
    """Makes Kubernetes garbage-collect a child when its ServedModel goes."""
    meta = body["metadata"]
    return {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def build_dedicated_deployment(spec: ModelSpec, body: dict[str, Any], config: OperatorConfig,
                               replicas: int | None = None) -> dict[str, Any]:
    """A latency-optimized instance group: pods that each pin this one model. `replicas` None: the
    manifest leaves them to the autoscaler's field manager (replicas.min..max on demand)."""
    # A changed spec rolls the group, so its pods load the model as now declared.
    template = build_worker_pod_template(config, dedicated_to=spec.id, pinned=[spec.id],
                                         annotations={SPEC_HASH: spec_hash(spec)})
    deployment = _deployment(dedicated_name(spec.id), body["metadata"]["namespace"], spec.id, replicas or 0, template)
    if replicas is None:
        del deployment["spec"]["replicas"]
    deployment["metadata"]["ownerReferences"] = [owner_reference(body)]
    return deployment


def build_pool_deployment(config: OperatorConfig, replicas: int,
                          owners: Sequence[dict[str, Any]] = (), namespace: str | None = None) -> dict[str, Any]:
    """A shared pool: pods pin nothing; the router places models on them. `owners`: its WorkerPool
    (or the operator's Deployment), so the pool goes with it."""
    template = build_worker_pod_template(config, dedicated_to=None, pinned=[])
    deployment = _deployment(config.pool_name, namespace or config.namespace, None, replicas, template)
    if owners:
        deployment["metadata"]["ownerReferences"] = list(owners)
    return deployment


def pool_selector() -> str:
    """The label selector of a shared pool's pods (a WorkerPool's status.selector, for the HPA)."""
    return ",".join(f"{k}={v}" for k, v in worker_labels(None).items())


def build_worker_pool(config: OperatorConfig, namespace: str, min_pods: int,
                      owners: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The WorkerPool of one namespace's shared pool: its bounds and who scales it (the fields the
    operator owns; spec.replicas belongs to the autoscaler, the operator's or the HPA's)."""
    metadata: dict[str, Any] = {"name": config.pool_name, "namespace": namespace,
                                "labels": {labels.PART_OF: labels.PROJECT, labels.MANAGED_BY: MANAGER}}
    if owners:
        metadata["ownerReferences"] = list(owners)
    return {"apiVersion": kinds.API_VERSION, "kind": kinds.WORKER_POOL, "metadata": metadata,
            "spec": {"minReplicas": min_pods, "maxReplicas": config.pool_max_pods,
                     "autoscaling": config.pool_autoscaling.value}}


# Registry fields workers never read: kept out of the store, whose ConfigMap holds every model.
_NOT_IN_STORE = {"memory_bytes", "labels", "owner", "oncall", "variant_of", "variant_weight"}


def is_ours(found: tuple[list[str], str], uid: str) -> bool:
    """A Deployment (its owner uids and managed-by label, kube.deployment_owners) owned by the
    ServedModel `uid`, or left without owner by this operator (its label says so)."""
    owners, managed_by = found
    return uid in owners or (not owners and managed_by == MANAGER)


def store_entry(spec: ModelSpec) -> dict[str, Any]:
    """One model as the worker's JSON model store reads it (only what workers use)."""
    # replicas.idleSeconds is for the operator and the router; the worker's store (and the spec hash
    # that rolls a dedicated group) stays as it was without it.
    exclude: dict[str, Any] = {name: True for name in _NOT_IN_STORE} | {"replicas": {"idle_seconds"}}
    return spec.model_dump(mode="json", exclude=exclude) | {"memory": spec.memory_bytes}


def store_entry_bytes(spec: ModelSpec) -> int:
    """What `spec` adds to the model-store ConfigMap (its entry, as `_store_document` writes it)."""
    return len(json.dumps(store_entry(spec), indent=1, sort_keys=True)) + 4


def build_disruption_budget(name: str, namespace: str, dedicated_to: str | None,
                            owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """At most one pod of a pool away at a time for voluntary disruptions (drains, upgrades):
    a model's other copies keep serving while one pod drains."""
    budget: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**worker_labels(dedicated_to), labels.MANAGED_BY: MANAGER}},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": worker_labels(dedicated_to)}},
    }
    if owner is not None:
        budget["metadata"]["ownerReferences"] = [owner_reference(owner)]
    return budget


def spec_hash(spec: ModelSpec) -> str:
    return hashlib.sha256(json.dumps(store_entry(spec), sort_keys=True).encode()).hexdigest()[:16]


def _store_document(specs: Iterable[ModelSpec]) -> str:
    entries = [store_entry(spec) for spec in sorted(specs, key=lambda s: s.id)]
    return json.dumps({"models": entries}, indent=1, sort_keys=True)


def build_model_store_configmap(specs: Iterable[ModelSpec], config: OperatorConfig,
                                owners: Sequence[dict[str, Any]] = (), namespace: str | None = None,
                                dedicated: Iterable[ModelSpec] | None = None) -> dict[str, Any]:
    """The catalogs worker pods of one namespace mount as their model store: one key for its shared
    pool's models (`specs`' shared ones), one per dedicated model there holding only that model
    (`dedicated`, default: `specs`' dedicated ones)."""
    specs = list(specs)
    dedicated = [s for s in specs if s.placement is Placement.DEDICATED] if dedicated is None else list(dedicated)
    data = {MODEL_STORE_KEY: _store_document(s for s in specs if s.placement is Placement.SHARED)}
    data.update({store_key(s.id): _store_document([s]) for s in dedicated})
    metadata: dict[str, Any] = {"name": config.model_store_configmap, "namespace": namespace or config.namespace,
                                "labels": {labels.PART_OF: labels.PROJECT, labels.MANAGED_BY: MANAGER}}
    if owners:
        metadata["ownerReferences"] = list(owners)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}
