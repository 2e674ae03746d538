"""Pure builders for the objects the operator owns: worker pod templates and Deployments.

Each takes the settings and a spec and returns a plain dict, so tests can read
exactly what the API server will receive, and the handlers stay thin.

A worker pod is two containers sharing an emptyDir at /models:
- ``hotset-worker``: the pod's HTTP API, in-process frameworks, the model
  manager; it writes Triton model folders into /models;
- ``triton``: ``tritonserver --model-control-mode=explicit --model-repository=/models``,
  listening on localhost only, so load/unload never leave the pod. Only pods
  that may hold Triton models have it (``TritonSidecar``). It runs under a small
  shell loop that starts tritonserver again when it exits, so a Triton crash
  never stops the container: the pod stays Ready and in the router's map, and
  only its Triton models are unready until the worker loads them again.

GPUs (``OperatorConfig.gpu_mode``): with the device plugin (the default) each
container requests its own count of ``nvidia.com/gpu`` and gets devices of its
own. With Dynamic Resource Allocation the pod claims its devices once
(``resourceClaims``, from the chart's ResourceClaimTemplate) and both
containers name that one claim, so the worker and Triton see the same GPU(s).

Scheduling (``Scheduling``): the chart's ``workers.scheduling`` for every
worker pod, then a WorkerPool's ``spec.scheduling`` for its pool's pods or a
dedicated ServedModel's for its group, field by field (``Scheduling.over``).
All of it is decided here, in the pod template.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from typing import Any, Iterable, Mapping, Sequence

import pydantic

from hotset_common import labels, model_store, worker_identity as identity
from hotset_common import sources as locations
from hotset_common.spec import API_VERSION, KIND, Framework, ModelSpec, Placement, Scheduling, with_variants
from hotset_common.wire import TRITON_GRPC_PORT, TRITON_HTTP_PORT, TRITON_METRICS_PORT
from hotset_common.worker_settings import WorkerOption as Opt
from hotset_operator import kinds
from hotset_operator.config import GpuMode, OperatorConfig, TritonSidecar

log = logging.getLogger(__name__)

WORKER_CONTAINER = "hotset-worker"
TRITON_CONTAINER = "triton"
MODEL_REPOSITORY = "/models"
SOURCE_ROOT = "/mnt/models"
GATEWAY_PORT_NAME = "gateway"  # the worker container's port for an Inference Extension gateway
RUN_AS_USER = 1000
MANAGER = labels.OPERATOR_MANAGER
SPEC_HASH = "hotset.io/spec-hash"
GPU_CLAIM = "gpu"  # dra: the pod's one ResourceClaim, named by both containers
IDENTITY_VOLUME = "hotset-tokens"  # the worker's projected identity and catalog tokens
KEYS_VOLUME = "issuer-keys"  # the cluster's ServiceAccount issuer and keys (identity.KEYS_CONFIGMAP)
SHARED_MEMORY = "dshm"  # GPU pods: the worker container's /dev/shm
# Remote sources (docs/frameworks.md, "Model sources"): the pod's source cache (both containers:
# Triton reads cached Triton models in place), oci:// image volumes, the credentials Secret.
SOURCE_CACHE = "/var/cache/hotset/sources"
OCI_ROOT = "/mnt/oci"
SOURCE_CREDENTIALS = "/var/run/hotset/source-credentials"
# The worker keeps this file in /models while it runs (hotset_worker.main.RUNNING_MARKER):
# Triton's preStop waits for it to go, so the sidecar outlives the worker's drain.
WORKER_RUNNING_MARKER = ".hotset-worker-running"
# Where the sidecar's loop writes tritonserver's pid (its /tmp emptyDir): `kill $(cat ...)` is a Triton crash.
TRITON_PID_FILE = "/tmp/tritonserver.pid"
# The sidecar's PID 1: run tritonserver ("$@"), start it again when it exits (after 1 s, doubling to
# 30 s while it keeps failing within a minute), and on SIGTERM stop it and exit. POSIX sh (dash,
# busybox, bash): NVIDIA's Triton image and the CPU one both have it. tests/hotset_testing/triton.py
# runs the same loop around a real tritonserver.
# The line the loop logs each time tritonserver exits (what operators grep for, and the kind tier waits on).
TRITON_RESTART_LINE = "hotset: tritonserver exited"
TRITON_SUPERVISOR = f"""\
pidfile=${{HOTSET_TRITON_PID_FILE:-{TRITON_PID_FILE}}}
child=
stop() {{ trap - TERM INT; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null; [ -n "$child" ] && wait "$child"; exit 0; }}
trap stop TERM INT
delay=1
while :; do
  started=$(date +%s)
  "$@" &
  child=$!
  echo "$child" > "$pidfile"
  wait "$child"
  code=$?
  [ $(( $(date +%s) - started )) -ge 60 ] && delay=1
  echo "{TRITON_RESTART_LINE} with status $code; starting it again in $delay s" >&2
  sleep "$delay"
  delay=$(( delay * 2 > 30 ? 30 : delay * 2 ))
