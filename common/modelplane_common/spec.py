"""The ServedModel spec as Python types.

One definition serves the worker's ModelStore (standalone JSON or cluster
ServedModels), the router's placement (memory, min/max copies) and the
operator's validation, so they cannot drift apart. The CRD's OpenAPI schema in
``crds/`` mirrors these fields; tests check the two agree.
"""
from __future__ import annotations

import enum
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from modelplane_common import labels, quantity

GROUP = "modelplane.io"
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


SOURCE_SCHEMES = ("file", "pvc")

# Bounds the CRD's schema states too (tests/operator/test_crd_matches_spec.py checks they agree).
MAX_CONCURRENCY = 1024
MAX_TIMEOUT_SECONDS = 3600
MAX_DESCRIPTION = 1024
MAX_LABELS = 32
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 253

# ServedModel names modelplane keeps for itself, and why. Refused at admission by the CRD's CEL
# rule and again by the operator (tests/operator/test_crd_matches_spec.py checks both use this list).
RESERVED_NAMES: dict[str, str] = {
    labels.SHARED_POOL: "it names the shared worker pool (modelplane.io/pool=shared)",
    labels.DEDICATED_POOL: "it names every dedicated group's pods (modelplane.io/pool=dedicated)",
}


def reserved_name_problem(name: str) -> str | None:
    """Why `name` cannot be a ServedModel's name, or None when it can."""
    reason = RESERVED_NAMES.get(name)
    return None if reason is None else f"{name!r} is reserved: {reason}; choose another name"


def validate_source_uri(uri: str) -> str:
    """Accept only schemes a worker can fetch offline and no path traversal."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise ValueError(f"source uri {uri!r} has no scheme; expected one of {', '.join(s + '://' for s in SOURCE_SCHEMES)}")
    if scheme not in SOURCE_SCHEMES:
        raise ValueError(f"source uri scheme {scheme!r} is not supported; expected one of {SOURCE_SCHEMES}")
    if any(part == ".." for part in rest.split("/")):
        raise ValueError(f"source uri {uri!r} must not contain '..'")
    if not rest.strip("/"):
        raise ValueError(f"source uri {uri!r} names no path")
    return uri


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


def _source_of(value: Any) -> Any:
    """A ServedModel's ``source: {uri: ...}`` or a store's plain string."""
    return value.get("uri", "") if isinstance(value, dict) else value


class Canary(BaseModel):
    """A second version served beside the model's own, taking `weight` percent of its requests."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    version: str = Field(..., min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
    source: str
    weight: int = Field(..., ge=0, le=100, description="percent of the model's requests")
    memory_bytes: int = Field(0, ge=0, alias="memory", description="estimate; 0: the model's own")

    @field_validator("source", mode="before")
    @classmethod
    def _uri(cls, value: Any) -> Any:
        return _source_of(value)

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str) -> str:
        return validate_source_uri(value)

    @field_validator("memory_bytes", mode="before")
    @classmethod
    def _parse_memory(cls, value: Any) -> int:
        return 0 if value in (None, "") else quantity.parse_bytes(value)


class Rollout(BaseModel):
    """How a new version meets traffic before it becomes the model's own (``version``/``source``)."""

    model_config = ConfigDict(extra="forbid")

    canary: Canary | None = None


class ModelSpec(BaseModel):
    """Everything modelplane knows about one model before it is loaded."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, use_enum_values=False)

    id: str = Field(..., min_length=1, max_length=253, pattern=r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")
    name: str = ""
    framework: Framework
    task: Task = Task.TENSOR
    version: str = "1"
    source: str = Field(..., description="file:///abs/path or pvc://claim/path")
    memory_bytes: int = Field(0, ge=0, alias="memory", description="estimate; the measured size after load wins")
    replicas: Replicas = Field(default_factory=Replicas)
    placement: Placement = Placement.SHARED
    pinned: bool = False
    # Per-model limits the worker enforces around inference: at most `max_concurrency` requests of
    # this model run at once (the rest wait in a bounded queue: 429 when it is full, 503 past their
    # deadline); `timeout_seconds` caps every request's deadline (queue, load and inference).
    max_concurrency: int | None = Field(None, ge=1, le=MAX_CONCURRENCY, alias="maxConcurrency")
    timeout_seconds: float | None = Field(None, gt=0, le=MAX_TIMEOUT_SECONDS, alias="timeoutSeconds")
    warmup: list[Any] = Field(default_factory=list)
    # A LoRA adapter names the model it runs on (same framework): it loads into that model's engine,
    # only where that model is loaded, and counts as a light model of its own under the budget.
    base_model: str = Field("", alias="baseModel", max_length=253)
    # Engine settings for frameworks that run an engine per model (vllm: gpu_memory_utilization,
    # max_model_len, enable_lora, ...); each framework checks the keys it accepts when it loads.
    engine_args: dict[str, str | int | float | bool] = Field(default_factory=dict, alias="engineArgs")
    rollout: Rollout | None = None
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
    def _default_name(self) -> "ModelSpec":
        if not self.name:
            self.name = self.id
        return self

    def load_key(self) -> tuple[str, ...]:
        """What decides the weights a copy holds: a change of any of these is a rollout (a new copy
        is loaded and takes over from the old one); other fields (memory, replicas, labels...) apply
        to the copy in place."""
        return (self.framework.value, self.task.value, self.source, self.version, self.base_model,
                json.dumps(self.engine_args, sort_keys=True, default=str))

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
            "source": canary.source, "memory_bytes": canary.memory_bytes or self.memory_bytes,
            "rollout": None, "variant_of": self.id, "variant_weight": canary.weight, "pinned": False,
            "replicas": Replicas(min=0, max=self.replicas.max),
        })

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
        return cls(id=body["metadata"]["name"], source=source.get("uri", ""), **spec)


def with_variants(specs: list[ModelSpec]) -> list[ModelSpec]:
    """`specs` and the canary version of each that has one: what a worker's store can load."""
    return [*specs, *(variant for spec in specs if (variant := spec.canary_variant()) is not None)]
