"""Wire types between clients, the router and workers.

The seed API (`/predict`, `/models`) and hotset's own `/status` report
are defined once here; OIP v2 bodies are forwarded as they are and need no
types of ours.
"""
from __future__ import annotations

import enum
import math
import re
from typing import Any, Mapping, NamedTuple

from pydantic import BaseModel, Field

from hotset_common import errors
from hotset_common.spec import MAX_MODEL_ID, LatencyClass

# A caller's time budget for one request, in seconds (decimal): how long a worker may let it wait
# for room and for its model's load. The router sends what is left of its own request timeout.
TIMEOUT_HEADER = "x-hotset-timeout"
# OIP v2 infer, the route router and workers serve in front of their FastAPI apps (inference_asgi.py).
INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")
# Where worker pods and the router serve OIP v2 over gRPC in a cluster (grpc_wire.py); here, not
# there, so the operator, which builds the pods and speaks no gRPC, reads it without grpcio.
GRPC_PORT = 8081
# Where a worker pod's Triton sidecar listens (on the pod's loopback, but metrics): the operator
# builds the pod around them and keeps other ports off them.
TRITON_HTTP_PORT = 8000
TRITON_GRPC_PORT = 8001
TRITON_METRICS_PORT = 8002


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
        raise errors.BadInput(f"{TIMEOUT_HEADER} must be a positive number of seconds, got {errors.excerpt(value)}")
    return seconds


def requested_model(name: str) -> str:
    """A model name a client sent, as routing may use it: a 404 saying so for a name longer than
    any model id can be (quoting a short excerpt of it, not the megabyte a client may send)."""
    if len(name) > MAX_MODEL_ID:
        raise errors.ModelNotFound(
            f"model {errors.excerpt(name)} is not served: model ids take at most {MAX_MODEL_ID} characters")
    return name


# Client -> router: the namespace whose model a request names. Model names are one namespace across
# the cluster (the operator refuses a second ServedModel of a name), so this addresses, it does not
# disambiguate: a model of another namespace is not found there. The router's path prefix
# ``/namespaces/<namespace>/...`` sets it for clients that cannot add a header.
NAMESPACE_HEADER = "x-hotset-namespace"

# Router -> worker: the serving weight of the request's namespace (its ModelQuota's servingWeight),
# as ``<namespace>=<weight>``. The worker's inference threads are shared between namespaces by
# these weights (worker fair_threads.py). The router sets it on every request whose model has a
# namespace and never passes on a client's own.
SHARE_WEIGHT_HEADER = "x-hotset-share-weight"


def share_weight(namespace: str, weight: float) -> str:
    return f"{namespace}={weight:g}"


def parse_share_weight(value: str | None) -> tuple[str, float] | None:
    """(namespace, weight) of a ``SHARE_WEIGHT_HEADER`` value; None when absent or malformed (the
    request is served at the namespace's current weight: a weight is a hint, not an input)."""
    if not value or "=" not in value:
        return None
    namespace, _, number = value.rpartition("=")
    try:
        weight = float(number)
    except ValueError:
        return None
    return (namespace, weight) if namespace and 0 < weight < float("inf") else None


# Router -> worker: the canary version (its variant id) chosen to answer a request for its model.
VARIANT_HEADER = "x-hotset-variant"
# On every inference answer: the version of the copy that computed it (during a rollout, the old
# version until the new copy has taken over).
VERSION_HEADER = "x-hotset-model-version"

# Where an answer's time went: the standard header (W3C Server Timing), one comma-separated list of
# metrics. The worker writes its own (queue, load, batch, infer); the router adds its entries beside
# them, so a client reads both in one header and never loses the worker's.
SERVER_TIMING_HEADER = "server-timing"


class TimingMetric(NamedTuple):
    """One Server-Timing metric: its name (what clients parse) and the description tools show."""

    name: str
    description: str

    def entry(self, seconds: float) -> str:
        """``pod-wait;dur=812.4;desc="waited for a starting pod"`` (milliseconds, as the header wants)."""
        return f'{self.name};dur={seconds * 1000:.1f};desc="{self.description}"'


