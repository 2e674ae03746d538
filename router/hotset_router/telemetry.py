"""The router's Prometheus metrics, in a registry of its own (one per app, no globals), bounded in models.

Per-model series are bounded as the worker's are (``hotset_common.model_series``,
defined once for both): at most ``max_models`` models have series of their
own at a time, by recent use; models beyond the limit are counted together
under ``model="_other"``, names no worker knows under ``model="_unknown"``.
At the defaults (500 models, 300 s) one router exports at most about 500 x
25 per-model series plus a few aggregates, whatever the catalog holds
(docs/router.md, "Metrics"); ``hotset_router_model_series`` says how many
models have series now. Sums over ``model`` stay exact.

Pods are not a label of per-model series (placements, removals): pods x
models is the product that grew fastest.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hotset_common import metrics as names
from hotset_common.model_series import (DEFAULT_MAX_MODEL_SERIES, DEFAULT_SERIES_IDLE_S, OTHER_MODELS,  # noqa: F401
                                        UNKNOWN_MODEL, ModelSeries)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class RouterMetrics:
    def __init__(self, max_model_series: int = DEFAULT_MAX_MODEL_SERIES, series_idle_s: float = DEFAULT_SERIES_IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry()
        self.series = ModelSeries(max_model_series, series_idle_s, clock)
        self.requests = Counter(names.ROUTER_REQUESTS_TOTAL.removesuffix("_total"), "Requests through the router",
                                ["model", "code"], registry=self.registry)
        self.latency = Histogram(names.ROUTER_REQUEST_SECONDS, "Request seconds through the router", ["model"],
                                 registry=self.registry, buckets=LATENCY_BUCKETS)
        self.placements = Counter(names.ROUTER_PLACEMENTS_TOTAL.removesuffix("_total"), "Loads the router started",
                                  ["model", "reason"], registry=self.registry)
        self.retries = Counter(names.ROUTER_RETRIES_TOTAL.removesuffix("_total"), "Requests retried on another copy",
                               ["model"], registry=self.registry)
        self.removals = Counter(names.ROUTER_COPY_REMOVALS_TOTAL.removesuffix("_total"), "Extra copies the router unloaded",
                                ["model"], registry=self.registry)
        self.pods = Gauge(names.ROUTER_PODS, "Worker pods in the map", registry=self.registry)
        self.unowned_pods = Gauge(names.ROUTER_UNOWNED_WORKER_PODS,
                                  "Ready pods with the worker labels that no Deployment of the operator owns, "
                                  "or that did not prove which pod they are: sent no traffic and no token", registry=self.registry)
        self.pod_waits = Counter(names.ROUTER_POD_WAITS_TOTAL.removesuffix("_total"),
                                 "Requests held while a pod of their model started (scale from zero)",
                                 ["model", "result"], registry=self.registry)
        self.pod_wait = Histogram(names.ROUTER_POD_WAIT_SECONDS, "Seconds a request was held for a pod to start",
                                  ["model"], registry=self.registry,
                                  buckets=(0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300))
        self.versions = Counter(names.ROUTER_VERSION_REQUESTS_TOTAL.removesuffix("_total"),
                                "Answered requests by the version that computed them (canaries)", ["model", "version"],
                                registry=self.registry)
        self.caller_reviews = Counter(names.ROUTER_CALLER_REVIEWS_TOTAL.removesuffix("_total"),
                                      "TokenReviews (question=who) and SubjectAccessReviews (question=may) the router "
                                      "asked, by answer (yes, no, error); cached answers ask nothing",
                                      ["question", "answer"], registry=self.registry)
        self.model_series = Gauge(names.ROUTER_MODEL_SERIES, "Models with per-model series of their own now",
                                  registry=self.registry)
        self.loop_lag = Histogram(names.ROUTER_EVENT_LOOP_LAG_SECONDS,
                                  "How late the router's event loop woke a timer (what every request waited)",
                                  registry=self.registry, buckets=LAG_BUCKETS)

    def label(self, model: str, known: bool = True) -> str:
        """The `model` label for a request's series: UNKNOWN_MODEL for names no worker knows (clients
        must not mint series), OTHER_MODELS past the limit."""
        return self.series.label(model) if known else UNKNOWN_MODEL

    def request(self, label: str, code: int | str, seconds: float) -> None:
        self.series.child(self.requests, label, str(code)).inc()
        self.series.child(self.latency, label).observe(seconds)

    def placed(self, model: str, reason: str) -> None:
        self.series.child(self.placements, self.label(model), reason).inc()

    def retried(self, model: str) -> None:
        self.series.child(self.retries, self.label(model)).inc()

    def removed(self, model: str) -> None:
        self.series.child(self.removals, self.label(model)).inc()

    def answered_by(self, label: str, version: str) -> None:
        self.series.child(self.versions, label, version).inc()

    def held(self, model: str, result: str, seconds: float | None = None) -> None:
        """A request held for a pod to start: how it ended, and how long it was held once served."""
        label = self.label(model)
        self.series.child(self.pod_waits, label, result).inc()
        if seconds is not None:
            self.series.child(self.pod_wait, label).observe(seconds)

    def reviewed(self, question: str, answer: str) -> None:
        self.caller_reviews.labels(question, answer).inc()

    def before_scrape(self, pods: int, unowned_pods: int = 0) -> None:
        self.series.expire()
        self.model_series.set(len(self.series))
        self.pods.set(pods)
        self.unowned_pods.set(unowned_pods)


async def watch_loop_lag(histogram: Histogram, interval_s: float = 0.1) -> None:
    """Forever: how late the event loop wakes a timer (what any request waited behind other work)."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(interval_s)
        histogram.observe(max(0.0, loop.time() - asked - interval_s))
