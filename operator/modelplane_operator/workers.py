"""What the operator asks worker pods over HTTP: their status report, and unloads.

The worker's ``GET /status`` (modelplane_common.wire.WorkerStatus) is the
source of truth for which copies exist; the finalizer unloads through the
OIP v2 repository endpoint every worker serves.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable
from urllib.parse import quote

import httpx
import pydantic

from modelplane_common.wire import WorkerStatus
from modelplane_operator.kube import WorkerPod

log = logging.getLogger(__name__)
TIMEOUT = httpx.Timeout(3.0)


def _base(pod: WorkerPod, port: int) -> str:
    return f"http://{pod.ip}:{port}"


def _auth(token: str) -> dict[str, str]:
    """Workers in cluster mode answer only callers with their API token (docs/security.md)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def fetch_reports(pods: Iterable[WorkerPod], port: int, token: str = "") -> dict[str, WorkerStatus]:
    """Status of every pod that has an IP and answers; silent pods are simply absent."""
    reports: dict[str, WorkerStatus] = {}
    with httpx.Client(timeout=TIMEOUT, headers=_auth(token)) as http:
        for pod in pods:
            if not pod.ip or pod.phase != "Running":
                continue
            try:
                response = http.get(f"{_base(pod, port)}/status")
                response.raise_for_status()
                reports[pod.name] = WorkerStatus.model_validate(response.json())
            except (httpx.HTTPError, pydantic.ValidationError, ValueError) as exc:
                log.info("worker pod %s gave no status: %s", pod.name, exc)
    return reports


class UnloadRefused(RuntimeError):
    """The worker answered but will not unload (e.g. 409: the model is pinned there)."""


def unload(pod: WorkerPod, port: int, model: str, token: str = "") -> None:
    """Ask one pod to unload `model`; 404 (already gone) counts as done.

    Raises httpx.HTTPError when the pod cannot be reached (worth retrying) and
    UnloadRefused when it answers with an error (not worth retrying).
    """
    with httpx.Client(timeout=httpx.Timeout(30.0), headers=_auth(token)) as http:
        response = http.post(f"{_base(pod, port)}/v2/repository/models/{quote(model, safe='')}/unload")
    if response.status_code not in (200, 204, 404):
        raise UnloadRefused(f"pod {pod.name} refused to unload {model}: HTTP {response.status_code} {response.text[:200]}")


class ReportCache:
    """Worker reports shared by every ServedModel's status refresh for `ttl_s` seconds.

    Without it each model's timer would ask every pod: models x pods requests
    per interval instead of pods.
    """

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, dict[str, WorkerStatus]]] = {}

    def get(self, namespace: str, fetch: Callable[[], dict[str, WorkerStatus]]) -> dict[str, WorkerStatus]:
        with self._lock:
            at, reports = self._entries.get(namespace, (float("-inf"), {}))
            if self._clock() - at < self.ttl_s:
                return reports
            reports = fetch()
            self._entries[namespace] = (self._clock(), reports)
            return reports
