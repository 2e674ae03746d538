"""Operator settings: images, pool sizing and pod resources, from Helm values.

Built once in main() (command line and environment) and handed to the
handlers; nothing reads the environment at import time.
"""
from __future__ import annotations

import enum
import json
import os
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hotset_common import model_series, quantity, wire
from hotset_common.budget import BudgetMode
from hotset_common.spec import Scheduling
from hotset_common.worker_identity import WorkerIdentity
from hotset_common.worker_ownership import WorkerTrust

ENV_PREFIX = "HOTSET_OPERATOR_"


class GpuMode(str, enum.Enum):
    """How worker pods get GPUs (the chart's workers.gpu.mode; docs/operator.md, "GPUs")."""

    DEVICE_PLUGIN = "devicePlugin"  # an extended resource (nvidia.com/gpu) per container: most GPU clusters have it
    DRA = "dra"  # one pod-level ResourceClaim that the worker and its Triton sidecar share (Kubernetes >= 1.34)
    NONE = "none"  # CPU-only clusters


class TritonSidecar(str, enum.Enum):
    """Which worker pods run the Triton sidecar (the chart's workers.triton.sidecar, a WorkerPool's
    spec.tritonSidecar): it requests CPU and memory of its own on every pod that has it."""

    AUTO = "auto"  # where Triton models are: a dedicated group of a triton model, a pool serving one
    ALWAYS = "always"  # every worker pod (a pool's pods never roll when Triton models come and go)
    NEVER = "never"  # no pod: triton models cannot load (503 naming the missing sidecar)


class PoolMode(str, enum.Enum):
    """Where a namespace's shared models run (the chart's workers.pool.mode)."""

    SHARED = "shared"  # one pool, in the operator's namespace, for every watched namespace
    NAMESPACE = "namespace"  # a pool per namespace, in that namespace (its pods count against its quota)


class Autoscaling(str, enum.Enum):
    """Who sets a WorkerPool's spec.replicas (the chart's workers.pool.autoscaling)."""

    OPERATOR = "operator"  # the operator, from placements that do not fit and saturated copies
    EXTERNAL = "external"  # the HPA or KEDA, through the WorkerPool's scale subresource


class PickerFailureMode(str, enum.Enum):
    """What the gateway does when the endpoint picker does not answer (an InferencePool's
    spec.endpointPickerRef.failureMode; the chart's inferencePool.failureMode)."""

    FAIL_CLOSE = "FailClose"  # the request fails
    FAIL_OPEN = "FailOpen"  # the gateway picks a pod itself


ALL_NAMESPACES = "*"