done
"""


@dataclasses.dataclass(frozen=True)
class PoolPods:
    """What a WorkerPool's spec says about its pods (the fields users own; the operator applies only
    the size bounds): where they may run and whether they run the Triton sidecar. Unset: the chart's."""

    scheduling: Scheduling = dataclasses.field(default_factory=Scheduling)
    triton_sidecar: TritonSidecar | None = None

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> "PoolPods":
        """From a WorkerPool's spec; a part that does not parse (the CRD's schema makes that rare)
        is left to the chart's value, and logged."""
        try:
            scheduling = Scheduling.model_validate(spec.get("scheduling") or {})
        except pydantic.ValidationError as exc:
            log.error("WorkerPool spec.scheduling ignored: %s", exc)
            scheduling = Scheduling()
        sidecar = spec.get("tritonSidecar")
        try:
            return cls(scheduling, TritonSidecar(sidecar) if sidecar else None)
        except ValueError:
            log.error("WorkerPool spec.tritonSidecar %r ignored: not auto, always or never", sidecar)
            return cls(scheduling)


def pool_has_triton_sidecar(config: OperatorConfig, pods: PoolPods, serves_triton_models: bool) -> bool:
    """Whether a shared pool's pods run the sidecar: its WorkerPool's choice, else the chart's; auto:
    while the pool serves a Triton model (its pods roll when the first arrives and when the last goes)."""
    mode = pods.triton_sidecar or config.triton_sidecar
    return mode is TritonSidecar.ALWAYS or (mode is TritonSidecar.AUTO and serves_triton_models)


def dedicated_has_triton_sidecar(config: OperatorConfig, spec: ModelSpec) -> bool:
    """Whether a dedicated group's pods run the sidecar: auto, only for a Triton model."""
    mode = config.triton_sidecar
    return mode is TritonSidecar.ALWAYS or (mode is TritonSidecar.AUTO and spec.framework is Framework.TRITON)


def serves_gateway(config: OperatorConfig, spec: ModelSpec) -> bool:
    """Whether `spec`'s dedicated group is published as an InferencePool (the chart's inferencePool):
    a vllm model's, when the chart names an endpoint picker. Its pods then also serve the gateway
    port, and the pool selects them."""
    return (config.publishes_inference_pools and spec.placement is Placement.DEDICATED
            and spec.framework is Framework.VLLM)


def dedicated_name(model: str) -> str:
    """Name of the Deployment that pins `model` (a ServedModel name is at most 63 characters)."""
    return f"{model}-dedicated"


def worker_labels(dedicated_to: str | None = None) -> dict[str, str]:
    """Labels on every worker pod: the worker's own, and its pool's (the shared pool, or the
    dedicated group of `dedicated_to`); a pool's Deployment selects exactly these."""
    return {labels.PART_OF: labels.PROJECT, labels.COMPONENT: labels.WORKER, **labels.pool_labels(dedicated_to)}


STARTUP_PROBE_PERIOD_S = 5
STARTUP_MARGIN_S = 60  # a worker's own start before its pinned load begins (imports, the sidecar)


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


def catalog_store(dedicated_to: str | None = None) -> str:
    """The catalog a pool's pods follow: the shared pool's, or one dedicated model's. Keyed by
    placement, not by name alone: no model name gives the shared pool's catalog."""
    return "pool" if dedicated_to is None else f"dedicated/{dedicated_to}"


