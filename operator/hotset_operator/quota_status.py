"""ModelQuotas' status and the quota metrics, after each admission pass, written where they changed.

``status.used`` is what the accepted models of the namespace may take
(``admission.usage_of``), ``status.refused`` the models refused there; the
metrics ``hotset_quota_used``, ``_limit`` and ``_refused_models`` say the
same per namespace.
"""
from __future__ import annotations

from typing import Any, Iterable

from hotset_common import quantity
from hotset_operator import kinds
from hotset_operator.admission import Admission, Usage
from hotset_operator.index import Quota
from hotset_operator.metrics import OperatorMetrics
from hotset_operator.writes import Writes

RESOURCES = ("memory", "copies", "gpus")


def desired(used: Usage, refused: list[str]) -> dict[str, Any]:
    return {"used": {"memory": quantity.format_bytes(used.memory), "copies": used.copies, "gpus": round(used.gpus, 2)},
            "refused": refused}


class QuotaStatus:
    def __init__(self, writes: Writes, metrics: OperatorMetrics) -> None:
        self.writes = writes
        self.metrics = metrics
        self._queued: dict[tuple[str, str], dict[str, Any]] = {}

    def update(self, result: Admission, quotas: Iterable[Quota]) -> None:
        quotas = list(quotas)
        refused = result.refused_by_namespace()
        for quota in quotas:
            status = desired(result.usage.get(quota.namespace, Usage()), refused.get(quota.namespace, []))
            changed = {k: v for k, v in status.items() if quota.status.get(k) != v}
            key = (quota.namespace, quota.name)
            if changed and self._queued.get(key) != status:
                self._queued[key] = status
                self.writes.status(kinds.MODEL_QUOTAS, quota.namespace, quota.name, changed)
            elif not changed:
                self._queued.pop(key, None)
        self._record(result, quotas, refused)

    def _record(self, result: Admission, quotas: list[Quota], refused: dict[str, list[str]]) -> None:
        for namespace in sorted(set(result.usage) | set(refused) | {q.namespace for q in quotas}):
            used = result.usage.get(namespace, Usage())
            for resource in RESOURCES:
                self.metrics.quota_used.labels(namespace, resource).set(getattr(used, resource))
            self.metrics.quota_refused.labels(namespace).set(len(refused.get(namespace, [])))
        for quota in quotas:
            for resource in RESOURCES:
                if (limit := getattr(quota, resource)) is not None:
                    self.metrics.quota_limit.labels(quota.namespace, resource).set(limit)