class OperatorConfig(BaseModel):
    """Everything the pod and pool builders need besides the ServedModel itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field("default", description="namespace of the shared pool (the operator's own)")
    worker_image: str = "ghcr.io/hotset/worker:0.1.0"
    triton_image: str = "nvcr.io/nvidia/tritonserver:24.10-py3"
    image_pull_policy: str = "IfNotPresent"
    gpu_mode: GpuMode = Field(GpuMode.DEVICE_PLUGIN, description="how worker pods get GPUs")
    gpus_per_pod: int = Field(1, ge=0, description="devicePlugin: the worker container's GPUs (dra: the claim "
                                                   "template, rendered by the chart, holds the count)")
    triton_gpus: int = Field(0, ge=0, description="devicePlugin: the Triton sidecar's own GPUs (0: it runs on the CPU)")
    gpu_resource: str = Field("nvidia.com/gpu", description="devicePlugin: the extended resource name")
    gpu_claim_template: str = Field("hotset-worker-gpu", description="dra: the ResourceClaimTemplate every "
                                                                         "worker pod claims its GPUs from")
    gpu_shared_memory: int = Field(2 * 2**30, ge=0, description="GPU pods: bytes of the memory-backed /dev/shm "
                                   "the worker container gets (NCCL and vLLM's tensor-parallel workers exchange "
                                   "through it; a container's default is 64 MiB); 0: none")
    pod_memory_budget: int = Field(16 * 2**30, gt=0, description="bytes of model memory per worker pod")
    pod_budget_mode: BudgetMode = Field(BudgetMode.AUTO, description="how worker pods keep the budget: hard "
                                        "(never passed), load-first, or auto (hard on a GPU)")
    worker_cpu: str = "2"
    worker_memory: str = "24Gi"
    triton_cpu: str = "2"
    triton_memory: str = "8Gi"
    worker_port: int = 8080
    worker_grpc_port: int = Field(wire.GRPC_PORT, ge=0, le=65535, description="where worker pods serve OIP v2 "
                                  "over gRPC (the router forwards gRPC calls there); 0: they serve none")
    worker_scheduling: Scheduling = Field(default_factory=Scheduling, description="where worker pods may run "
                                          "(the chart's workers.scheduling); a WorkerPool's or a dedicated "
                                          "ServedModel's spec.scheduling overrides it field by field")
    worker_network_rules: dict[str, Any] = Field(
        default_factory=dict, description="the worker pods' NetworkPolicy rules (the chart's networkPolicy, "
        "rendered once: `ingress` and `egress` lists whose peers name the release namespace), applied "
        "beside every worker Deployment; empty: the operator writes no NetworkPolicy")
    inference_pool_picker: str = Field("", description="the Gateway API Inference Extension endpoint picker's "
                                       "Service, in each model's namespace, that the InferencePool of every "
                                       "dedicated vllm group names; empty: no InferencePools (the chart's "
                                       "inferencePool.endpointPicker)")
    inference_pool_picker_port: int = Field(9002, ge=1, le=65535, description="that Service's port (gRPC ext-proc)")
    inference_pool_failure_mode: PickerFailureMode = PickerFailureMode.FAIL_CLOSE
    worker_gateway_port: int = Field(8082, ge=1, le=65535, description="where those groups' pods serve the "
                                     "gateway (the worker's --gateway-port): the InferencePool's target port")
    triton_sidecar: TritonSidecar = Field(TritonSidecar.AUTO, description="which worker pods run the Triton "
                                          "sidecar; a WorkerPool's spec.tritonSidecar overrides it")
    pool_name: str = "hotset-pool"
    pool_min_pods: int = Field(1, ge=0)
    pool_max_pods: int = Field(8, ge=0)
    worker_service_account: str = Field("", description="worker pods' ServiceAccount; empty: the namespace default")
    model_claims: tuple[str, ...] = Field((), description="PVCs mounted read-only into worker pods for pvc:// sources")
    router_url: str = ""
    owner_deployment: str = Field("", description="the operator's own Deployment, made owner of the pool "
                                  "and the model store so that uninstalling the chart removes them")
    # The catalog feed worker pods follow (docs/architecture.md, "The catalog"): where the operator
    # serves it, and the base URL pods are given (empty: the chart's Service, hotset-operator).
    catalog_host: str = "0.0.0.0"
    catalog_port: int = Field(8090, ge=0, le=65535, description="0: an ephemeral port (tests)")
    catalog_url: str = Field("", description="base URL of the feed as worker pods reach it")
    report_timeout_s: float = Field(2.0, gt=0, description="longest wait for one worker pod's /status")
    worker_trust: WorkerTrust = Field(WorkerTrust.OWNED, description="which labelled pods are workers, asked for "
                                      "reports and sent the token: owned (pods of the operator's Deployments), "
                                      "labelled (any pod with the worker labels: test stand-ins)")
    write_concurrency: int = Field(8, ge=1, description="status writes in flight at once")
    watch_namespaces: tuple[str, ...] = Field((), description="namespaces whose ServedModels are served; "
                                              "empty: the operator's own; ('*',): every namespace")
    pool_mode: PoolMode = PoolMode.SHARED
    pool_autoscaling: Autoscaling = Autoscaling.OPERATOR
    pool_sync_interval_s: float = Field(2.0, gt=0, description="how often each pool is converged")
    scale_down_delay_s: float = Field(60.0, ge=0, description="a smaller pool must suffice this long before it shrinks")
    drain_timeout_s: float = Field(120.0, ge=0, description="longest wait for a pod's copies to move off it")
    target_inflight_per_copy: float = Field(4.0, gt=0, description="in-flight + queued requests a copy serves before "
                                            "another is wanted (the router's replicate-inflight-per-copy)")
    queue_wait_s: float = Field(1.0, ge=0, description="a model whose requests wait this long for room is wanted")
    metrics_port: int = Field(0, ge=0, description="Prometheus /metrics port; 0: none")
    # Trust (docs/security.md): how worker pods and their callers prove who they are (per-pod
    # ServiceAccount tokens; hotset_common.worker_identity) and the operator's own token for workers;
    # file:// roots and Triton backends.
    worker_identity: WorkerIdentity = Field(WorkerIdentity.NONE, description="pod-token (the chart): worker pods "
                                            "verify the router's and the operator's ServiceAccount tokens and "
                                            "prove which pod they are before they are asked anything; none: "
                                            "neither (tests with stand-in pods)")
    worker_token_file: str = Field("", description="the operator's own ServiceAccount token for workers (a projected "
                                   "token for the audience hotset-worker), read again as the kubelet rotates it")
    file_roots: tuple[str, ...] = Field((), description="folders file:// sources may name; empty: pvc:// only")
    triton_backends: tuple[str, ...] = Field(("onnxruntime", "tensorrt", "pytorch", "tensorflow", "openvino"),
                                             description="Triton backends models may use (python runs the model's code)")
    # Remote model sources (docs/frameworks.md, "Model sources"): the pool's defaults, the source
    # policy checked at admission, the pods' source cache, oci:// image volumes, credentials.
    source_endpoints: tuple[str, ...] = Field((), description="endpoints remote sources may use (host, *.domain, "
                                              "or http://host:port to allow plain http); empty: any https endpoint")
    s3_endpoint: str = Field("", description="the pool's S3 endpoint for s3:// sources naming none; empty: AWS")
    s3_region: str = ""
    s3_path_style: bool = True
    hf_endpoint: str = Field("", description="a Hugging Face hub mirror for hf:// sources; empty: the public hub")
    source_cache_bytes: int = Field(20 * 2**30, gt=0, description="each pod's (or node's) source cache budget")
    source_cache_host_path: str = Field("", description="a node folder for the source cache, shared by the node's "
                                        "worker pods (writable by uid 1000); empty: an emptyDir per pod")
    image_volumes: bool = Field(True, description="oci:// sources as image volumes (Kubernetes ImageVolume); "
                                "off: oci:// sources are refused at admission")
    oci_pull_policy: str = Field("IfNotPresent", description="how kubelets pull oci:// sources' images "
                                 "(workers.sources.oci.pullPolicy; the images' own pullPolicy is for hotset's)")
    source_credentials_secret: str = Field("hotset-source-credentials", description="the Secret the operator "
                                           "writes, per pool namespace, with the credentials its models name")
    # Overreach bound: the pods of all dedicated groups together.
    max_dedicated_pods: int = Field(16, ge=0)
    drain_seconds: int = Field(5, ge=0)
    # Per-model metric series each worker pod keeps (the chart's workers.metrics): at thousands of
    # models the pods' series, not the models, are what a Prometheus pays for (docs/worker.md,
    # "Metrics at any catalog size").
    worker_max_model_series: int = Field(model_series.DEFAULT_MAX_MODEL_SERIES, ge=0, description="models with "
                                         "per-model metric series on each worker pod at once, by recent use")
    worker_model_series_idle_s: float = Field(model_series.DEFAULT_SERIES_IDLE_S, gt=0, description="a model's "
                                              "series on a worker pod go after this long without a request")
    startup_probe_failure_threshold: int = Field(120, ge=1, description="x 5 s: slow first loads")
    require_owner: bool = Field(False, description="every ServedModel names spec.owner and spec.oncall "
                                "(policy.requireOwner; a namespace's ModelQuota can require it too)")
    require_approval: bool = Field(False, description="every ServedModel generation is served only once an "
                                   "identity allowed to update servedmodels/approval approved it "
                                   "(policy.requireApproval; a namespace's ModelQuota can require it too)")

    @field_validator("pod_memory_budget", "source_cache_bytes", "gpu_shared_memory", mode="before")
    @classmethod
    def _parse_budget(cls, value: Any) -> int:
        return quantity.parse_bytes(value)

    @property
    def gpu_pods(self) -> bool:
        """Whether worker pods get GPUs."""
        return self.gpu_mode is not GpuMode.NONE and self.gpus_per_pod > 0

    @model_validator(mode="after")
    def _budget_fits_the_container(self) -> "OperatorConfig":
        """On CPU pods the models live in the worker container's memory: a budget that is not
        below its memory limit would have the kernel OOM-kill the worker before eviction starts."""
        if not self.gpu_pods and self.pod_memory_budget >= quantity.parse_bytes(self.worker_memory):
            raise ValueError(
                f"workers.memoryBudget ({quantity.format_bytes(self.pod_memory_budget)}) must be below "
                f"workers.resources.worker.memory ({self.worker_memory}), the worker container's memory "
                "limit, on CPU worker pods (workers.gpu.mode: none): models are held in that container's memory")
        return self

    @model_validator(mode="after")
    def _gateway_port_is_free(self) -> "OperatorConfig":
        """The gateway port shares the pod's network with the worker's own ports and the sidecar's."""
        taken = {self.worker_port: "workers.port", self.worker_grpc_port: "workers.grpcPort",
                 wire.TRITON_HTTP_PORT: "the Triton sidecar's HTTP port", wire.TRITON_GRPC_PORT: "its gRPC port",
                 wire.TRITON_METRICS_PORT: "its metrics port"}
        if self.inference_pool_picker and self.worker_gateway_port in taken:
            raise ValueError(f"inferencePool.gatewayPort {self.worker_gateway_port} is {taken[self.worker_gateway_port]} "
                             "of every worker pod; choose another")
        return self

    @property
    def publishes_inference_pools(self) -> bool:
        return bool(self.inference_pool_picker)

    @model_validator(mode="after")
    def _identity_needs_an_account(self) -> "OperatorConfig":
        """Worker pods prove themselves with tokens of the workers' ServiceAccount, which the router
        and the operator check by name: it must be named."""
        if self.worker_identity is WorkerIdentity.POD_TOKEN and not self.worker_service_account:
            raise ValueError("worker_identity pod-token needs worker_service_account (the chart: hotset-worker)")
        return self

    @field_validator("worker_scheduling", "worker_network_rules", mode="before")
    @classmethod
    def _parse_json(cls, value: Any) -> Any:
        """The chart passes workers.scheduling and the worker network rules as JSON
        (HOTSET_OPERATOR_WORKER_SCHEDULING, HOTSET_OPERATOR_WORKER_NETWORK_RULES)."""
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @field_validator("model_claims", "watch_namespaces", "file_roots", "triton_backends", "source_endpoints", mode="before")
    @classmethod
    def _split_claims(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(c.strip() for c in value.split(",") if c.strip())
        return value

    @property
    def all_namespaces(self) -> bool:
        return ALL_NAMESPACES in self.watch_namespaces

    def served_namespaces(self) -> list[str]:
        """The namespaces kopf watches (empty list: every namespace): the operator's own is always one."""
        if self.all_namespaces:
            return []
        return sorted({self.namespace, *self.watch_namespaces})

    def catalog_base_url(self) -> str:
        """What worker pods are told to follow: the chart's operator Service unless set."""
        return (self.catalog_url or f"http://hotset-operator.{self.namespace}.svc:{self.catalog_port}").rstrip("/")

    def pool_namespace(self, model_namespace: str) -> str:
        """Where the pool that runs a namespace's shared models lives."""
        return model_namespace if self.pool_mode is PoolMode.NAMESPACE else self.namespace

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "OperatorConfig":
        """Read HOTSET_OPERATOR_<FIELD> variables (set by the Helm chart); overrides win."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            key = ENV_PREFIX + name.upper()
            if key in environ:
                values[name] = environ[key]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
