"""The worker's Prometheus metrics, one registry per app, names from modelplane_common.metrics.

Every framework reports through the same series, so a dashboard needs one
query per figure whatever runs the model.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from modelplane_common import metrics as names
from modelplane_common.spec import ModelSpec
from modelplane_worker.token_meter import TokenFigures

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1)
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_RATE_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)
UNKNOWN_MODEL = "_unknown"  # label for requests naming no model in the store (bounded cardinality)


class WorkerMetrics:
    """Implements the manager's observer and counts requests for the data plane."""

    def __init__(self, pod: str, memory_budget: int, registry: CollectorRegistry | None = None) -> None:
        self.pod = pod
        self.registry = registry or CollectorRegistry()
        model_labels = ["model", "framework", "pod"]
        self.requests = Counter(names.REQUESTS_TOTAL, "Inference requests by outcome", [*model_labels, "code"], registry=self.registry)
        self.request_seconds = Histogram(
            names.REQUEST_SECONDS, "Inference request latency, load included", model_labels, buckets=_LATENCY_BUCKETS, registry=self.registry
        )
        self.load_seconds = Histogram(
            names.MODEL_LOAD_SECONDS, "Model load time", model_labels, buckets=_LOAD_BUCKETS, registry=self.registry
        )
        self.warmup_seconds = Histogram(
            names.MODEL_WARMUP_SECONDS, "Time a copy spent on its spec's warm-up inputs before it was ready", model_labels,
            buckets=_LOAD_BUCKETS, registry=self.registry,
        )
        self.loads = Counter(names.MODEL_LOADS_TOTAL, "Model loads by result", [*model_labels, "result"], registry=self.registry)
        self.evictions = Counter(names.EVICTIONS_TOTAL, "Models evicted to make room", model_labels, registry=self.registry)
        self.bytes = Gauge(names.MODEL_BYTES, "Measured bytes of each loaded model", model_labels, registry=self.registry)
        self.used = Gauge(names.MEMORY_USED_BYTES, "Bytes held by loaded and loading models", ["pod"], registry=self.registry)
        self.budget = Gauge(names.MEMORY_BUDGET_BYTES, "The worker's memory budget", ["pod"], registry=self.registry)
        self.queued = Gauge(names.QUEUED_REQUESTS, "Requests waiting in the admission queue for room", model_labels, registry=self.registry)
        self.queue_wait = Histogram(
            names.QUEUE_WAIT_SECONDS, "Time requests waited in the admission queue", model_labels, buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.refusals = Counter(
            names.REFUSALS_TOTAL, "Requests refused for lack of room (503 with Retry-After), by reason",
            [*model_labels, "reason"], registry=self.registry,
        )
        self.time_to_first_token = Histogram(
            names.TIME_TO_FIRST_TOKEN_SECONDS, "Seconds from a generative request's arrival to its first token",
            model_labels, buckets=_TTFT_BUCKETS, registry=self.registry)
        self.time_per_output_token = Histogram(
            names.TIME_PER_OUTPUT_TOKEN_SECONDS, "Seconds between output tokens, per request (after the first)",
            model_labels, buckets=_TOKEN_BUCKETS, registry=self.registry)
        self.tokens_per_second = Histogram(
            names.OUTPUT_TOKENS_PER_SECOND, "Output tokens per second of generation, per request",
            model_labels, buckets=_RATE_BUCKETS, registry=self.registry)
        self.prompt_tokens = Counter(names.PROMPT_TOKENS_TOTAL, "Prompt tokens of generative and embedding requests",
                                     model_labels, registry=self.registry)
        self.output_tokens = Counter(names.OUTPUT_TOKENS_TOTAL, "Generated tokens (rate(): tokens per second)",
                                     model_labels, registry=self.registry)
        self.inflight = Gauge(names.INFLIGHT_REQUESTS, "Inference requests being served now", model_labels, registry=self.registry)
        self.model_queued = Gauge(
            names.MODEL_QUEUED_REQUESTS, "Requests waiting for a slot of the model's maxConcurrency", model_labels,
            registry=self.registry,
        )
        self.budget.labels(pod).set(memory_budget)
        self.used.labels(pod).set(0)

    def _labels(self, spec: ModelSpec) -> tuple[str, str, str]:
        return spec.id, spec.framework.value, self.pod

    def request_started(self, spec: ModelSpec) -> None:
        self.inflight.labels(*self._labels(spec)).inc()

    def request_ended(self, spec: ModelSpec) -> None:
        self.inflight.labels(*self._labels(spec)).dec()

    # LimitObserver
    def concurrency_queue(self, spec: ModelSpec, waiting: int) -> None:
        self.model_queued.labels(*self._labels(spec)).set(waiting)

    def refused(self, spec: ModelSpec, reason: str) -> None:
        self.refusals.labels(*self._labels(spec), reason).inc()

    def request_finished(self, spec: ModelSpec | None, code: int, seconds: float) -> None:
        model, framework = (spec.id, spec.framework.value) if spec else (UNKNOWN_MODEL, "")
        self.requests.labels(model, framework, self.pod, str(code)).inc()
        if spec is not None:
            self.request_seconds.labels(model, framework, self.pod).observe(seconds)

    def tokens_finished(self, spec: ModelSpec, figures: TokenFigures) -> None:
        """One generative (or embedding) request's token figures."""
        labels = self._labels(spec)
        self.prompt_tokens.labels(*labels).inc(figures.prompt_tokens)
        self.output_tokens.labels(*labels).inc(figures.output_tokens)
        if figures.time_to_first_token_s is not None:
            self.time_to_first_token.labels(*labels).observe(figures.time_to_first_token_s)
        if figures.time_per_output_token_s is not None:
            self.time_per_output_token.labels(*labels).observe(figures.time_per_output_token_s)
        if figures.tokens_per_second is not None:
            self.tokens_per_second.labels(*labels).observe(figures.tokens_per_second)

    # ManagerObserver
    def load_finished(self, spec: ModelSpec, seconds: float, ok: bool) -> None:
        self.loads.labels(*self._labels(spec), "success" if ok else "failure").inc()
        if ok:
            self.load_seconds.labels(*self._labels(spec)).observe(seconds)

    def warmup_finished(self, spec: ModelSpec, seconds: float) -> None:
        self.warmup_seconds.labels(*self._labels(spec)).observe(seconds)

    def model_evicted(self, spec: ModelSpec) -> None:
        self.evictions.labels(*self._labels(spec)).inc()

    def model_bytes(self, spec: ModelSpec, size: int | None) -> None:
        if size is None:
            try:
                self.bytes.remove(*self._labels(spec))
            except KeyError:
                pass
        else:
            self.bytes.labels(*self._labels(spec)).set(size)

    def memory_used(self, used: int) -> None:
        self.used.labels(self.pod).set(used)

    def queue_length(self, spec: ModelSpec, waiting: int) -> None:
        self.queued.labels(*self._labels(spec)).set(waiting)

    def queue_left(self, spec: ModelSpec, seconds: float, outcome: str) -> None:
        """A request left the admission queue: admitted, or refused (queue_full, deadline), failed, cancelled."""
        if outcome in ("queue_full", "deadline"):
            self.refusals.labels(*self._labels(spec), outcome).inc()
        if outcome != "queue_full":
            self.queue_wait.labels(*self._labels(spec)).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