# The router's: a request held because no ready pod could serve its model yet (scale from zero,
# pods starting or rolling; router/hotset_router/pod_waiter.py). Only answers that waited carry it.
POD_WAIT_TIMING = TimingMetric("pod-wait", "waited for a starting pod")


def with_server_timing(headers: Mapping[str, str], entry: str) -> dict[str, str]:
    """`headers` with `entry` added to their Server-Timing (first: it happened before the worker's
    time), the entries already there kept; header names compared without case."""
    kept = {k: v for k, v in headers.items() if k.lower() != SERVER_TIMING_HEADER}
    present = [v for k, v in headers.items() if k.lower() == SERVER_TIMING_HEADER and v.strip()]
    return {**kept, SERVER_TIMING_HEADER: ", ".join([entry, *present])}


def server_timing_durations(header: str) -> dict[str, float]:
    """``load;dur=41.2, pod-wait;dur=800;desc="..."`` -> {"load": 0.0412, "pod-wait": 0.8} (seconds);
    metrics without a duration are left out."""
    durations: dict[str, float] = {}
    for metric in header.split(","):
        name, *params = [part.strip() for part in metric.split(";")]
        for param in params:
            if param.startswith("dur="):
                durations[name] = float(param[4:]) / 1000
    return durations


class PredictRequest(BaseModel):
    model_id: str = Field(..., min_length=1)
    input_data: Any


class PredictResponse(BaseModel):
    model_id: str
    predictions: Any
    model_version: str = ""  # the version of the copy that computed the predictions


class ModelMetadata(BaseModel):
    """One model as the seed's ``GET /models`` describes it: ``id, name, type, framework, version``
    (``type`` is the seed's word for the task), with hotset's fields beside them."""

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


class ModelsPage(ModelsResponse):
    """``GET /models?limit=N[&after=ID]``: one page of the catalog in id order (the seed's two maps,
    limited to the page's models), and the id to ask ``after`` for the next one (empty: the last page)."""

    next: str = ""


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
    progress: str = ""  # LOADING: how far its source's download is ("downloading 1.2 of 4.0 GiB")
    # What the shared eviction cost model (hotset_common.eviction) needs, so that a router
    # predicts the worker's victims from this report:
    load_seconds: float = 0.0  # its last measured load
    frequency: float = 0.0  # its decayed request count
    queued: int = 0  # requests waiting for it
    priority: int = 0  # its spec's priority: a load evicts lower ones first and never a higher one


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
    latency_class: LatencyClass = LatencyClass.STANDARD  # the router keeps realtime and batch models on separate pods
    load_timeout_s: float = 0.0  # the spec's loadTimeoutSeconds: how long the router waits on a load of it; 0: its own
    priority: int = 0  # the spec's priority: the router places a load only where it may evict

    def metadata(self) -> ModelMetadata:
        return ModelMetadata(id=self.id, name=self.name or self.id, type=self.type, framework=self.framework,
                             version=self.version, description=self.description, memory_bytes=self.memory_bytes)


class WaitingModel(BaseModel):
    """A model whose requests wait in a worker's admission queue: no room for it there now."""

    id: str
    requests: int
    waited_s: float  # how long its first waiting request has waited


class Preemption(BaseModel):
    """A copy a worker evicted for the load of a model of higher priority (seed 002: the eviction's
    reason names the preempting model). The operator turns each into Events on both ServedModels."""

    seq: int  # increases by one per preemption on this pod: a reader takes each once
    model: str  # the evicted copy's model
    priority: int
    by: str  # the model whose load took its room
    by_priority: int
    at: float  # unix seconds


# ``GET /status?since=<cursor>&limit=<n>``: a report of what changed after the report that gave
# the cursor (its ``cursor`` field), at most `n` models and catalog entries, in the order they
# changed. Without ``since`` a report is the whole state at once (the shape older callers read).
STATUS_SINCE = "since"
STATUS_LIMIT = "limit"
FROM_SCRATCH = "0"  # a `since` that asks for everything (first contact), page by page
MAX_STATUS_LIMIT = 100_000
# Router -> worker on every status request: which router replica asks (the worker lists the
# replicas it heard from lately in ``WorkerStatus.routers``, so every replica knows the others).
ROUTER_ID_HEADER = "x-hotset-router"