def catalog_url(config: OperatorConfig, namespace: str, dedicated_to: str | None = None) -> str:
    """The feed a pool's pods follow (``HOTSET_CATALOG_URL``): the operator's, for their pool."""
    return f"{config.catalog_base_url()}{model_store.FEED_PATH}/{namespace}/{catalog_store(dedicated_to)}"


def oci_images(specs: Iterable[ModelSpec]) -> list[locations.OciImage]:
    """The oci:// sources of `specs` (and their canaries), each once, in a stable order: the image
    volumes their pods mount."""
    found: dict[str, locations.OciImage] = {}
    for spec in with_variants(list(specs)):
        if locations.scheme_of(spec.source) == "oci":
            image = locations.parse(spec.source)
            assert isinstance(image, locations.OciImage)
            found[locations.oci_mount_name(image)] = image
    return [found[name] for name in sorted(found)]


def _source_env(config: OperatorConfig) -> list[dict[str, Any]]:
    return [
        Opt.SOURCE_CACHE.variable(SOURCE_CACHE),
        Opt.SOURCE_CACHE_BYTES.variable(config.source_cache_bytes),
        Opt.S3_ENDPOINT.variable(config.s3_endpoint),
        Opt.S3_REGION.variable(config.s3_region),
        Opt.S3_PATH_STYLE.variable("on" if config.s3_path_style else "off"),
        Opt.HF_ENDPOINT.variable(config.hf_endpoint),
        Opt.OCI_ROOT.variable(OCI_ROOT),
        Opt.OCI_IMAGE_VOLUMES.variable("on" if config.image_volumes else "off"),
        Opt.OCI_PLAIN_HTTP.variable(",".join(locations.plain_http_registries(config.source_endpoints))),
        Opt.SOURCE_CREDENTIALS.variable(SOURCE_CREDENTIALS),
    ]


def _image_mounts(images: Sequence[locations.OciImage]) -> list[dict[str, Any]]:
    return [{"name": locations.oci_mount_name(image), "mountPath": f"{OCI_ROOT}/{locations.oci_mount_name(image)}",
             "readOnly": True} for image in images]


