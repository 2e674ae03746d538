"""The operator's Prometheus metrics: pool sizes, what the autoscaler wants, quota use, its own work.

A registry of its own (no globals), served on ``metrics_port`` by main() when
one is set; the dashboard and alerts in the chart read these names
(``hotset_common.metrics``).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from hotset_common import metrics as names
from hotset_common.spec import ModelSpec

POOL_LABELS = ["namespace", "pool"]


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.pods = Gauge(names.POOL_PODS, "Pods a pool's Deployment asks for", POOL_LABELS, registry=r)
        self.desired = Gauge(names.POOL_DESIRED_PODS, "Pods the autoscaler wants", POOL_LABELS, registry=r)
        self.min_pods = Gauge(names.POOL_MIN_PODS, "A pool's minimum", POOL_LABELS, registry=r)
        self.max_pods = Gauge(names.POOL_MAX_PODS, "A pool's maximum", POOL_LABELS, registry=r)
        self.lower_bound = Gauge(names.POOL_LOWER_BOUND_PODS, "Fewest pods any packing of the wanted copies uses",
                                 POOL_LABELS, registry=r)
        self.wanted_bytes = Gauge(names.POOL_WANTED_BYTES, "Bytes of the copies a pool should hold", POOL_LABELS,
                                  registry=r)
        self.scale_events = Counter(names.POOL_SCALE_EVENTS_TOTAL.removesuffix("_total"), "Pool size changes",
                                    [*POOL_LABELS, "direction"], registry=r)
        self.quota_used = Gauge(names.QUOTA_USED, "What accepted models may take of a namespace's quota",
                                ["namespace", "resource"], registry=r)
        self.quota_limit = Gauge(names.QUOTA_LIMIT, "A namespace's quota", ["namespace", "resource"], registry=r)
        self.quota_refused = Gauge(names.QUOTA_REFUSED_MODELS, "ServedModels refused for their namespace's quota",
                                   ["namespace"], registry=r)
        self.admission_passes = Counter(names.OPERATOR_ADMISSION_PASSES_TOTAL.removesuffix("_total"),
                                        "Admission passes: over every model (all) or continuing the last (appended)",
                                        ["kind"], registry=r)
        self.admission_decisions = Counter(names.OPERATOR_ADMISSION_DECISIONS_TOTAL.removesuffix("_total"),
                                           "ServedModels judged by admission, all passes together", registry=r)
        self.pool_passes = Counter(names.OPERATOR_POOL_PASSES_TOTAL.removesuffix("_total"),
                                   "Pool sizing passes", registry=r)
        self.status_writes = Counter(names.OPERATOR_STATUS_WRITES_TOTAL.removesuffix("_total"),
                                     "Status patches written", ["resource"], registry=r)
        self.writes_pending = Gauge(names.OPERATOR_WRITES_PENDING, "Status writes and events not yet sent",
                                    registry=r)
        self.unowned_worker_pods = Gauge(names.OPERATOR_UNOWNED_WORKER_PODS,
                                         "Pods with the worker labels that no Deployment of the operator owns, or "
                                         "that did not prove which pod they are: asked for no report, sent no token", registry=r)
        self.report_bytes = Counter(names.OPERATOR_REPORT_BYTES_TOTAL.removesuffix("_total"),
                                    "Bytes of worker pods' /status answers read (what changed since each "
                                    "pod's last report)", registry=r)
        self.catalog_models = Gauge(names.CATALOG_MODELS, "Models in a catalog worker pods follow",
                                    ["namespace", "store"], registry=r)
        self.model_info = Gauge(names.MODEL_INFO, "1 per accepted ServedModel: its owner, on-call contact and "
                                "latency class", ["namespace", "model", "owner", "oncall", "latency_class"], registry=r)
        self._info: dict[tuple[str, str], tuple[str, str, str, str, str]] = {}  # (namespace, model) -> its labels

    def model_accepted(self, namespace: str, model: str, spec: ModelSpec) -> None:
        """`model`'s info series, replacing the one it had (an edited owner)."""
        labels = (namespace, model, spec.owner, spec.oncall, spec.latency_class.value)
        before = self._info.get((namespace, model))
        if before == labels:
            return
        if before is not None:
            self.model_info.remove(*before)
        self.model_info.labels(*labels).set(1)
        self._info[(namespace, model)] = labels

    def model_gone(self, namespace: str, model: str) -> None:
        """`model` is refused or deleted: no info series (an alert about it names nobody stale)."""
        before = self._info.pop((namespace, model), None)
        if before is not None:
            self.model_info.remove(*before)

    def scaled(self, namespace: str, pool: str, before: int, after: int) -> None:
        if after != before:
            self.scale_events.labels(namespace, pool, "up" if after > before else "down").inc()
        self.pods.labels(namespace, pool).set(after)
