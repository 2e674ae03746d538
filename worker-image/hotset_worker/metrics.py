"""The worker's Prometheus metrics, one registry per app, names from hotset_common.metrics.

Every framework reports through the same series, so a dashboard needs one
query per figure whatever runs the model.

**Bounded at any catalog size, and at any number of copies held.** At most
``max_models`` models have per-model series at a time, by recent use
(``hotset_common.model_series``, the router's rule): a model gets them with
its first event (a request, a load, an eviction) while there is room and
loses them after ``idle_s`` without one. Every other model's events count
under ``model="_other"``, an aggregate: its counters and histograms add up,
and its gauges (bytes, requests in flight or queued) are the sums over the
models in it, moved in and out as models lose and get their own series. A
counter that comes back starts at 0 (``rate``/``increase`` read a reset).
Before, every held copy had series: 5,000 copies were 195,000-262,000
samples and 6-7 s per scrape; now a pod exports at most about
``max_models`` x 54 per-model samples (the families below with their
buckets, sums, counts and created), whatever it holds or can load.
``hotset_model_series`` says how many models have series now.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hotset_common import metrics as names
from hotset_common.model_series import (DEFAULT_MAX_MODEL_SERIES, DEFAULT_SERIES_IDLE_S, OTHER_MODELS,  # noqa: F401
                                        UNKNOWN_MODEL, ModelSeries)
from hotset_common.spec import ModelSpec
from hotset_worker.token_meter import TokenFigures

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1)
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_RATE_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_BATCH_WAIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class WorkerMetrics:
    """Implements the manager's observer and counts requests for the data plane."""

    def __init__(self, pod: str, memory_budget: int, registry: CollectorRegistry | None = None,
                 max_models: int = DEFAULT_MAX_MODEL_SERIES, idle_s: float = DEFAULT_SERIES_IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pod = pod
        self.registry = registry or CollectorRegistry()
        self.series = ModelSeries(max_models, idle_s, clock, on_change=self._moved)
        # Gauges by model: model -> metric -> (framework, value), nonzero values only. A model's value
        # is in its own series while it has them, else in the aggregate's running total.
        self._gauges: dict[str, dict[Any, tuple[str, float]]] = {}
        self._other_totals: dict[tuple[Any, str], float] = {}  # (metric, framework) -> the aggregate's value
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
        self.share_weights = Gauge(names.SHARE_WEIGHT, "Each namespace's weight in the inference threads' shares",
                                   ["namespace", "pod"], registry=self.registry)
        source_labels = [*model_labels, "scheme"]
        self.source_fetches = Counter(names.SOURCE_FETCHES_TOTAL, "Fetches of remote model sources by result",
                                      [*source_labels, "result"], registry=self.registry)
        self.source_hits = Counter(names.SOURCE_CACHE_HITS_TOTAL, "Loads whose remote source was in the source cache",
                                   source_labels, registry=self.registry)
        self.source_bytes = Counter(names.SOURCE_DOWNLOAD_BYTES_TOTAL, "Bytes downloaded from remote model sources",
                                    source_labels, registry=self.registry)
        self.source_seconds = Histogram(names.SOURCE_DOWNLOAD_SECONDS, "Time downloading a remote model source",
                                        source_labels, buckets=_LOAD_BUCKETS, registry=self.registry)
        self.cache_bytes = Gauge(names.SOURCE_CACHE_BYTES, "Bytes in the source cache (entries and fills in progress)",
                                 ["pod"], registry=self.registry)
        self.cache_budget = Gauge(names.SOURCE_CACHE_BUDGET_BYTES, "The source cache's byte budget", ["pod"],
                                  registry=self.registry)
        self.cache_evictions = Counter(names.SOURCE_CACHE_EVICTIONS_TOTAL, "Source cache entries evicted for room",
                                       ["pod"], registry=self.registry)
        self.batch_rows = Histogram(names.BATCH_ROWS, "Rows per forward pass of a batched model", model_labels,
                                    buckets=_BATCH_BUCKETS, registry=self.registry)
        self.batch_requests = Histogram(names.BATCH_REQUESTS, "Requests per forward pass of a batched model",
                                        model_labels, buckets=_BATCH_BUCKETS, registry=self.registry)
        self.batch_queue = Histogram(names.BATCH_QUEUE_SECONDS, "Seconds a request waited for its batch's pass to start",
                                     model_labels, buckets=_BATCH_WAIT_BUCKETS, registry=self.registry)
        self.model_series = Gauge(names.MODEL_SERIES, "Models with per-model series of their own now", ["pod"],
                                  registry=self.registry)
        self.budget.labels(pod).set(memory_budget)
        self.used.labels(pod).set(0)

    def _labels(self, spec: ModelSpec) -> tuple[str, str, str]:
        """`spec`'s labels for an event of it now (the event counts as its use)."""
        return self.series.label(spec.id), spec.framework.value, self.pod

    def _child(self, metric: Any, spec: ModelSpec | None, *extra: str) -> Any:
        """`metric`'s series for `spec` (its own, or the aggregate's), remembered for its model's expiry."""
        labels = self._labels(spec) + extra if spec is not None else (UNKNOWN_MODEL, "", self.pod) + extra
        return self.series.child(metric, *labels)

    # Copies held (the manager's observer): nothing to do, series follow use, not copies.
    def copy_added(self, spec: ModelSpec) -> None:
        pass

    def copy_gone(self, spec: ModelSpec) -> None:
        pass

    def _set_gauge(self, metric: Any, spec: ModelSpec, value: float, drop_at_zero: bool = False) -> None:
        """An absolute per-model gauge; under the aggregate it is the sum over the models in it.
        `drop_at_zero`: at 0 the model's own series goes (what it measured went)."""
        model, framework, pod = self._labels(spec)
        values = self._gauges.setdefault(spec.id, {})
        before = values.pop(metric, (framework, 0.0))[1]
        if value:
            values[metric] = (framework, value)
        elif not values:
            del self._gauges[spec.id]
        if model != OTHER_MODELS:
            if value or not drop_at_zero:
                self.series.child(metric, model, framework, pod).set(value)
            else:
                self.series.forget(metric, model, framework, pod)
            return
        self._add_to_other(metric, framework, value - before)

    def _add_to_other(self, metric: Any, framework: str, change: float) -> None:
        if not change:
            return
        key = (metric, framework)
        total = self._other_totals[key] = self._other_totals.get(key, 0.0) + change
        metric.labels(OTHER_MODELS, framework, self.pod).set(total)

    def _moved(self, model: str, has_series: bool) -> None:
        """`model` got its own series (its gauges leave the aggregate) or lost them (they join it)."""
        for metric, (framework, value) in self._gauges.get(model, {}).items():
            if has_series:
                self._add_to_other(metric, framework, -value)
                self.series.child(metric, model, framework, self.pod).set(value)
            else:
                self._add_to_other(metric, framework, value)

    def series_models(self) -> int:
        """Models with series of their own now (tests and figures)."""
        return len(self.series)

    def before_scrape(self) -> None:
        """On the event loop, before the exposition is rendered on a thread: idle models give their
        series up, and the count of models with series is set."""
        self.series.expire()
        self.model_series.labels(self.pod).set(len(self.series))

    def share_weight(self, namespace: str, weight: float) -> None:
        self.share_weights.labels(namespace, self.pod).set(weight)

    def request_started(self, spec: ModelSpec) -> None:
        self._set_gauge(self.inflight, spec, self._gauge_value(self.inflight, spec) + 1)

    def request_ended(self, spec: ModelSpec) -> None:
        self._set_gauge(self.inflight, spec, max(0.0, self._gauge_value(self.inflight, spec) - 1))

    def _gauge_value(self, metric: Any, spec: ModelSpec) -> float:
        return self._gauges.get(spec.id, {}).get(metric, ("", 0.0))[1]

    # LimitObserver
    def concurrency_queue(self, spec: ModelSpec, waiting: int) -> None:
        self._set_gauge(self.model_queued, spec, waiting)

    def refused(self, spec: ModelSpec, reason: str) -> None:
        self._child(self.refusals, spec, reason).inc()

    def request_finished(self, spec: ModelSpec | None, code: int, seconds: float) -> None:
        self._child(self.requests, spec, str(code)).inc()
        if spec is not None:
            self._child(self.request_seconds, spec).observe(seconds)

    def tokens_finished(self, spec: ModelSpec, figures: TokenFigures) -> None:
        """One generative (or embedding) request's token figures."""
        self._child(self.prompt_tokens, spec).inc(figures.prompt_tokens)
        self._child(self.output_tokens, spec).inc(figures.output_tokens)
        if figures.time_to_first_token_s is not None:
            self._child(self.time_to_first_token, spec).observe(figures.time_to_first_token_s)
        if figures.time_per_output_token_s is not None:
            self._child(self.time_per_output_token, spec).observe(figures.time_per_output_token_s)
        if figures.tokens_per_second is not None:
            self._child(self.tokens_per_second, spec).observe(figures.tokens_per_second)

    # BatchObserver
    def batch_ran(self, spec: ModelSpec, rows: int, requests: int, queue_seconds: list[float]) -> None:
        self._child(self.batch_rows, spec).observe(rows)
        self._child(self.batch_requests, spec).observe(requests)
        waited = self._child(self.batch_queue, spec)
        for seconds in queue_seconds:
            waited.observe(seconds)

    # ManagerObserver
    def load_finished(self, spec: ModelSpec, seconds: float, ok: bool) -> None:
        self._child(self.loads, spec, "success" if ok else "failure").inc()
        if ok:
            self._child(self.load_seconds, spec).observe(seconds)

    def warmup_finished(self, spec: ModelSpec, seconds: float) -> None:
        self._child(self.warmup_seconds, spec).observe(seconds)

    def model_evicted(self, spec: ModelSpec) -> None:
        self._child(self.evictions, spec).inc()

    def model_bytes(self, spec: ModelSpec, size: int | None) -> None:
        self._set_gauge(self.bytes, spec, size or 0, drop_at_zero=True)

    def memory_used(self, used: int) -> None:
        self.used.labels(self.pod).set(used)

    def queue_length(self, spec: ModelSpec, waiting: int) -> None:
        self._set_gauge(self.queued, spec, waiting)

    def queue_left(self, spec: ModelSpec, seconds: float, outcome: str) -> None:
        """A request left the admission queue: admitted, or refused (queue_full, namespace_share,
        deadline), failed, cancelled."""
        if outcome in ("queue_full", "namespace_share", "deadline"):
            self._child(self.refusals, spec, outcome).inc()
        if outcome not in ("queue_full", "namespace_share"):
            self._child(self.queue_wait, spec).observe(seconds)

    # FetchObserver (hotset_worker.sources.fetcher) and CacheObserver (sources.cache)
    def source_fetched(self, spec: ModelSpec, scheme: str, hit: bool, nbytes: int, seconds: float) -> None:
        self._child(self.source_fetches, spec, scheme, "hit" if hit else "download").inc()
        if hit:
            self._child(self.source_hits, spec, scheme).inc()
        else:
            self._child(self.source_bytes, spec, scheme).inc(nbytes)
            self._child(self.source_seconds, spec, scheme).observe(seconds)

    def source_failed(self, spec: ModelSpec, scheme: str) -> None:
        self._child(self.source_fetches, spec, scheme, "failure").inc()

    def cache_evicted(self, nbytes: int) -> None:
        self.cache_evictions.labels(self.pod).inc()

    def cache_used(self, nbytes: int, budget: int) -> None:
        self.cache_bytes.labels(self.pod).set(nbytes)
        self.cache_budget.labels(self.pod).set(budget)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
