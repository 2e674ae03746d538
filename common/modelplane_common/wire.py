"""Wire types between clients, the router and workers.

The seed API (`/predict`, `/models`) and modelplane's own `/status` report
are defined once here; OIP v2 bodies are forwarded as they are and need no
types of ours.
"""
from __future__ import annotations

import enum
import math
from typing import Any

from pydantic import BaseModel, Field

from modelplane_common import errors

# A caller's time budget for one request, in seconds (decimal): how long a worker may let it wait
# for room and for its model's load. The router sends what is left of its own request timeout.
TIMEOUT_HEADER = "x-modelplane-timeout"


def parse_timeout(value: str | None) -> float | None:
    """A ``TIMEOUT_HEADER`` value in seconds; None when absent. Router and workers read it alike:
    anything but a positive finite number is the caller's mistake (400), never a silent default."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise errors.BadInput(f"{TIMEOUT_HEADER} must be a positive number of seconds, got {value!r}")
    return seconds


# Router -> worker: the canary version (its variant id) chosen to answer a request for its model.
VARIANT_HEADER = "x-modelplane-variant"
# On every inference answer: the version of the copy that computed it (during a rollout, the old
# version until the new copy has taken over).
VERSION_HEADER = "x-modelplane-model-version"


class PredictRequest(BaseModel):
    model_id: str = Field(..., min_length=1)
    input_data: Any


class PredictResponse(BaseModel):
    model_id: str
    predictions: Any
    model_version: str = ""  # the version of the copy that computed the predictions


class ModelMetadata(BaseModel):
    """One model as the seed's ``GET /models`` describes it: ``id, name, type, framework, version``
    (``type`` is the seed's word for the task), with modelplane's fields beside them."""

    id: str
    name: str
    type: str
    framework: str
    version: str
    description: str = ""
    memory_bytes: int = 0  # best known size: measured at the last load, else the spec's estimate


class ModelsResponse(BaseModel):
    """``GET /models`` in the seed's shapes: every model the server can serve as ``{id: metadata}``,
    and the models loaded (ready) now as ``{id: name}``."""

    available_models: dict[str, ModelMetadata]
    loaded_models: dict[str, str]


class CopyLocation(BaseModel):
    """Where one copy of a model lives, as the router's map has it."""

    pod: str
    url: str
    state: str
    bytes: int = 0


class RouterModelsResponse(ModelsResponse):
    """The router's ``GET /models``: the seed's two maps for the whole cluster, plus where each model's copies are."""

    copies: dict[str, list[CopyLocation]] = Field(default_factory=dict)


class CopyState(str, enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


class ModelCopy(BaseModel):
    """One model's copy on one worker, as that worker reports it."""

    id: str
    framework: str
    state: CopyState
    bytes: int = 0
    pinned: bool = False
    inflight: int = 0
    last_used_s: float = 0.0  # monotonic-free: seconds since the copy was last used
    loaded_at_s: float = 0.0  # seconds since the load finished
    version: str = ""  # the version this copy holds (the one that answers its requests)
    reason: str = ""  # FAILED: why the last load failed; READY: a rollout to a new version that failed
    failure: str = ""  # FAILED: what failed: "LoadFailed", "WarmupFailed", ...
    failed_at_s: float = 0.0  # FAILED: seconds since that load failed
    # What the shared eviction cost model (modelplane_common.eviction) needs, so that a router
    # predicts the worker's victims from this report:
    load_seconds: float = 0.0  # its last measured load
    frequency: float = 0.0  # its decayed request count
    queued: int = 0  # requests waiting for it


class CatalogEntry(BaseModel):
    """A model the worker can load, with the estimate placement uses before it is measured,
    and what the seed's ``/models`` says of it (defaults: a report from an older worker)."""

    id: str
    framework: str
    memory_bytes: int
    name: str = ""
    type: str = ""
    version: str = ""
    description: str = ""
    base_model: str = ""  # a LoRA adapter: the model it runs on (routed to where that model is loaded)
    canary: str = ""  # the id of this model's canary version (spec.rollout.canary), if it has one
    canary_weight: int = 0  # the percent of this model's requests the router sends to it

    def metadata(self) -> ModelMetadata:
        return ModelMetadata(id=self.id, name=self.name or self.id, type=self.type, framework=self.framework,
                             version=self.version, description=self.description, memory_bytes=self.memory_bytes)


class WaitingModel(BaseModel):
    """A model whose requests wait in a worker's admission queue: no room for it there now."""

    id: str
    requests: int
    waited_s: float  # how long its first waiting request has waited


class WorkerStatus(BaseModel):
    """`GET /status`: the worker's own report, the source of truth for the router's map."""

    pod: str
    ready: bool
    triton_ready: bool
    memory_budget_bytes: int
    used_bytes: int
    free_bytes: int
    max_models: int | None = None
    churn_guard_s: float = 0.0  # the worker's eviction policy setting (the router plans with it)
    queued_requests: int = 0  # requests waiting in its admission queue for room
    waiting: list[WaitingModel] = Field(default_factory=list)  # the models they wait for (pool autoscaling)
    models: list[ModelCopy]
    catalog: list[CatalogEntry]
