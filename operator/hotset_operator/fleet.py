"""What the worker pods report, indexed by model, and which models it changed for since last time.

A ServedModel's ``copies``, ``readyReplicas`` and ``Ready`` come from these
reports. Rather than every model looking through every report (models x
copies per pass), each pass indexes the copies by (namespace, model) once and
hands on only the models whose copies (or dedicated pods' problems) differ
from the last pass: their status is re-derived, the others' is not touched.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Iterable, Mapping

from hotset_common import labels
from hotset_common.wire import Preemption, WorkerStatus
from hotset_operator.index import WorkerPod
from hotset_operator.status import copy_entry

ModelKey = tuple[str, str]  # (namespace of the reporting pods, model id)


def index_copies(reports: Mapping[tuple[str, str], WorkerStatus]) -> dict[ModelKey, list[dict[str, Any]]]:
    """Every copy of every model, by (namespace, model), in pod order (as the status lists them)."""
    found: dict[ModelKey, list[dict[str, Any]]] = defaultdict(list)
    for (namespace, pod), report in sorted(reports.items()):
        for copy in report.models:
            found[(namespace, copy.id)].append(copy_entry(pod, copy))
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
    def __init__(self, started: float | None = None) -> None:
        self.reports: dict[tuple[str, str], WorkerStatus] = {}  # (namespace, pod) -> its last report
        self._copies: dict[ModelKey, list[dict[str, Any]]] = {}
        self._problems: dict[ModelKey, list[str]] = {}
        self._preempted: dict[tuple[str, str], int] = {}  # (namespace, pod) -> the last preemption taken
        self.started = time.time() if started is None else started  # preemptions before it were told already

    def new_preemptions(self, reports: Mapping[tuple[str, str], WorkerStatus]) -> list[tuple[str, Preemption]]:
        """The preemptions the reports carry that no earlier report did, as (pod, preemption): each
        once (by its pod's sequence), and from a pod seen for the first time only those after this
        operator started (an operator restarting does not tell again what its predecessor told)."""
        found: list[tuple[str, Preemption]] = []
        for key, report in reports.items():
            last = self._preempted.get(key)
            fresh = [p for p in report.preemptions if (p.seq > last if last is not None else p.at >= self.started)]
            found.extend((key[1], p) for p in fresh)
            if report.preemptions:
                self._preempted[key] = max(last or 0, report.preemptions[-1].seq)
        for gone in self._preempted.keys() - reports.keys():
            del self._preempted[gone]
        return found

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
