"""The router's Prometheus metrics, in a registry of its own (one per app, no globals)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from modelplane_common import metrics as names


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(names.ROUTER_REQUESTS_TOTAL.removesuffix("_total"), "Requests through the router",
                                ["model", "code"], registry=self.registry)
        self.latency = Histogram(names.ROUTER_REQUEST_SECONDS, "Request seconds through the router", ["model"],
                                 registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.placements = Counter(names.ROUTER_PLACEMENTS_TOTAL.removesuffix("_total"), "Loads the router started",
                                  ["model", "pod", "reason"], registry=self.registry)
        self.retries = Counter(names.ROUTER_RETRIES_TOTAL.removesuffix("_total"), "Requests retried on another copy",
                               ["model"], registry=self.registry)
        self.removals = Counter(names.ROUTER_COPY_REMOVALS_TOTAL.removesuffix("_total"), "Extra copies the router unloaded",
                                ["model", "pod"], registry=self.registry)
        self.pods = Gauge(names.ROUTER_PODS, "Worker pods in the map", registry=self.registry)
        self.pod_waits = Counter(names.ROUTER_POD_WAITS_TOTAL.removesuffix("_total"),
                                 "Requests held while a pod of their model started (scale from zero)",
                                 ["model", "result"], registry=self.registry)
        self.pod_wait = Histogram(names.ROUTER_POD_WAIT_SECONDS, "Seconds a request was held for a pod to start",
                                  ["model"], registry=self.registry,
                                  buckets=(0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300))
        self.versions = Counter(names.ROUTER_VERSION_REQUESTS_TOTAL.removesuffix("_total"),
                                "Answered requests by the version that computed them (canaries)", ["model", "version"],
                                registry=self.registry)
