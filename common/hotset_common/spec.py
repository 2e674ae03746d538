"""The ServedModel spec as Python types.

One definition serves the worker's ModelStore (standalone JSON or cluster
ServedModels), the router's placement (memory, min/max copies) and the
operator's validation, so they cannot drift apart. The CRD's OpenAPI schema in
``crds/`` mirrors these fields; tests check the two agree.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
from typing import Any, Iterable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hotset_common import labels, quantity
from hotset_common import sources as source_locations

GROUP = "hotset.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ServedModel"
PLURAL = "servedmodels"
SHORT_NAME = "sm"


class Framework(str, enum.Enum):
    TRANSFORMERS = "transformers"
    TORCHVISION = "torchvision"
    TRITON = "triton"
    VLLM = "vllm"


class Task(str, enum.Enum):
    TEXT_CLASSIFICATION = "text-classification"
    IMAGE_CLASSIFICATION = "image-classification"
    EMBEDDING = "embedding"
    TENSOR = "tensor"
    TEXT_GENERATION = "text-generation"


class Placement(str, enum.Enum):
    SHARED = "shared"
    DEDICATED = "dedicated"


class LatencyClass(str, enum.Enum):
    """How a model's callers wait (seed 002): ``realtime`` callers are people or services in a
    request path, ``batch`` callers are jobs that care about throughput. A worker pod serves one
    side at a time: a realtime model never shares a pod with a batch model (the router places
    them apart, and a worker evicts the other side's copies before it loads one), so a flood of
    batch work cannot take a realtime model's cores. ``standard`` goes with either. On a pod,
    realtime requests waiting for room are admitted before all others."""

    REALTIME = "realtime"
    STANDARD = "standard"
    BATCH = "batch"

    def excludes(self) -> "LatencyClass | None":
        """The class whose copies may not be on the same pod as this one's, if any."""
        return _EXCLUDED.get(self)


_EXCLUDED = {LatencyClass.REALTIME: LatencyClass.BATCH, LatencyClass.BATCH: LatencyClass.REALTIME}


SOURCE_SCHEMES = source_locations.SCHEMES

# Bounds the CRD's schema states too (tests/operator/test_crd_matches_spec.py checks they agree).
MAX_CONCURRENCY = 1024
MAX_TIMEOUT_SECONDS = 3600
MAX_LOAD_TIMEOUT_SECONDS = 86400  # a day: the largest models, from the slowest stores
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000  # spec.priority; a namespace's ModelQuota may cap it lower
MAX_DESCRIPTION = 1024
MAX_LABELS = 32
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 253
MAX_MODEL_ID = 253  # a model id (a ServedModel's name, or a canary's <name>_<version>) is never longer
MAX_BATCH_SIZE = 256  # rows one forward pass may take (a request's own rows count towards it)
MAX_BATCH_DELAY_MS = 1000

# ServedModel names hotset keeps for itself, and why. Refused at admission by the CRD's CEL
# rule and again by the operator (tests/operator/test_crd_matches_spec.py checks both use this list).
RESERVED_NAMES: dict[str, str] = {
    labels.SHARED_POOL: "it names the shared worker pool (hotset.io/pool=shared)",
    labels.DEDICATED_POOL: "it names every dedicated group's pods (hotset.io/pool=dedicated)",
}


def reserved_name_problem(name: str) -> str | None:
    """Why `name` cannot be a ServedModel's name, or None when it can."""
    reason = RESERVED_NAMES.get(name)
    return None if reason is None else f"{name!r} is reserved: {reason}; choose another name"


def validate_source_uri(uri: str) -> str:
    """Accept only the schemes of ``hotset_common.sources``, well formed, and no path traversal."""
    source_locations.parse(uri)
    return uri



class SourceOptions(BaseModel):
    """How to fetch a remote source (``spec.source`` besides its ``uri``). Credentials are never
    here: `secret_name` names a Secret in the ServedModel's namespace (keys in docs/frameworks.md)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    # s3:// and gs://: the S3 API's URL and signing region; empty: the pool's setting, else the
    # scheme's public endpoint. path_style: bucket in the path (most S3-compatible servers) rather
    # than in the host name; None: the pool's setting.
    endpoint: str = Field("", max_length=512)
    region: str = Field("", max_length=64, pattern=r"^[a-z0-9-]*$")
    path_style: bool | None = Field(None, alias="pathStyle")
    secret_name: str = Field("", alias="secretName", max_length=253, pattern=r"^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?)?$")
    # https:// archives: the archive's sha256 (required), checked before anything is used.
    sha256: str = Field("", pattern=r"^([0-9a-f]{64})?$")
    # Where secret_name lives: the ServedModel's namespace (ModelSpec.from_served_model sets it).
    namespace: str = Field("", max_length=63)

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_a_url(cls, value: str) -> str:
        if value and not re.match(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?$", value):
            raise ValueError(f"endpoint {value[:80]!r} must be http(s)://host[:port]")
        return value.rstrip("/")

    @staticmethod
    def fields_of(source: Any, namespace: str = "") -> dict[str, Any]:
        """The options of a ServedModel's ``source: {uri, ...}`` (a plain string has none), with
        the namespace its Secret is looked up in."""
        options = {k: v for k, v in source.items() if k != "uri"} if isinstance(source, dict) else {}
        return {**options, "namespace": namespace} if namespace else options

    def key(self) -> str:
        """What decides the fetched bytes, for ``ModelSpec.load_key``."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)


def source_problem(uri: str, options: SourceOptions) -> str | None:
    """What a source needs beyond a well-formed URI, or None: an https archive its sha256."""
    location = source_locations.parse(uri)
    if isinstance(location, source_locations.Archive) and not options.sha256:
        return (f"source {uri[:100]!r} is an archive: source.sha256 (its 64 hex digits) is required, so a changed "
                "or truncated download is refused before it is used")
    return None


DEFAULT_IDLE_SECONDS = 300


class Replicas(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    min: int = Field(0, ge=0)
    max: int = Field(1, ge=1)
    # How long after its last request a model still counts as wanted: its copies keep pool pods,
    # and a min-0 dedicated group scales to zero after this long without requests.
    idle_seconds: int = Field(DEFAULT_IDLE_SECONDS, ge=0, alias="idleSeconds")

    @model_validator(mode="after")
    def _min_le_max(self) -> "Replicas":
        if self.min > self.max:
            raise ValueError(f"replicas.min ({self.min}) must not exceed replicas.max ({self.max})")
        return self


VARIANT_SEPARATOR = "_"  # never in a ServedModel's name (a DNS subdomain), so a variant id is never a model's


def variant_id(model: str, version: str) -> str:
    """The id a canary version of `model` is served under (``sentiment_2``): a model of its own to
    the workers and the router, which split `model`'s traffic onto it by weight."""
    return f"{model}{VARIANT_SEPARATOR}{version}"


class Canary(BaseModel):
    """A second version served beside the model's own, taking `weight` percent of its requests."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    version: str = Field(..., min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
    source: str
    source_options: SourceOptions = Field(default_factory=SourceOptions, alias="sourceOptions")
    weight: int = Field(..., ge=0, le=100, description="percent of the model's requests")
    memory_bytes: int = Field(0, ge=0, alias="memory", description="estimate; 0: the model's own")

    @model_validator(mode="before")
    @classmethod
    def _split_source(cls, value: Any) -> Any:
        """``source: {uri, sha256, ...}`` (a ServedModel's) into the uri and its options."""
        if isinstance(value, dict) and isinstance(value.get("source"), dict):
            source = value["source"]
            value = {**value, "source": source.get("uri", ""),
                     "source_options": {k: v for k, v in source.items() if k != "uri"}}
        return value

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str) -> str:
        return validate_source_uri(value)

    @field_validator("memory_bytes", mode="before")
    @classmethod
    def _parse_memory(cls, value: Any) -> int:
        return 0 if value in (None, "") else quantity.parse_bytes(value)

    @model_validator(mode="after")
    def _archive_has_checksum(self) -> "Canary":
        if (problem := source_problem(self.source, self.source_options)) is not None:
            raise ValueError(problem)
        return self


class Batching(BaseModel):
    """Dynamic batching of an in-process model: requests for one copy that arrive while it is busy
    run as one forward pass of at most `max_batch_size` rows, the oldest waiting at most
    `max_delay_ms` for the batch to fill (a lone request never waits). `maxBatchSize: 1` turns it
    off. A field left out takes the task's default (``BATCHING_DEFAULTS``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    max_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH_SIZE, alias="maxBatchSize")
    max_delay_ms: float | None = Field(None, ge=0, le=MAX_BATCH_DELAY_MS, alias="maxDelayMs")


# Per task: (maxBatchSize, maxDelayMs). Tasks not listed (tensor, text-generation) are not batched
# unless their spec says so. Batches are padding-aware, so a larger size costs little on short texts.
BATCHING_DEFAULTS: dict["Task", tuple[int, float]] = {
    Task.TEXT_CLASSIFICATION: (32, 2.0),
    Task.EMBEDDING: (32, 2.0),
    Task.IMAGE_CLASSIFICATION: (16, 2.0),
}


class Toleration(BaseModel):
    """A Kubernetes toleration (``core/v1 Toleration``): lets a pod onto nodes with a matching taint."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    key: str = Field("", max_length=316)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = Field("", max_length=63)
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    toleration_seconds: int | None = Field(None, alias="tolerationSeconds")


class Scheduling(BaseModel):
    """Where a pod may run: the scheduler's fields of a pod spec. A field left out (None) is not
    set here, so another level's value applies (``over``): the chart's for every pod of a kind,
    a WorkerPool's for its pods, a dedicated ServedModel's for its group. ``affinity`` and
    ``topologySpreadConstraints`` are passed as written; the API server checks them when the
    operator applies the pod template."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    node_selector: dict[str, str] | None = Field(None, alias="nodeSelector")
    tolerations: list[Toleration] | None = None
    affinity: dict[str, Any] | None = None
    topology_spread_constraints: list[dict[str, Any]] | None = Field(None, alias="topologySpreadConstraints")
    priority_class_name: str | None = Field(None, alias="priorityClassName", max_length=253)

    def over(self, default: "Scheduling") -> "Scheduling":
        """These fields where set, `default`'s for the rest (a field replaces, it does not merge:
        ``tolerations: []`` drops the default's tolerations)."""
        return default.model_copy(update={name: value for name in type(self).model_fields
                                          if (value := getattr(self, name)) is not None})

    def pod_fields(self) -> dict[str, Any]:
        """The pod spec fields set here, as a pod spec writes them (camelCase, defaults left out)."""
        fields = self.model_dump(by_alias=True, exclude_none=True)
        if self.tolerations is not None:
            fields["tolerations"] = [t.model_dump(by_alias=True, exclude_defaults=True) | {"operator": t.operator}
                                     for t in self.tolerations]
        return fields


MAX_LORA_ADAPTERS = 16  # static adapters of one model: each is a name the engine answers to from its start


class LoraAdapter(BaseModel):
    """A LoRA adapter its base model's engine starts with (vLLM's ``--lora-modules name=path``).

    Known when the engine starts, unlike an adapter ServedModel (``baseModel``), which is loaded
    into the running engine: nothing is loaded at runtime, the adapter answers from the engine's
    first request, and it goes and comes with its engine. Served as a model of its own name
    (``ModelSpec.static_adapters``), routed to where its base is ready.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(..., min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
    source: str
    source_options: SourceOptions = Field(default_factory=SourceOptions, alias="sourceOptions")

    @model_validator(mode="before")
    @classmethod
    def _split_source(cls, value: Any) -> Any:
        """``source: {uri, sha256, ...}`` (a ServedModel's) into the uri and its options."""
        if isinstance(value, dict) and isinstance(value.get("source"), dict):
            source = value["source"]
            value = {**value, "source": source.get("uri", ""),
                     "source_options": {k: v for k, v in source.items() if k != "uri"}}
        return value

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str) -> str:
        return validate_source_uri(value)

    @model_validator(mode="after")
    def _archive_has_checksum(self) -> "LoraAdapter":
        if (problem := source_problem(self.source, self.source_options)) is not None:
            raise ValueError(problem)
        return self


class Rollout(BaseModel):
    """How a new version meets traffic before it becomes the model's own (``version``/``source``)."""

    model_config = ConfigDict(extra="forbid")

    canary: Canary | None = None


class ModelSpec(BaseModel):
    """Everything hotset knows about one model before it is loaded."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, use_enum_values=False)

    id: str = Field(..., min_length=1, max_length=MAX_MODEL_ID, pattern=r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")
    name: str = ""
    framework: Framework
    task: Task = Task.TENSOR
    version: str = "1"
    source: str = Field(..., description="a URI of hotset_common.sources: file://, pvc://, s3://, gs://, hf://, oci://, https://")
    source_options: SourceOptions = Field(default_factory=SourceOptions, alias="sourceOptions")
    memory_bytes: int = Field(0, ge=0, alias="memory", description="estimate; the measured size after load wins")
    replicas: Replicas = Field(default_factory=Replicas)
    placement: Placement = Placement.SHARED
    latency_class: LatencyClass = Field(LatencyClass.STANDARD, alias="latencyClass")
    # Who gives way when a pod is full (seed 002: scarce GPUs by written policy): a load evicts
    # copies of lower priority before any other and never one of higher priority; a model that
    # only higher-priority copies keep out waits for room within its deadline, then is refused
    # saying so. A namespace's ModelQuota (maxPriority) bounds what its models may claim.
    priority: int = Field(0, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    pinned: bool = False
    # Per-model limits the worker enforces around inference: at most `max_concurrency` requests of
    # this model run at once (the rest wait in a bounded queue: 429 when it is full, 503 past their
    # deadline); `timeout_seconds` caps every request's deadline (queue, load and inference).
    max_concurrency: int | None = Field(None, ge=1, le=MAX_CONCURRENCY, alias="maxConcurrency")
    timeout_seconds: float | None = Field(None, gt=0, le=MAX_TIMEOUT_SECONDS, alias="timeoutSeconds")
    # How long one load of this model may take (fetching its source, starting its engine, and for a
    # dedicated group's pods the start-up probe), in place of the pools' one value (seed 002:
    # large models load slowly). None: the worker's --load-timeout-s and the router's --load-timeout.
    load_timeout_seconds: float | None = Field(None, gt=0, le=MAX_LOAD_TIMEOUT_SECONDS, alias="loadTimeoutSeconds")
    warmup: list[Any] = Field(default_factory=list)
    batching: Batching | None = None
    # A LoRA adapter names the model it runs on (same framework): it loads into that model's engine,
    # only where that model is loaded, and counts as a light model of its own under the budget.
    base_model: str = Field("", alias="baseModel", max_length=253)
    # Engine settings for frameworks that run an engine per model (vllm: gpu_memory_utilization,
    # max_model_len, enable_lora, ...); each framework checks the keys it accepts when it loads.
    engine_args: dict[str, str | int | float | bool] = Field(default_factory=dict, alias="engineArgs")
    # vllm: LoRA adapters the engine starts with (--lora-modules), each served under its own name.
    lora_adapters: list[LoraAdapter] = Field(default_factory=list, alias="loraAdapters", max_length=MAX_LORA_ADAPTERS)
    # Set only on the spec ``static_adapters`` derives for one of them.
    static_adapter: bool = False
    rollout: Rollout | None = None
    # placement: dedicated only: where the group's pods may run, over the chart's workers.scheduling
    # (a shared model runs on its WorkerPool's pods, which the WorkerPool's spec.scheduling places).
    scheduling: Scheduling | None = None
    # Set only on a canary's derived spec (``canary_variant``): the model whose traffic it shares,
    # and its weight in percent.
    variant_of: str = ""
    variant_weight: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    description: str = Field("", max_length=MAX_DESCRIPTION)
    owner: str = ""
    oncall: str = ""

    @field_validator("labels")
    @classmethod
    def _bounded_labels(cls, value: dict[str, str]) -> dict[str, str]:
        """Labels travel in every pool's model-store ConfigMap (1 MiB for all models): keep them small."""
        if len(value) > MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS} labels, got {len(value)}")
        for key, text in value.items():
            if len(key) > MAX_LABEL_KEY or len(text) > MAX_LABEL_VALUE:
                raise ValueError(f"label {key[:40]!r}: keys take at most {MAX_LABEL_KEY} characters, "
                                 f"values at most {MAX_LABEL_VALUE}")
        return value

    @field_validator("memory_bytes", mode="before")
    @classmethod
    def _parse_memory(cls, value: Any) -> int:
        return 0 if value in (None, "") else quantity.parse_bytes(value)

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str) -> str:
        return validate_source_uri(value)

    @model_validator(mode="after")
    def _archive_has_checksum(self) -> "ModelSpec":
        if (problem := source_problem(self.source, self.source_options)) is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _default_name(self) -> "ModelSpec":
        if not self.name:
            self.name = self.id
        return self

    def load_timeout_s(self, default: float) -> float:
        """Seconds one load of this model may take: its own ``loadTimeoutSeconds``, else `default`."""
        return self.load_timeout_seconds if self.load_timeout_seconds is not None else default

    @property
    def namespace(self) -> str:
        """The ServedModel's namespace ("" in a local store): the tenant whose share of a worker's
        inference threads its requests use (worker fair_threads.py)."""
        return self.source_options.namespace

    def batch_limits(self) -> tuple[int, float]:
        """(max rows per forward pass, max milliseconds the oldest request waits); (1, 0): unbatched."""
        size, delay = BATCHING_DEFAULTS.get(self.task, (1, 0.0))
        if self.batching is not None:
            size = self.batching.max_batch_size if self.batching.max_batch_size is not None else size
            delay = self.batching.max_delay_ms if self.batching.max_delay_ms is not None else delay
        return size, (delay if size > 1 else 0.0)

    def load_key(self) -> tuple[str, ...]:
        """What decides the weights a copy holds: a change of any of these is a rollout (a new copy
        is loaded and takes over from the old one); other fields (memory, replicas, labels...) apply
        to the copy in place."""
        return (self.framework.value, self.task.value, self.source, self.version, self.base_model,
                json.dumps(self.engine_args, sort_keys=True, default=str), self.source_options.key(),
                json.dumps([a.model_dump(mode="json") for a in self.lora_adapters], sort_keys=True))

    @model_validator(mode="after")
    def _canary_is_another_version(self) -> "ModelSpec":
        if self.rollout and self.rollout.canary and self.rollout.canary.version == self.version:
            raise ValueError(f"rollout.canary.version must differ from version ({self.version!r})")
        return self

    def canary_variant(self) -> "ModelSpec | None":
        """The canary version as a model of its own (``variant_id``), or None without a canary."""
        canary = self.rollout.canary if self.rollout else None
        if canary is None:
            return None
        return self.model_copy(update={
            "id": variant_id(self.id, canary.version), "name": self.name, "version": canary.version,
            "source": canary.source, "source_options": canary.source_options, "memory_bytes": canary.memory_bytes or self.memory_bytes,
            "rollout": None, "variant_of": self.id, "variant_weight": canary.weight, "pinned": False,
            "replicas": Replicas(min=0, max=self.replicas.max),
        })

    @model_validator(mode="after")
    def _scheduling_is_for_dedicated_groups(self) -> "ModelSpec":
        if self.scheduling is not None and self.placement is not Placement.DEDICATED:
            raise ValueError("scheduling applies to placement: dedicated (the model's own pods); a shared model runs "
                             "on its pool's pods, placed by the WorkerPool's spec.scheduling")
        return self

    @model_validator(mode="after")
    def _static_adapters_are_a_vllm_engines(self) -> "ModelSpec":
        if not self.lora_adapters:
            return self
        if self.framework is not Framework.VLLM or self.base_model:
            raise ValueError("loraAdapters: only a vllm base model's engine starts with LoRA adapters")
        names = [adapter.name for adapter in self.lora_adapters]
        if len(set(names)) != len(names) or self.id in names:
            raise ValueError(f"loraAdapters: each adapter needs a name of its own, not the model's ({names})")
        if self.engine_args.get("enable_lora") is False:
            raise ValueError("loraAdapters: engineArgs.enable_lora is false; an engine with adapters needs it")
        return self

    def static_adapters(self) -> "list[ModelSpec]":
        """Each ``loraAdapters`` entry as a model of its own: an adapter of this model (``baseModel``)
        that its engine holds from its start, so loading it asks nothing of the engine. It counts no
        bytes of its own (its weights are in the engine, within the base's share)."""
        return [ModelSpec(id=adapter.name, framework=self.framework, task=self.task, version=self.version,
                          source=adapter.source, source_options=adapter.source_options, memory_bytes=0,
                          replicas=Replicas(min=0, max=self.replicas.max), latency_class=self.latency_class,
                          priority=self.priority, base_model=self.id, static_adapter=True,
                          description=f"LoRA adapter {adapter.name} in the engine of {self.id}",
                          owner=self.owner, oncall=self.oncall)
                for adapter in self.lora_adapters]

    @model_validator(mode="after")
    def _not_its_own_base(self) -> "ModelSpec":
        if self.base_model and self.base_model == self.id:
            raise ValueError(f"model {self.id!r} cannot be its own baseModel")
        return self

    @classmethod
    def from_served_model(cls, body: dict[str, Any]) -> "ModelSpec":
        """Build from a ServedModel object (its metadata.name is the model id)."""
        spec = dict(body.get("spec") or {})
        source = spec.pop("source", {}) or {}
        namespace = str(body["metadata"].get("namespace") or "")
        rollout = spec.get("rollout")
        canary = rollout.get("canary") if isinstance(rollout, dict) else None
        if isinstance(canary, dict) and isinstance(canary.get("source"), dict) and namespace:
            spec["rollout"] = {**rollout, "canary": {**canary, "source": {**canary["source"], "namespace": namespace}}}
        adapters = spec.get("loraAdapters")
        if isinstance(adapters, list) and namespace:  # their Secrets live in the model's namespace too
            spec["loraAdapters"] = [{**a, "source": {**a["source"], "namespace": namespace}}
                                    if isinstance(a, dict) and isinstance(a.get("source"), dict) else a for a in adapters]
        return cls(id=body["metadata"]["name"], source=source.get("uri", "") if isinstance(source, dict) else source,
                   source_options=SourceOptions.fields_of(source, namespace), **spec)