class StatusCursor(NamedTuple):
    """Where a report left off: the worker process (`epoch`, new at each start) and its change count."""

    epoch: str
    version: int

    def __str__(self) -> str:
        return f"{self.epoch}.{self.version}"

    @classmethod
    def parse(cls, value: str) -> "StatusCursor | None":
        """A cursor from an earlier report; None for ``FROM_SCRATCH``. 400 naming the parameter for
        anything else (a cursor is only ever copied from a report)."""
        if value == FROM_SCRATCH:
            return None
        epoch, dot, version = value.rpartition(".")
        if not dot or not epoch or not version.isdigit() or len(value) > 100:
            raise errors.BadInput(f"{STATUS_SINCE} must be a cursor from an earlier report or {FROM_SCRATCH!r}, "
                                  f"got {value[:40]!r}")
        return cls(epoch, int(version))


def parse_status_limit(value: str | None) -> int | None:
    """``limit`` of ``GET /status``: a positive count up to MAX_STATUS_LIMIT; None when absent."""
    if value is None:
        return None
    if not value.isdigit() or not 0 < int(value) <= MAX_STATUS_LIMIT:
        raise errors.BadInput(f"{STATUS_LIMIT} must be a count from 1 to {MAX_STATUS_LIMIT}, got {value[:20]!r}")
    return int(value)


class EngineLoad(BaseModel):
    """One engine's own figures (its /metrics, as its worker last read them): what a router scores
    the engine's copy by beside its own in-flight counts (the Gateway API Inference Extension's
    model-server metrics: queue, running requests, KV-cache use, LoRA adapters resident)."""

    model: str  # the model whose engine it is (its adapters run in it)
    waiting: int = 0  # requests the engine's scheduler has not started
    running: int = 0  # requests in its running batch
    kv_cache_usage: float = 0.0  # share of its KV-cache blocks in use, 0-1
    kv_cache_blocks: int = 0  # how many blocks its KV cache has (0: not known)
    block_size: int = 0  # tokens per block: prefix caching reuses whole blocks
    prefix_cache_queries: float = 0.0  # prompt tokens looked up in its prefix cache since it started
    prefix_cache_hits: float = 0.0  # of those, found
    max_lora: int = 0  # adapters it computes with at once (0: LoRA off)
    running_lora_adapters: list[str] = Field(default_factory=list)
    waiting_lora_adapters: list[str] = Field(default_factory=list)
    age_s: float = 0.0  # how long ago the worker read it


class WorkerStatus(BaseModel):
    """`GET /status`: the worker's own report, the source of truth for the router's map.

    Whole (``delta`` false): `models` and `catalog` are everything the worker holds and can load;
    with ``more`` they are the first part of it, and the rest comes as deltas from `cursor`.
    A delta: only the models and entries that changed after the caller's cursor, and the ids of
    those that went (`removed_models`, `removed_catalog`). The pod's own figures are always current.
    """

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
    cursor: str = ""  # ask with ?since=<cursor> for what changes after this report
    delta: bool = False
    more: bool = False  # more changes wait: ask again at once from `cursor`
    removed_models: list[str] = Field(default_factory=list)  # copies (and failed loads) that went
    removed_catalog: list[str] = Field(default_factory=list)  # models that left the model store
    routers: list[str] = Field(default_factory=list)  # router replicas that asked for reports lately
    # The half-life of each copy's decayed request count (`frequency`; eviction.DecayedCount), so a
    # reader can tell how many requests arrived between two reports.
    demand_half_life_s: float = 30.0
    preemptions: list[Preemption] = Field(default_factory=list)  # the pod's latest, oldest first
    # The port the worker serves OIP v2 over gRPC on, at the host of its HTTP URL (grpc_wire.py);
    # None: it serves none. The router learns where to send gRPC from here, in every mode.
    grpc_port: int | None = None
    # The pod's vLLM engines' own figures, each read within the last second or so (pod figures: in
    # every report, delta or whole).
    engines: list[EngineLoad] = Field(default_factory=list)
