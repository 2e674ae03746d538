"""What the worker pods report, indexed by model, and which models it changed for since last time.

A ServedModel's ``copies``, ``readyReplicas`` and ``Ready`` come from these
reports. Rather than every model looking through every report (models x
copies per pass), each pass indexes the copies by (namespace, model) once and
hands on only the models whose copies (or dedicated pods' problems) differ
from the last pass: their status is re-derived, the others' is not touched.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping

from hotset_common import labels
from hotset_common.wire import WorkerStatus
from hotset_operator.index import WorkerPod

ModelKey = tuple[str, str]  # (namespace of the reporting pods, model id)


def _copy(pod: str, copy: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"pod": pod, "state": copy.state.value, "bytes": copy.bytes}
    if copy.reason:
        entry["reason"] = copy.reason
    if copy.failure:
        entry["failure"] = copy.failure
    return entry


def index_copies(reports: Mapping[tuple[str, str], WorkerStatus]) -> dict[ModelKey, list[dict[str, Any]]]:
    """Every copy of every model, by (namespace, model), in pod order (as the status lists them)."""
    found: dict[ModelKey, list[dict[str, Any]]] = defaultdict(list)
    for (namespace, pod), report in sorted(reports.items()):
        for copy in report.models:
            found[(namespace, copy.id)].append(_copy(pod, copy))
    return dict(found)


def index_problems(pods: Iterable[WorkerPod]) -> dict[ModelKey, list[str]]:
    """Why pods of dedicated groups are not running, by (namespace, the group's model)."""
    found: dict[ModelKey, list[str]] = defaultdict(list)
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        if pod.problem and pod.pool.startswith(labels.DEDICATED_POOL + "/"):
            found[(pod.namespace, pod.pool.split("/", 1)[1])].append(f"pod {pod.name}: {pod.problem}")
    return dict(found)


def _changed(before: Mapping[ModelKey, Any], after: Mapping[ModelKey, Any]) -> set[ModelKey]:
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


class Fleet:
    def __init__(self) -> None:
        self.reports: dict[tuple[str, str], WorkerStatus] = {}  # (namespace, pod) -> its last report
        self._copies: dict[ModelKey, list[dict[str, Any]]] = {}
        self._problems: dict[ModelKey, list[str]] = {}

    def update(self, pods: Iterable[WorkerPod], reports: Mapping[tuple[str, str], WorkerStatus]) -> set[ModelKey]:
        """Take a pass's reports; the models whose copies or pod problems changed."""
        copies, problems = index_copies(reports), index_problems(pods)
        changed = _changed(self._copies, copies) | _changed(self._problems, problems)
        self.reports, self._copies, self._problems = dict(reports), copies, problems
        return changed

    def copies_of(self, namespace: str, model: str) -> list[dict[str, Any]]:
        return self._copies.get((namespace, model), [])

    def problems_of(self, namespace: str, model: str) -> list[str]:
        return self._problems.get((namespace, model), [])

    def reports_in(self, namespace: str, pods: Iterable[WorkerPod]) -> dict[str, WorkerStatus]:
        """The reports of `pods` (of `namespace`), by pod name."""
        return {p.name: found for p in pods if (found := self.reports.get((namespace, p.name))) is not None}