DEFAULT_SERVING_WEIGHT = 1.0
MAX_SERVING_WEIGHT = 1000.0


def with_variants(specs: list[ModelSpec]) -> list[ModelSpec]:
    """`specs`, the canary version of each that has one and the static LoRA adapters of each
    (``loraAdapters``): what a worker's store can load."""
    return [*specs, *(variant for spec in specs if (variant := spec.canary_variant()) is not None),
            *(adapter for spec in specs for adapter in spec.static_adapters())]


@dataclasses.dataclass(frozen=True)
class RequestRate:
    """A namespace's request-rate limit, from its ModelQuota's ``requestsPerSecond`` and ``burst``
    (crds/modelquota.yaml): the router's token bucket per namespace (router/hotset_router/rates.py)."""

    per_second: float
    burst: int

    @staticmethod
    def of_quota(spec: Mapping[str, Any]) -> "RequestRate | None":
        """The limit a ModelQuota's spec sets; None: none (absent, or not a positive number)."""
        value = spec.get("requestsPerSecond")
        try:
            per_second = float(value) if value is not None else 0.0
            burst = int(spec.get("burst") or 0)
        except (TypeError, ValueError):
            return None
        if not per_second > 0 or per_second == float("inf"):
            return None
        return RequestRate(per_second, max(1, burst or math.ceil(per_second)))

    @staticmethod
    def strictest(rates: Iterable["RequestRate"]) -> "RequestRate | None":
        """Several quotas in one namespace: the lowest rate, with the smallest burst."""
        found = list(rates)
        if not found:
            return None
        return RequestRate(min(r.per_second for r in found), min(r.burst for r in found))