def source_volumes(config: OperatorConfig, images: Sequence[locations.OciImage]) -> list[dict[str, Any]]:
    """The source cache (a node folder, or an emptyDir of the budget's size per pod), the
    credentials Secret (optional: a pool whose models name none has none), one image volume per
    oci:// source."""
    cache: dict[str, Any] = {"name": "source-cache"}
    if config.source_cache_host_path:
        cache["hostPath"] = {"path": config.source_cache_host_path, "type": "DirectoryOrCreate"}
    else:
        cache["emptyDir"] = {"sizeLimit": str(config.source_cache_bytes + config.source_cache_bytes // 4)}
    volumes = [cache, {"name": "source-credentials",
                       "secret": {"secretName": config.source_credentials_secret, "optional": True,
                                  "defaultMode": 0o440}}]
    volumes += [{"name": locations.oci_mount_name(image),
                 "image": {"reference": image.reference, "pullPolicy": config.oci_pull_policy}} for image in images]
    return volumes


def startup_probe_failures(config: OperatorConfig, load_timeout_s: float | None) -> int:
    """Start-up probes (every STARTUP_PROBE_PERIOD_S) a worker pod may fail before the kubelet
    restarts it: the chart's value, or for a group pinning a model that declares
    ``loadTimeoutSeconds`` that long plus STARTUP_MARGIN_S for the worker's own start."""
    if load_timeout_s is None:
        return config.startup_probe_failure_threshold
    return math.ceil((load_timeout_s + STARTUP_MARGIN_S) / STARTUP_PROBE_PERIOD_S)


def build_worker_container(config: OperatorConfig, pinned: Sequence[str], namespace: str | None = None,
                           dedicated_to: str | None = None, images: Sequence[locations.OciImage] = (),
                           triton: bool = True, load_timeout_s: float | None = None,
                           gateway: bool = False) -> dict[str, Any]:
    """The worker: readiness = pinned models loaded and serving (a pinned Triton model needs its
    sidecar); liveness never depends on a model. `triton`: whether the pod has the sidecar;
    `load_timeout_s`: the pinned model's own ``loadTimeoutSeconds`` (its start-up probe waits that long);
    `gateway`: also serve an Inference Extension gateway on ``worker_gateway_port`` (``serves_gateway``)."""
    env = [
        {"name": Opt.POD_NAME.env, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        Opt.HOST.variable("0.0.0.0"),
        Opt.PORT.variable(config.worker_port),
        # OIP v2 over gRPC beside HTTP; the worker names the port in its /status, for the router.
        *([Opt.GRPC_PORT.variable(config.worker_grpc_port)] if config.worker_grpc_port else []),
        *([Opt.GATEWAY_PORT.variable(config.worker_gateway_port)] if gateway else []),
        Opt.PINNED.variable(",".join(pinned)),
        Opt.MEMORY_BUDGET.variable(config.pod_memory_budget),
        Opt.BUDGET_MODE.variable(config.pod_budget_mode.value),
        # Without a sidecar the worker has no Triton backend (its Triton models are refused, 503).
        *([Opt.TRITON_URL.variable(f"127.0.0.1:{TRITON_HTTP_PORT}")] if triton else []),
        Opt.TRITON_REPOSITORY.variable(MODEL_REPOSITORY),
        # Its pool's catalog, followed from the operator (docs/architecture.md, "The catalog").
        Opt.CATALOG_URL.variable(catalog_url(config, namespace or config.namespace, dedicated_to)),
        Opt.SOURCE_ROOT.variable(source_roots(config)),
        # What a ServedModel may make the pod run (docs/security.md): file:// only under these
        # folders, Triton models only on these backends.
        Opt.FILE_ROOTS.variable(",".join(config.file_roots)),
        Opt.TRITON_BACKENDS.variable(",".join(config.triton_backends)),
        Opt.DRAIN_SECONDS.variable(config.drain_seconds),
        Opt.MAX_MODEL_SERIES.variable(config.worker_max_model_series),
        Opt.MODEL_SERIES_IDLE_S.variable(f"{config.worker_model_series_idle_s:g}"),
        *_source_env(config),
        {"name": "HOME", "value": "/tmp"},
    ]
    env += identity_env(config)
    mounts = [{"name": "model-repository", "mountPath": MODEL_REPOSITORY},
              {"name": "worker-tmp", "mountPath": "/tmp"},
              {"name": "source-cache", "mountPath": SOURCE_CACHE},
              {"name": "source-credentials", "mountPath": SOURCE_CREDENTIALS, "readOnly": True}]
    mounts += [{"name": f"claim-{claim}", "mountPath": f"{SOURCE_ROOT}/{claim}", "readOnly": True}
               for claim in config.model_claims]
    mounts += _image_mounts(images)
    if shared_memory_volume(config):
        mounts.append({"name": SHARED_MEMORY, "mountPath": "/dev/shm"})
    if identity_volumes(config):
        mounts += [{"name": IDENTITY_VOLUME, "mountPath": identity.TOKENS_DIR, "readOnly": True},
                   {"name": KEYS_VOLUME, "mountPath": identity.KEYS_DIR, "readOnly": True}]
    return {
        "name": WORKER_CONTAINER,
        "image": config.worker_image,
        "imagePullPolicy": config.image_pull_policy,
        "command": ["hotset-worker"],
        "env": env,
        "ports": [{"name": "http", "containerPort": config.worker_port, "protocol": "TCP"},
                  *([{"name": "grpc", "containerPort": config.worker_grpc_port, "protocol": "TCP"}]
                    if config.worker_grpc_port else []),
                  *([{"name": GATEWAY_PORT_NAME, "containerPort": config.worker_gateway_port, "protocol": "TCP"}]
                    if gateway else [])],
        "readinessProbe": _http_probe("/v2/health/ready", period=5, failures=3),
        "livenessProbe": _http_probe("/v2/health/live", period=10, failures=6),
        # Pinned loads can take minutes: liveness and readiness wait until this passes once.
        "startupProbe": _http_probe("/v2/health/ready", period=STARTUP_PROBE_PERIOD_S,
                                    failures=startup_probe_failures(config, load_timeout_s)),
        "resources": _resources(config, config.worker_cpu, config.worker_memory, config.gpus_per_pod),
        "securityContext": _container_security(),
        "volumeMounts": mounts,
    }


def build_triton_container(config: OperatorConfig, images: Sequence[locations.OciImage] = ()) -> dict[str, Any]:
    """The Triton sidecar: explicit model control, HTTP/gRPC on localhost, metrics for scraping."""
    return {
        "name": TRITON_CONTAINER,
        "image": config.triton_image,
        "imagePullPolicy": config.image_pull_policy,
        "command": ["/bin/sh", "-c", TRITON_SUPERVISOR, "triton-supervisor"],
        "args": [
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
        # The source cache and image volumes at the worker's paths: staged models link into them.
        "volumeMounts": [{"name": "model-repository", "mountPath": MODEL_REPOSITORY, "readOnly": True},
                         {"name": "triton-tmp", "mountPath": "/tmp"},
                         {"name": "source-cache", "mountPath": SOURCE_CACHE, "readOnly": True},
                         *_image_mounts(images)],
    }


def trusted_callers(config: OperatorConfig) -> str:
    """The accounts worker pods answer: the router's and the operator's, of the release namespace."""
    return ",".join(f"{config.namespace}:{account}" for account in (identity.ROUTER_ACCOUNT, identity.OPERATOR_ACCOUNT))


def identity_env(config: OperatorConfig) -> list[dict[str, str]]:
    """pod-token: the worker checks its callers' tokens with the cluster's keys and presents tokens of
    its own (docs/security.md, "Workers that prove who they are"); none: nothing."""
    if config.worker_identity is not identity.WorkerIdentity.POD_TOKEN:
        return []
    return [Opt.CALLER_KEYS.variable(identity.KEYS_DIR),
            Opt.TRUSTED_CALLERS.variable(trusted_callers(config)),
            Opt.IDENTITY_TOKEN_FILE.variable(f"{identity.TOKENS_DIR}/{identity.IDENTITY_TOKEN_FILE}"),
            Opt.CATALOG_TOKEN_FILE.variable(f"{identity.TOKENS_DIR}/{identity.CATALOG_TOKEN_FILE}")]


def identity_volumes(config: OperatorConfig) -> list[dict[str, Any]]:
    """pod-token: the pod's own tokens, projected by the kubelet (bound to the pod, each for one
    audience, rewritten before they expire), and the keys ConfigMap the operator writes (optional:
    a pod may start before it; the worker answers 503 until the kubelet has put it there)."""
    if config.worker_identity is not identity.WorkerIdentity.POD_TOKEN:
        return []
    tokens = [{"serviceAccountToken": {"audience": audience, "expirationSeconds": identity.TOKEN_SECONDS,
                                       "path": path}}
              for audience, path in ((identity.IDENTITY_AUDIENCE, identity.IDENTITY_TOKEN_FILE),
                                     (identity.CATALOG_AUDIENCE, identity.CATALOG_TOKEN_FILE))]
    return [{"name": IDENTITY_VOLUME, "projected": {"sources": tokens}},
            {"name": KEYS_VOLUME, "configMap": {"name": identity.KEYS_CONFIGMAP, "optional": True,
                                                "defaultMode": 0o444}}]


def shared_memory_volume(config: OperatorConfig) -> list[dict[str, Any]]:
    """GPU pods: a memory-backed /dev/shm for the worker container. A container's own is 64 MiB;
    NCCL and vLLM's tensor-parallel workers pass tensors through it and fail or crawl in less.
    Its pages count against the container's memory limit as they are used."""
    if not config.gpu_pods or config.gpu_shared_memory == 0:
        return []
    return [{"name": SHARED_MEMORY, "emptyDir": {"medium": "Memory", "sizeLimit": str(config.gpu_shared_memory)}}]


def build_worker_pod_template(config: OperatorConfig, dedicated_to: str | None, pinned: Sequence[str],
                              annotations: dict[str, str] | None = None, namespace: str | None = None,
                              images: Sequence[locations.OciImage] = (), scheduling: Scheduling | None = None,
                              triton: bool = True, load_timeout_s: float | None = None,
                              gateway: bool = False) -> dict[str, Any]:
    """A worker pod: the worker (and, with `triton`, the Triton sidecar sharing /models), non-root,
    GPUs from the settings, placed by `scheduling` over the chart's workers.scheduling.

    Each pool follows only its own catalog, so the router (which places a model only on pods
    whose catalog lists it) never puts other models on a dedicated group, nor its model on the pool.
    With image volumes off the workers pull oci:// sources themselves: `images` mount nothing."""
    if not config.image_volumes:
        images = ()
    volumes: list[dict[str, Any]] = [
        {"name": "model-repository", "emptyDir": {}},
        {"name": "worker-tmp", "emptyDir": {}},
        *([{"name": "triton-tmp", "emptyDir": {}}] if triton else []),
    ]
    volumes += [{"name": f"claim-{claim}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
                for claim in config.model_claims]
    volumes += source_volumes(config, images)
    volumes += shared_memory_volume(config)
    volumes += identity_volumes(config)
    template = {
        "metadata": {"labels": worker_labels(dedicated_to), **({"annotations": annotations} if annotations else {})},
        "spec": {
            # Workers never call the API server: no token for it in the pod (their own tokens are
            # for other audiences: identity_volumes).
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 60,
            "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                                "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [build_worker_container(config, pinned, namespace, dedicated_to, images, triton, load_timeout_s,
                                                  gateway),
                           *([build_triton_container(config, images)] if triton else [])],
            "volumes": volumes,
            **(scheduling or Scheduling()).over(config.worker_scheduling).pod_fields(),
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
    namespace = body["metadata"]["namespace"]
    template = dedicated_pod_template(config, spec, namespace)
    # What the pods run (their model's entry and their template) in one annotation: a change of
    # either rolls the group, and a restart that finds it equal re-applies nothing (group_hash).
    template["metadata"].setdefault("annotations", {})[SPEC_HASH] = _group_hash(spec, template)
    deployment = _deployment(dedicated_name(spec.id), namespace, spec.id, replicas or 0, template)
    if replicas is None:
        del deployment["spec"]["replicas"]
    deployment["metadata"]["ownerReferences"] = [owner_reference(body)]
    return deployment


def dedicated_pod_template(config: OperatorConfig, spec: ModelSpec, namespace: str) -> dict[str, Any]:
    """The pod template of `spec`'s dedicated group under `config`, before its SPEC_HASH."""
    return build_worker_pod_template(config, dedicated_to=spec.id, pinned=[spec.id], namespace=namespace,
                                     images=oci_images([spec]), scheduling=spec.scheduling,
                                     triton=dedicated_has_triton_sidecar(config, spec),
                                     load_timeout_s=spec.load_timeout_seconds,
                                     gateway=serves_gateway(config, spec))


def build_pool_deployment(config: OperatorConfig, replicas: int,
                          owners: Sequence[dict[str, Any]] = (), namespace: str | None = None,
                          images: Sequence[locations.OciImage] = (), pods: PoolPods = PoolPods(),
                          serves_triton_models: bool = True) -> dict[str, Any]:
    """A shared pool: pods pin nothing; the router places models on them. `owners`: its WorkerPool
    (or the operator's Deployment), so the pool goes with it. `images`: its models' oci:// sources
    (``oci_images``), mounted as image volumes: a change of that set rolls the pool's pods. `pods`:
    its WorkerPool's scheduling and sidecar choice; `serves_triton_models`: whether a Triton model
    is among its models."""
    namespace = namespace or config.namespace
    template = build_worker_pod_template(config, dedicated_to=None, pinned=[], namespace=namespace, images=images,
                                         scheduling=pods.scheduling,
                                         triton=pool_has_triton_sidecar(config, pods, serves_triton_models))
    deployment = _deployment(config.pool_name, namespace, None, replicas, template)
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


def is_ours(found: tuple[list[str], str], uid: str) -> bool:
    """A Deployment (its owner uids and managed-by label, kube.deployment_owners) owned by the
    ServedModel `uid`, or left without owner by this operator (its label says so)."""
    owners, managed_by = found
    return uid in owners or (not owners and managed_by == MANAGER)


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


def build_inference_pool(config: OperatorConfig, spec: ModelSpec, body: dict[str, Any]) -> dict[str, Any]:
    """The Gateway API Inference Extension's InferencePool of `spec`'s dedicated group: exactly its
    pods, on their gateway port, routed by the chart's endpoint picker (a Service in the model's
    namespace), owned by the ServedModel (garbage-collected with it). One base model per pool, as the
    extension expects: a dedicated group serves its model and that model's LoRA adapters only."""
    namespace = body["metadata"]["namespace"]
    return {
        "apiVersion": kinds.INFERENCE_POOL_API_VERSION,
        "kind": kinds.INFERENCE_POOL,
        "metadata": {"name": dedicated_name(spec.id), "namespace": namespace,
                     "labels": {**worker_labels(spec.id), labels.MANAGED_BY: MANAGER},
                     "ownerReferences": [owner_reference(body)]},
        "spec": {
            "selector": {"matchLabels": worker_labels(spec.id)},
            "targetPorts": [{"number": config.worker_gateway_port}],
            "endpointPickerRef": {"name": config.inference_pool_picker, "kind": "Service",
                                  "port": {"number": config.inference_pool_picker_port},
                                  "failureMode": config.inference_pool_failure_mode.value},
        },
    }


def build_network_policy(config: OperatorConfig, name: str, namespace: str, dedicated_to: str | None,
                         owner: dict[str, Any]) -> dict[str, Any] | None:
    """The chart's worker network rules (docs/security.md, "Network") beside one worker Deployment:
    only the router and the operator may call its pods, and its pods may reach only cluster DNS,
    the operator's catalog and the model stores the chart names. The chart's own policy covers the
    release namespace; this one makes the rules hold in pool namespaces and for dedicated groups in
    their models' namespaces too, and goes with its owner. None: the chart turned the policy off."""
    rules = config.worker_network_rules
    if not rules:
        return None
    kinds_of_rule = [kind for kind in ("Ingress", "Egress") if kind.lower() in rules]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner],
                     "labels": {**worker_labels(dedicated_to), labels.MANAGED_BY: MANAGER}},
        "spec": {"podSelector": {"matchLabels": worker_labels(dedicated_to)}, "policyTypes": kinds_of_rule,
                 **{kind.lower(): rules[kind.lower()] for kind in kinds_of_rule}},
    }


def _identity_metadata(name: str, namespace: str, owners: Sequence[dict[str, Any]]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace,
                                "labels": {labels.PART_OF: labels.PROJECT, labels.MANAGED_BY: MANAGER}}
    if owners:
        metadata["ownerReferences"] = list(owners)
    return metadata


def build_worker_service_account(config: OperatorConfig, namespace: str,
                                 owners: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The workers' ServiceAccount in a namespace outside the release's where the operator runs worker
    pods (a namespace's own pool, dedicated groups in their models' namespaces): the kubelet projects
    the pods' identity tokens for it, and the router and the operator accept only its tokens, bound
    to the pod. No token for the API server is mounted from it. It goes with the same owners as the
    pods. None: the release namespace (the chart's own), or worker identity off."""
    if config.worker_identity is not identity.WorkerIdentity.POD_TOKEN or namespace == config.namespace:
        return None
    if not config.worker_service_account:
        return None
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": _identity_metadata(config.worker_service_account, namespace, owners),
            "automountServiceAccountToken": False}


def build_issuer_keys(config: OperatorConfig, namespace: str, keys: tuple[str, dict[str, Any]] | None,
                      owners: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The cluster's ServiceAccount issuer and public keys (`keys`: as the API server's discovery
    endpoints publish them) in every namespace with worker pods: the pods mount it and verify their
    callers' tokens with it, so they need no API access. Public data; it goes with the pods'
    owners. None: worker identity off, or no keys read yet."""
    if config.worker_identity is not identity.WorkerIdentity.POD_TOKEN or keys is None:
        return None
    issuer, jwks = keys
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _identity_metadata(identity.KEYS_CONFIGMAP, namespace, owners),
            "data": identity.keys_data(issuer, jwks)}


def group_hash(config: OperatorConfig, spec: ModelSpec, namespace: str) -> str:
    """The SPEC_HASH of `spec`'s dedicated group under `config`: of its model's entry as its pods
    read it and of the pod template the operator writes for it. So an edit of the model (its
    scheduling too), and an operator whose settings changed what the group's pods run (a helm
    upgrade's worker image, workers.scheduling, resources; inferencePool for a vllm group), each
    roll exactly the groups whose pods would differ, and a restart finds the others as they were."""
    return _group_hash(spec, dedicated_pod_template(config, spec, namespace))


def _group_hash(spec: ModelSpec, template: dict[str, Any]) -> str:
    what_runs = {"entry": model_store.store_entry(spec), "template": template}
    return hashlib.sha256(json.dumps(what_runs, sort_keys=True).encode()).hexdigest()[:16]