@dataclasses.dataclass(frozen=True)
class ServingTerms:
    """What a namespace's ModelQuota sets for serving (crds/modelquota.yaml): its request rate, and
    its weight in the shares of a worker's inference threads and the router's request slots when
    namespaces contend (``servingWeight``; 1 when absent)."""

    rate: RequestRate | None = None
    weight: float = DEFAULT_SERVING_WEIGHT

    @staticmethod
    def of_quota(spec: Mapping[str, Any]) -> "ServingTerms":
        try:
            weight = float(spec.get("servingWeight") or DEFAULT_SERVING_WEIGHT)
        except (TypeError, ValueError):
            weight = DEFAULT_SERVING_WEIGHT
        if not 0 < weight <= MAX_SERVING_WEIGHT:
            weight = DEFAULT_SERVING_WEIGHT
        return ServingTerms(RequestRate.of_quota(spec), weight)

    def __bool__(self) -> bool:
        return self.rate is not None or self.weight != DEFAULT_SERVING_WEIGHT

    @staticmethod
    def strictest(terms: Iterable["ServingTerms"]) -> "ServingTerms":
        """Several quotas in one namespace: the strictest rate and the smallest weight."""
        found = list(terms)
        return ServingTerms(RequestRate.strictest(t.rate for t in found if t.rate is not None),
                            min((t.weight for t in found), default=DEFAULT_SERVING_WEIGHT))
